"""Validate one upload and sum its reports into fresh counts: all or nothing, vectorized.

decode_upload assumes the servicer has already matched the request's metric name and spec
fingerprint to ``metric`` (UnknownMetric and StaleSpec are raised there, before decoding). It
has no side effects: it returns new Counts or raises InvalidBatch, and the caller writes the
counts to the store only after it returns, so nothing of an invalid batch is ever counted.

The payload is read in place (numpy.frombuffer over the request's bytes, never copied or
written). decode_upload checks and sums the reports in one pass of a numba kernel (see
_kernels: decode_subset_bitmaps, decode_bitmaps, decode_index_sets) that stops at the first bad
report; only that one report is examined again in Python to name its reason. decode_bitmaps and
decode_index_sets check a batch with whole-array numpy operations instead (the same checks)
and return the reports. ``warm_up()`` compiles (or loads from numba's cache) every kernel an
upload can call, so that no upload waits for it; CollectorService calls it when it is made.
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from veil.mechanism import (
    BITMAPS,
    HASHED_REPORTS,
    INDEX_SETS,
    REPORT_BYTES,
    REPORT_WORDS,
    AdmissibleRapporSpec,
    MechanismSpec,
    MetricSpec,
    encodings,
    report_bytes,
)
from veil.wire.v1 import veil_pb2

from . import _kernels
from .counts import Counts
from .discovery import count_hashed
from .errors import InvalidBatch

__all__ = [
    "BATCH_ID_BYTES",
    "UNPARSEABLE",
    "decode_upload",
    "decode_index_sets",
    "decode_bitmaps",
    "parse_batches",
    "parse_upload",
    "reports_held",
    "warm_up",
]

BATCH_ID_BYTES = 16
UNPARSEABLE = "The upload is not a valid message (UploadRequest; UploadBatchesRequest for several batches)."


def parse_upload(data: bytes) -> veil_pb2.UploadRequest | bytes:
    """The request in ``data``, or ``data`` itself when it does not parse. The Upload method's
    request deserializer: grpcio answers a deserializer's exception (or a None) with INTERNAL,
    but bytes that are not an UploadRequest are the caller's error, INVALID_ARGUMENT, which
    whoever receives the bytes answers."""
    try:
        return veil_pb2.UploadRequest.FromString(data)
    except DecodeError:
        return data


def parse_batches(data: bytes) -> veil_pb2.UploadBatchesRequest | bytes:
    """parse_upload of UploadBatches: the request in ``data``, or ``data`` when it does not parse."""
    try:
        return veil_pb2.UploadBatchesRequest.FromString(data)
    except DecodeError:
        return data


def reports_held(request: veil_pb2.UploadRequest, metric: MetricSpec | None) -> int:
    """How many reports the upload's payload can hold, at most its claimed count: what a rate
    limit charges, so that a batch claiming more reports than it carries costs what it carries
    (0 for a metric not declared, or an encoding the spec does not use)."""
    payload = request.WhichOneof("reports")
    if payload == HASHED_REPORTS:  # a strings round (whose spec changes with the period: not asked)
        return min(request.count, len(request.hashed.words) // REPORT_BYTES)
    if metric is None:
        return 0
    spec = metric.mechanism
    if payload not in encodings(spec):
        return 0
    data = request.index_sets.indices if payload == INDEX_SETS else request.bitmaps.bits
    return min(request.count, len(data) // report_bytes(spec, payload))


def decode_upload(request: veil_pb2.UploadRequest, metric: MetricSpec, *, max_reports: int) -> Counts:
    """The counts of a valid batch of ``metric``'s reports, or InvalidBatch naming the first
    problem: the batch's own (report None) before any report's (the smallest bad index)."""
    spec = metric.mechanism
    _check_batch(request, max_reports)
    payload = request.WhichOneof("reports")
    if metric.strings is not None and payload in (INDEX_SETS, BITMAPS):
        raise InvalidBatch(f"a strings round's reports are sent as {HASHED_REPORTS} reports, not {payload}")
    if payload == INDEX_SETS:
        return _count_index_sets(spec, request.count, request.index_sets)
    if payload == BITMAPS:
        return _count_bitmaps(spec, request.count, request.bitmaps)
    if payload == HASHED_REPORTS:
        return _count_hashed(metric, request.count, request.hashed)
    raise InvalidBatch(f"no reports payload: set {' or '.join(encodings(spec))}")


def _count_hashed(metric: MetricSpec, count: int, hashed: veil_pb2.HashedReports) -> Counts:
    """The counts of a strings round's hashed reports: each candidate's reports holding it."""
    if metric.strings is None:
        raise InvalidBatch(f"{metric.mechanism.name} reports are not sent as hashed reports")
    data = hashed.words
    _check_length("hashed.words", len(data), count * REPORT_BYTES, f"{count} reports of {REPORT_WORDS} uint32 words")
    reports = np.frombuffer(data, "<u4").reshape(count, REPORT_WORDS)
    counts = Counts.zeros(metric.mechanism)
    bad = count_hashed(metric, reports, counts)
    if bad >= 0:
        fault = metric.mechanism.check_report([int(w) for w in reports[bad]])  # type: ignore[attr-defined]
        raise InvalidBatch(fault or "bad hashed report", report=bad)
    return counts


def _count_index_sets(spec: MechanismSpec, count: int, index_sets: veil_pb2.IndexSets) -> Counts:
    reports = _index_set_rows(spec, count, index_sets)
    counts = Counts.zeros(spec)  # a q-subset design: one weight, q
    bad = _kernels.decode_index_sets(reports, spec.k, counts.v[0])
    if bad >= 0:
        raise InvalidBatch(_index_set_fault(reports[bad], spec.k), report=bad)
    counts.n[0] = count
    return counts


def _count_bitmaps(spec: MechanismSpec, count: int, bitmaps: veil_pb2.Bitmaps) -> Counts:
    data = _bitmap_bytes(spec, count, bitmaps)
    counts = Counts.zeros(spec)
    if spec.q is not None:
        bad = _kernels.decode_subset_bitmaps(data, count, spec.k, spec.q, counts.v[0])
        counts.n[0] = count
    else:
        bad = _kernels.decode_bitmaps(data, count, spec.k, _rows_of_weight(spec), counts.n, counts.v)
    if bad >= 0:
        width = report_bytes(spec, BITMAPS)
        raise InvalidBatch(_bitmap_fault(spec, data[bad * width : (bad + 1) * width]), report=bad)
    return counts


_ROWS: dict[MechanismSpec, np.ndarray] = {}


def _rows_of_weight(spec: MechanismSpec) -> np.ndarray:
    """Counts.row_of_weight() of the spec's counts, computed once per spec (read-only)."""
    rows = _ROWS.get(spec)
    if rows is None:
        rows = Counts.zeros(spec).row_of_weight()
        rows.flags.writeable = False
        if len(_ROWS) >= 256:  # specs come from the config: a bound that is never reached
            _ROWS.clear()
        _ROWS[spec] = rows
    return rows


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
    reports = _index_set_rows(spec, count, index_sets)
    # A strictly increasing report is in range exactly when its last index is, so two
    # whole-array passes find every bad report; the reason is read off that report alone.
    bad = ~(reports[:, 1:] > reports[:, :-1]).all(axis=1)
    bad |= reports[:, -1] >= spec.k
    first = _first_bad(bad)
    if first is not None:
        raise InvalidBatch(_index_set_fault(reports[first], spec.k), report=first)
    return reports


def _index_set_rows(spec: MechanismSpec, count: int, index_sets: veil_pb2.IndexSets) -> np.ndarray:
    """The (count, q) uint32 view of the indices, once the batch's layout is right."""
    if INDEX_SETS not in encodings(spec):
        raise InvalidBatch(f"{spec.name} reports must be sent as bitmaps, not index sets")
    if index_sets.set_size != spec.q:
        raise InvalidBatch(f"set_size {index_sets.set_size} is not q = {spec.q}")
    data = index_sets.indices
    _check_length(
        "index_sets.indices",
        len(data),
        count * report_bytes(spec, INDEX_SETS),
        f"{count} reports of {spec.q} uint32 indices",
    )
    return np.frombuffer(data, dtype="<u4").reshape(count, spec.q)


def _index_set_fault(report: np.ndarray, k: int) -> str:
    outside = report[report >= k]
    if outside.size:
        return f"category index {outside[0]} is out of range (k = {k})"
    return "indices are not strictly increasing (duplicate or unsorted)"


def decode_bitmaps(spec: MechanismSpec, count: int, bitmaps: veil_pb2.Bitmaps) -> np.ndarray:
    """The (count, ceil(k / 8)) uint8 rows of valid bitmap reports, a read-only view of the
    message's bytes; InvalidBatch for the batch's length or the first bad report."""
    width = report_bytes(spec, BITMAPS)
    reports = _bitmap_bytes(spec, count, bitmaps).reshape(count, width)
    # Bits k .. 8 * width - 1 of the last byte; none when k is a multiple of 8.
    padding = reports[:, -1] & np.uint8(_padding_mask(spec.k))
    weights = np.bitwise_count(reports).sum(axis=1, dtype=np.intp)
    # Padding bits count towards the weight here, but such a report is rejected anyway.
    allowed = np.zeros(8 * width + 1, dtype=bool)
    allowed[list(spec.weight_law().weights)] = True
    first = _first_bad((padding != 0) | ~allowed[weights])
    if first is not None:
        raise InvalidBatch(_bitmap_fault(spec, reports[first]), report=first)
    return reports


def _bitmap_bytes(spec: MechanismSpec, count: int, bitmaps: veil_pb2.Bitmaps) -> np.ndarray:
    """The payload as one uint8 view, once its length is right."""
    width = report_bytes(spec, BITMAPS)
    data = bitmaps.bits
    _check_length("bitmaps.bits", len(data), count * width, f"{count} reports of {width} bytes")
    return np.frombuffer(data, dtype=np.uint8)


def _padding_mask(k: int) -> int:
    """The bits of a bitmap's last byte that lie past category k - 1."""
    return (0xFF << (k - 8 * (-(-k // 8) - 1))) & 0xFF


def _bitmap_fault(spec: MechanismSpec, report: np.ndarray) -> str:
    """Why one bitmap report is bad: padding first, then its weight."""
    if report[-1] & _padding_mask(spec.k):
        return "padding bits past k are set"
    return _weight_fault(spec, int(np.bitwise_count(report).sum()))


def _weight_fault(spec: MechanismSpec, weight: int) -> str:
    if spec.q is not None:
        return f"weight {weight} is not q = {spec.q}"
    if isinstance(spec, AdmissibleRapporSpec):
        return "a RAPPOR-admissible report may not be all zeros or all ones"
    return f"weight {weight} is not allowed by {spec.name}"


def warm_up() -> None:
    """Compile, or load from numba's cache, every kernel decode_upload calls, for the argument
    types it calls them with (read-only payload views, int64 counts), on a tiny valid batch."""
    from veil.mechanism import RapporSpec, SubsetSpec

    subset, rappor = SubsetSpec(16, 1.0), RapporSpec(16, 1.0)
    bitmap = np.frombuffer(bytes([0x0F, 0x00]), np.uint8)
    for spec, data in ((subset, bitmap), (rappor, bitmap)):
        counts = Counts.zeros(spec)
        if spec.q is not None:
            _kernels.decode_subset_bitmaps(data, 1, spec.k, spec.q, counts.v[0])
        else:
            _kernels.decode_bitmaps(data, 1, spec.k, _rows_of_weight(spec), counts.n, counts.v)
    indices = np.frombuffer(np.arange(subset.q, dtype="<u4").tobytes(), "<u4").reshape(1, subset.q)
    _kernels.decode_index_sets(indices, subset.k, Counts.zeros(subset).v[0])
