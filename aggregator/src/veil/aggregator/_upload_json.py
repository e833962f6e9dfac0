"""Uploads in the proto3 JSON mapping (HTTP, application/json), parsed as json_format would.

google.protobuf.json_format walks the message field by field in Python: some 190 us for a
device's 10 one-report batches, more than the rest of the call's Python (bench/PROFILES.md,
section 5). parse_upload_json and parse_batches_json read the shape the SDKs send (json.loads,
then each known field converted as json_format converts it) and hand anything else to
json_format itself: a field they do not know, a value of another type or form (a number as a
float, an int64 not in plain decimal, bytes in URL-safe base64 or with spaces, a string with
characters beyond ASCII, null), a repeated key. So every body gives the message json_format
gives, or the body back where json_format finds no message (the access checks answer it).
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format

from veil.wire.v1 import veil_pb2

__all__ = ["parse_batches_json", "parse_upload_json"]

_DECIMAL = re.compile(r"-?[0-9]{1,19}")  # an int64 as proto3 JSON writes it, as a string
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")  # bytes as proto3 JSON writes them
_UINT32 = 1 << 32
_INT64 = 1 << 63


class _Unusual(Exception):
    """A body outside the shape parsed here: json_format decides."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # a repeated key: json_format refuses it
        raise _Unusual
    return found


def _string(value: Any) -> str:
    if type(value) is not str or not value.isascii():  # json_format checks other text for surrogates
        raise _Unusual
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not str or not _BASE64.fullmatch(value):
        raise _Unusual
    # json_format's conversion, base64.urlsafe_b64decode(value + "=" * (4 - len(value) % 4)),
    # is this call for the standard alphabet (nothing to translate).
    return binascii.a2b_base64(value + "=" * (4 - len(value) % 4))


def _uint32(value: Any) -> int:
    if type(value) is not int or not 0 <= value < _UINT32:
        raise _Unusual
    return value


def _int64(value: Any) -> int:
    if type(value) is str and _DECIMAL.fullmatch(value):
        value = int(value)
    if type(value) is not int or not -_INT64 <= value < _INT64:
        raise _Unusual
    return value


def _fields(value: Any, known: dict[str, tuple[str, Callable[[Any], Any]]]) -> dict[str, Any]:
    """A JSON object's fields by proto name, converted; each field under one name only."""
    if type(value) is not dict:
        raise _Unusual
    fields = {}
    for key, item in value.items():
        name, convert = known.get(key, ("", None))
        if convert is None or name in fields:
            raise _Unusual
        fields[name] = convert(item)
    return fields


def _index_sets(value: Any) -> veil_pb2.IndexSets:
    return veil_pb2.IndexSets(**_fields(value, _INDEX_SETS))


def _bitmaps(value: Any) -> veil_pb2.Bitmaps:
    return veil_pb2.Bitmaps(**_fields(value, _BITMAPS))


def _hashed(value: Any) -> veil_pb2.HashedReports:
    return veil_pb2.HashedReports(**_fields(value, _HASHED))


def _named(*fields: tuple[str, str, Callable[[Any], Any]]) -> dict[str, tuple[str, Callable[[Any], Any]]]:
    """Each field under its JSON name and its proto name, both of which json_format takes."""
    return {key: (name, convert) for name, json_name, convert in fields for key in (name, json_name)}


_INDEX_SETS = _named(("set_size", "setSize", _uint32), ("indices", "indices", _bytes))
_BITMAPS = _named(("bits", "bits", _bytes))
_HASHED = _named(("words", "words", _bytes))
_UPLOAD = _named(
    ("batch_id", "batchId", _bytes),
    ("metric", "metric", _string),
    ("spec_fingerprint", "specFingerprint", _string),
    ("count", "count", _uint32),
    ("index_sets", "indexSets", _index_sets),
    ("bitmaps", "bitmaps", _bitmaps),
    ("hashed", "hashed", _hashed),
    ("made_unix", "madeUnix", _int64),
)


# The members of UploadRequest's reports oneof, as the proto names them.
_REPORTS = frozenset(f.name for f in veil_pb2.UploadRequest.DESCRIPTOR.oneofs_by_name["reports"].fields)


def _upload(value: Any) -> veil_pb2.UploadRequest:
    fields = _fields(value, _UPLOAD)
    if len(_REPORTS & fields.keys()) > 1:  # one oneof: json_format refuses two
        raise _Unusual
    return veil_pb2.UploadRequest(**fields)


def _parse(body: bytes, read: Callable[[Any], Any], message: Any) -> Any:
    try:
        return read(json.loads(body.decode(), object_pairs_hook=_object))
    except (_Unusual, ValueError, RecursionError):
        pass
    try:
        return json_format.Parse(body, message)
    except (json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError):
        return body


def parse_upload_json(body: bytes) -> veil_pb2.UploadRequest | bytes:
    """The UploadRequest of a proto3 JSON body, or the body when it is none (as
    decode.parse_upload for binary)."""
    return _parse(body, _upload, veil_pb2.UploadRequest())


def _list_of_uploads(value: Any) -> list[veil_pb2.UploadRequest]:
    if type(value) is not list:
        raise _Unusual
    return [_upload(item) for item in value]


_BATCHES = _named(("batches", "batches", _list_of_uploads))


def _batches(value: Any) -> veil_pb2.UploadBatchesRequest:
    return veil_pb2.UploadBatchesRequest(**_fields(value, _BATCHES))


def parse_batches_json(body: bytes) -> veil_pb2.UploadBatchesRequest | bytes:
    """parse_upload_json of UploadBatches."""
    return _parse(body, _batches, veil_pb2.UploadBatchesRequest())
