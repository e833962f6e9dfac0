"""Batches on the wire: one metric, one spec fingerprint, one time slot, columnar reports.

Reports travel in the encoding veil.mechanism.encoding chooses for the design: as IndexSets, q
little-endian uint32 indices per report, each report's indices strictly increasing (as
``randomize`` returns them), or as Bitmaps, ceil(k/8) bytes per report, category j being bit
j % 8 (least significant first) of byte j // 8: the report's bit mask as a little-endian integer.
A strings round's reports (HASHED) travel as HashedReports, their own path: each report's 8 words
(the hash's coefficients and the bucket sent) as little-endian uint32, 32 bytes at every epsilon.
Several stored batches go in one UploadBatchesRequest as they are: the request is nothing but its
batches, each a length-delimited field 1 holding the batch's bytes.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

from veil.mechanism import BITMAPS, MetricSpec, encoding
from veil.wire.v1 import veil_pb2

__all__ = ["encode_batch", "encode_batches", "made_slot", "MAX_BATCH_BYTES"]

MAX_BATCH_BYTES = 1 << 20  # keep every upload far below gRPC's default 4 MiB message limit

_UINT32 = "I" if array("I").itemsize == 4 else "L"


def _words(reports: Sequence[tuple[int, ...]]) -> bytes:
    """The reports' words, one after the other, as little-endian uint32."""
    flat = array(_UINT32, chain.from_iterable(reports))
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes()


@lru_cache(maxsize=64)
def _bits(k: int) -> tuple[int, ...]:
    return tuple(1 << j for j in range(k))


def _bitmaps(reports: Sequence[tuple[int, ...]], k: int) -> veil_pb2.Bitmaps:
    width, bit = (k + 7) // 8, _bits(k)
    # sum(map(...)) adds the report's bits in C: a q = 275 report costs microseconds, not tens.
    masks = (sum(map(bit.__getitem__, report)) for report in reports)
    return veil_pb2.Bitmaps(bits=b"".join(m.to_bytes(width, "little") for m in masks))


def made_slot(unix_time: float, resolution: int) -> int:
    """The start of the time slot (a multiple of ``resolution`` seconds) holding ``unix_time``."""
    return math.floor(unix_time / resolution) * resolution


def encode_batch(spec: MetricSpec, reports: Sequence[tuple[int, ...]], batch_id: bytes, made_unix: int = 0) -> bytes:
    """The serialized UploadRequest of ``reports`` (randomized under ``spec`` in the time slot
    starting at ``made_unix``; 0: not said)."""
    request = veil_pb2.UploadRequest(
        batch_id=batch_id, metric=spec.name, spec_fingerprint=spec.fingerprint, count=len(reports), made_unix=made_unix
    )
    q = spec.mechanism.q
    if spec.strings is not None:
        request.hashed.words = _words(reports)
    elif q is None or encoding(spec.mechanism) == BITMAPS:
        request.bitmaps.CopyFrom(_bitmaps(reports, spec.k))
    else:
        request.index_sets.CopyFrom(veil_pb2.IndexSets(set_size=q, indices=_words(reports)))
    return request.SerializeToString()


def encode_batches(payloads: Sequence[bytes]) -> bytes:
    """The serialized UploadBatchesRequest of serialized UploadRequests, in their order: each batch
    is written back as the bytes it was (fields in number order, as protoc writes them)."""
    request = veil_pb2.UploadBatchesRequest()
    for payload in payloads:
        request.batches.add().MergeFromString(payload)
    return request.SerializeToString()
