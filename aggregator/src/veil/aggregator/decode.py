"""Validate one upload and sum its reports into fresh counts: all or nothing, vectorized.

decode_upload assumes the servicer has already matched the request's metric name and spec
fingerprint to ``metric`` (UnknownMetric and StaleSpec are raised there, before decoding). It
has no side effects: it returns new Counts or raises InvalidBatch, and the caller writes the
counts to the store only after it returns, so nothing of an invalid batch is ever counted.

The payload is read in place (numpy.frombuffer over the request's bytes, never copied or
written), and every report-level check is a whole-array operation: one validity mask per
check, the first failing report taken over all of them, and only that one report examined
again in Python to name its reason.
"""

from __future__ import annotations

import numpy as np

from veil.mechanism import AdmissibleRapporSpec, MechanismSpec, MetricSpec
from veil.wire.v1 import veil_pb2

from ._errors import InvalidBatch
from .counts import Counts
from .simulate import count_reports

__all__ = ["BATCH_ID_BYTES", "decode_upload", "decode_index_sets", "decode_bitmaps"]

BATCH_ID_BYTES = 16
_INDEX_BYTES = 4  # each index is a little-endian uint32


def decode_upload(request: veil_pb2.UploadRequest, metric: MetricSpec, *, max_reports: int) -> Counts:
    """The counts of a valid batch of ``metric``'s reports, or InvalidBatch naming the first
    problem: the batch's own (report None) before any report's (the smallest bad index)."""
    spec = metric.mechanism
    _check_batch(request, max_reports)
    payload = request.WhichOneof("reports")
    if payload == "index_sets":
        return count_reports(spec, decode_index_sets(spec, request.count, request.index_sets))
    if payload == "bitmaps":
        bitmaps = decode_bitmaps(spec, request.count, request.bitmaps)
        return count_reports(spec, bitmaps) if spec.q is None else _count_subset_bitmaps(spec, bitmaps)
    raise InvalidBatch("no reports payload: set index_sets or bitmaps")


def _check_batch(request: veil_pb2.UploadRequest, max_reports: int) -> None:
    if len(request.batch_id) != BATCH_ID_BYTES:
        raise InvalidBatch(f"batch_id must be {BATCH_ID_BYTES} bytes, not {len(request.batch_id)}")
    if request.count == 0:
        raise InvalidBatch("empty batch")
    if request.count > max_reports:
        raise InvalidBatch(f"oversize batch: {request.count} reports, at most {max_reports}")


def _check_length(field: str, actual: int, expected: int, layout: str) -> None:
    if actual != expected:
        raise InvalidBatch(f"{field} has {actual} bytes, expected {expected} ({layout})")


def _first_bad(bad: np.ndarray) -> int | None:
    """The smallest index where the mask is set, or None."""
    first = int(bad.argmax())
    return first if bad[first] else None


def decode_index_sets(spec: MechanismSpec, count: int, index_sets: veil_pb2.IndexSets) -> np.ndarray:
    """The (count, q) uint32 category indices of valid index-set reports, a read-only view of
    the message's bytes; InvalidBatch for the batch's layout or the first bad report."""
    if spec.q is None:
        raise InvalidBatch(f"{spec.name} reports must be sent as bitmaps, not index sets")
    if index_sets.set_size != spec.q:
        raise InvalidBatch(f"set_size {index_sets.set_size} is not q = {spec.q}")
    data = index_sets.indices
    _check_length("index_sets.indices", len(data), count * spec.q * _INDEX_BYTES,
                  f"{count} reports of {spec.q} uint32 indices")
    reports = np.frombuffer(data, dtype="<u4").reshape(count, spec.q)
    # A strictly increasing report is in range exactly when its last index is, so two
    # whole-array passes find every bad report; the reason is read off that report alone.
    bad = ~(reports[:, 1:] > reports[:, :-1]).all(axis=1)
    bad |= reports[:, -1] >= spec.k
    first = _first_bad(bad)
    if first is not None:
        raise InvalidBatch(_index_set_fault(reports[first], spec.k), report=first)
    return reports


def _index_set_fault(report: np.ndarray, k: int) -> str:
    outside = report[report >= k]
    if outside.size:
        return f"category index {outside[0]} is out of range (k = {k})"
    return "indices are not strictly increasing (duplicate or unsorted)"


def decode_bitmaps(spec: MechanismSpec, count: int, bitmaps: veil_pb2.Bitmaps) -> np.ndarray:
    """The (count, ceil(k / 8)) uint8 rows of valid bitmap reports, a read-only view of the
    message's bytes; InvalidBatch for the batch's length or the first bad report."""
    width = -(-spec.k // 8)
    data = bitmaps.bits
    _check_length("bitmaps.bits", len(data), count * width, f"{count} reports of {width} bytes")
    reports = np.frombuffer(data, dtype=np.uint8).reshape(count, width)
    # Bits k .. 8 * width - 1 of the last byte; none when k is a multiple of 8.
    padding = reports[:, -1] & np.uint8((0xFF << (spec.k - 8 * (width - 1))) & 0xFF)
    weights = np.bitwise_count(reports).sum(axis=1, dtype=np.intp)
    # Padding bits count towards the weight here, but such a report is rejected anyway.
    allowed = np.zeros(8 * width + 1, dtype=bool)
    allowed[list(spec.weight_law().weights)] = True
    first = _first_bad((padding != 0) | ~allowed[weights])
    if first is not None:
        reason = "padding bits past k are set" if padding[first] else _weight_fault(spec, int(weights[first]))
        raise InvalidBatch(reason, report=first)
    return reports


def _weight_fault(spec: MechanismSpec, weight: int) -> str:
    if spec.q is not None:
        return f"weight {weight} is not q = {spec.q}"
    if isinstance(spec, AdmissibleRapporSpec):
        return "a RAPPOR-admissible report may not be all zeros or all ones"
    return f"weight {weight} is not allowed by {spec.name}"


def _count_subset_bitmaps(spec: MechanismSpec, bitmaps: np.ndarray) -> Counts:
    """Counts of valid q-subset bitmaps. count_reports reads a q-subset design's reports only
    as index rows, and turning bitmaps into those costs more than summing the bit columns:
    every report has the one weight q, so V is the column sum and n the number of rows."""
    counts = Counts.zeros(spec)
    counts.n[0] = bitmaps.shape[0]
    # uint32 cannot overflow (count is a uint32) and sums several times faster than int64.
    columns = np.add.reduce(np.unpackbits(bitmaps, axis=1, bitorder="little"), axis=0, dtype=np.uint32)
    counts.v[0] = columns[: spec.k]
    return counts
