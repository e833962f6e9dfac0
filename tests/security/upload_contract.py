"""The wire contract's verdict on one upload, written from veil.proto independently of
veil.aggregator.decode: the oracle of the server fuzzing (test_fuzz_uploads) and of the atheris
harness of the decoder (fuzz_decode, which instruments this module so that its branches guide
the fuzzer too)."""

from __future__ import annotations

import numpy as np

from veil.mechanism import AdmissibleRapporSpec, MechanismSpec
from veil.wire.v1 import veil_pb2

__all__ = ["bitmap_width", "members"]


def bitmap_width(mechanism: MechanismSpec) -> int:
    """Bytes of one report's bitmap: ceil(k / 8)."""
    return (mechanism.k + 7) // 8


def members(mechanism: MechanismSpec, request: veil_pb2.UploadRequest, max_reports: int) -> np.ndarray | str | int:
    """(count, k) report membership of a valid batch; else "batch" for a fault of the batch as a
    whole, or the index of its first bad report."""
    k, count = mechanism.k, request.count
    if len(request.batch_id) != 16 or count == 0 or count > max_reports:
        return "batch"
    payload = request.WhichOneof("reports")
    if payload == "index_sets":
        q = mechanism.q
        if q is None or request.index_sets.set_size != q or len(request.index_sets.indices) != 4 * q * count:
            return "batch"
        rows = np.frombuffer(request.index_sets.indices, "<u4").reshape(count, q).astype(np.int64)
        for i, row in enumerate(rows.tolist()):
            if max(row) >= k or any(a >= b for a, b in zip(row, row[1:])):
                return i
        found = np.zeros((count, k), bool)
        found[np.arange(count)[:, None], rows] = True
        return found
    if payload == "bitmaps":
        width = bitmap_width(mechanism)
        if len(request.bitmaps.bits) != count * width:
            return "batch"
        bits = np.unpackbits(
            np.frombuffer(request.bitmaps.bits, np.uint8).reshape(count, width), axis=1, bitorder="little"
        )
        if mechanism.q is not None:
            allowed = {mechanism.q}
        elif isinstance(mechanism, AdmissibleRapporSpec):
            allowed = set(range(1, k))
        else:
            allowed = set(range(k + 1))
        for i, row in enumerate(bits):
            if row[k:].any() or int(row.sum()) not in allowed:
                return i
        return bits[:, :k].astype(bool)
    return "batch"
