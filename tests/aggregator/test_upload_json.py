"""Uploads in proto3 JSON (_upload_json): every body gives what google.protobuf.json_format gives
(the message, or the body back when json_format finds none), and the shape the SDKs send never
goes through json_format's field-by-field walk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from veil.aggregator import _upload_json
from veil.aggregator._upload_json import parse_batches_json, parse_upload_json
from veil.wire.v1 import veil_pb2

VECTORS = Path(__file__).resolve().parents[2] / "proto/veil/wire/v1/vectors/encodings.json"
UPLOADS = [v["upload_json"] for v in json.loads(VECTORS.read_text())["vectors"]]
ONE = {
    "batchId": "AAECAwQFBgcICQoLDA0ODw==",
    "metric": "m",
    "specFingerprint": "9d4148ab1333ab1763d5f7e225ec83c4",
    "count": 3,
    "bitmaps": {"bits": "EQEGAigC"},
    "madeUnix": "1764201600",
}


def reference(body: bytes, message):
    """What the HTTP route made of a JSON body before: json_format's message, or the body."""
    try:
        return json_format.Parse(body, message)
    except (json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError):
        return body


def variants() -> list[bytes]:
    """Bodies of one upload: the vectors, each field in its other accepted forms, and the
    forms json_format refuses or reads otherwise."""
    texts = [json.dumps(u) for u in UPLOADS] + [json.dumps(ONE)]
    changed = {
        "proto names": {"batch_id": ONE["batchId"], "spec_fingerprint": ONE["specFingerprint"], "made_unix": 5},
        "int64 as a number": {"madeUnix": 1764201600},
        "negative int64": {"madeUnix": "-3"},
        "int64 too large": {"madeUnix": str(1 << 63)},
        "int64 with a plus": {"madeUnix": "+5"},
        "int64 with an underscore": {"madeUnix": "1_000"},
        "int64 as a float": {"madeUnix": 5.0},
        "int64 as a fraction": {"madeUnix": 5.5},
        "count as a string": {"count": "3"},
        "count as a float": {"count": 3.0},
        "count negative": {"count": -1},
        "count too large": {"count": 1 << 32},
        "count true": {"count": True},
        "count null": {"count": None},
        "bytes unpadded": {"batchId": "AAECAwQFBgcICQoLDA0ODw"},
        "bytes URL-safe": {"batchId": "AAECAwQFBgcICQoLDA0OD-_"},
        "bytes with a space": {"batchId": "AAEC AwQF"},
        "bytes badly padded": {"batchId": "A"},
        "bytes empty": {"batchId": ""},
        "bytes as a number": {"batchId": 7},
        "metric beyond ASCII": {"metric": "m\u00e9"},
        "metric a lone surrogate": {"metric": "m\ud800"},
        "metric a number": {"metric": 1},
        "unknown field": {"extra": 1},
        "both payloads": {"indexSets": {"setSize": 1, "indices": "AAAA"}},
        "index sets": {"bitmaps": None, "indexSets": {"set_size": 2, "indices": "AAECAw=="}},
        "empty bitmaps": {"bitmaps": {}},
        "bitmaps a list": {"bitmaps": ["EQ=="]},
    }
    for fields in changed.values():
        upload = {**ONE, **fields}
        texts.append(json.dumps({k: v for k, v in upload.items() if v is not None or k != "bitmaps"}))
    texts += [
        '{"metric": "m", "metric": "n"}',  # a repeated key
        '{"batchId": "AA==", "batch_id": "AA=="}',  # one field under both names
        "[]",
        "null",
        "{",
        '{"count": NaN}',
        "",
        "[" * 10_000 + "]" * 10_000,
    ]
    bodies = [t.encode() for t in texts]
    bodies += [json.dumps(ONE).encode("utf-16"), b"\xff\xfe{}", json.dumps(ONE).encode() + b" x"]
    return bodies


@pytest.mark.parametrize("body", variants())
def test_one_upload_as_json_format_reads_it(body: bytes) -> None:
    assert parse_upload_json(body) == reference(body, veil_pb2.UploadRequest())


@pytest.mark.parametrize("body", variants())
def test_batches_as_json_format_reads_them(body: bytes) -> None:
    text = body.decode("utf-8", "surrogatepass") if body[:1] in b"{[" else None
    wrapped = [b'{"batches": [' + body + b"]}", b'{"batches": [' + body + b", " + json.dumps(ONE).encode() + b"]}"]
    for batches in wrapped if text is not None else []:
        assert parse_batches_json(batches) == reference(batches, veil_pb2.UploadBatchesRequest())
    for other in (b'{"batches": []}', b"{}", b'{"batches": null}', b'{"batches": {}}', b'{"batch": []}', body):
        assert parse_batches_json(other) == reference(other, veil_pb2.UploadBatchesRequest())


def test_the_sdks_shape_does_not_walk_json_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device's upload of 10 batches, as MessageToJson (and the TypeScript SDK) writes it, is
    read without json_format (which would take some 190 us)."""
    batches = veil_pb2.UploadBatchesRequest(
        batches=[json_format.ParseDict(u, veil_pb2.UploadRequest()) for u in UPLOADS[:10]]
    )
    for batch in batches.batches:
        batch.made_unix = 1764201600
    body = json_format.MessageToJson(batches, indent=None).encode()
    expected = reference(body, veil_pb2.UploadBatchesRequest())

    def walked(*_args, **_kwargs):
        raise AssertionError("json_format.Parse was called")

    monkeypatch.setattr(_upload_json.json_format, "Parse", walked)
    assert parse_batches_json(body) == expected
    assert len(expected.batches) == min(10, len(UPLOADS))
