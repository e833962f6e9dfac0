"""decode_upload: a valid batch counts exactly what count_reports counts; a malformed one is
rejected whole, naming the batch or its first bad report and the reason, and nothing else ever
escapes (random, truncated and extended payloads included)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from veil.aggregator.counts import Counts
from veil.aggregator.decode import BATCH_ID_BYTES, decode_bitmaps, decode_index_sets, decode_upload
from veil.aggregator.errors import InvalidBatch
from veil.aggregator.simulate import FastKeystream, count_reports, simulate_reports
from veil.mechanism import AdmissibleRapporSpec, KrrSpec, MechanismSpec, MetricSpec, RapporSpec, SubsetSpec, WarnerSpec
from veil.wire.v1 import veil_pb2

N = 40  # reports per test batch
MAX_REPORTS = 1000
SPECS = [
    SubsetSpec(16, 4.0),  # q = 1
    SubsetSpec(13, 0.5),  # q = 5, with padding bits
    SubsetSpec(128, 1.0),  # q = 34
    KrrSpec(6, 1.0),
    WarnerSpec(2, 1.0),
    RapporSpec(13, 1.0),
    RapporSpec(16, 1.0),
    AdmissibleRapporSpec(13, 1.0),
    AdmissibleRapporSpec(16, 2.0),
]
# Every encoding a design accepts: q-subset designs send index sets or bitmaps, RAPPOR bitmaps.
ENCODINGS = [
    (spec, kind) for spec in SPECS for kind in ("index_sets", "bitmaps") if kind == "bitmaps" or spec.q is not None
]


def encoding_id(spec: MechanismSpec, kind: str) -> str:
    return f"{spec.name}-k{spec.k}-eps{spec.epsilon}-{kind}"


def metric_of(spec: MechanismSpec) -> MetricSpec:
    return MetricSpec("m", tuple(f"c{j}" for j in range(spec.k)), spec)


def bitmaps_of(index_rows: np.ndarray, k: int) -> np.ndarray:
    bits = np.zeros((len(index_rows), 8 * -(-k // 8)), np.uint8)
    np.put_along_axis(bits, index_rows.astype(np.intp), 1, axis=1)
    return np.packbits(bits, axis=1, bitorder="little")


def simulated(spec: MechanismSpec, n: int = N, seed: int = 0) -> np.ndarray:
    """n reports in simulate_reports' layout: (n, q) uint32 index rows for a q-subset design,
    (n, ceil(k / 8)) uint8 bitmaps for RAPPOR."""
    values = np.random.default_rng(seed).integers(0, spec.k, n)
    return simulate_reports(spec, values, keystream=FastKeystream(seed))


def valid_reports(spec: MechanismSpec, kind: str, n: int = N, seed: int = 0) -> np.ndarray:
    """The same reports in the layout of the encoding."""
    reports = simulated(spec, n, seed)
    return bitmaps_of(reports, spec.k) if kind == "bitmaps" and spec.q is not None else reports


def upload(kind: str, reports: np.ndarray) -> veil_pb2.UploadRequest:
    if kind == "index_sets":
        payload = {"index_sets": veil_pb2.IndexSets(set_size=reports.shape[1], indices=reports.astype("<u4").tobytes())}
    else:
        payload = {"bitmaps": veil_pb2.Bitmaps(bits=reports.tobytes())}
    return veil_pb2.UploadRequest(batch_id=bytes(range(BATCH_ID_BYTES)), metric="m", count=len(reports), **payload)


def payload_of(request: veil_pb2.UploadRequest) -> bytes:
    return request.index_sets.indices if request.HasField("index_sets") else request.bitmaps.bits


def decode(spec: MechanismSpec, request: veil_pb2.UploadRequest) -> Counts:
    """decode_upload, checking on every call that the request is the same afterwards."""
    before = request.SerializeToString(deterministic=True)
    try:
        return decode_upload(request, metric_of(spec), max_reports=MAX_REPORTS)
    finally:
        assert request.SerializeToString(deterministic=True) == before


def rejection(spec: MechanismSpec, request: veil_pb2.UploadRequest) -> InvalidBatch:
    with pytest.raises(InvalidBatch) as caught:
        decode(spec, request)
    return caught.value


def reference_counts(spec: MechanismSpec, bitmaps: np.ndarray) -> Counts:
    """Per-weight counts in plain NumPy, one weight at a time."""
    bits = np.unpackbits(bitmaps, axis=1, count=spec.k, bitorder="little").astype(np.int64)
    weight = bits.sum(axis=1)
    weights = spec.weight_law().weights
    return Counts(weights, [np.sum(weight == t) for t in weights], [bits[weight == t].sum(axis=0) for t in weights])


# --- valid batches -----------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "kind"), ENCODINGS, ids=[encoding_id(*e) for e in ENCODINGS])
def test_a_valid_batch_counts_what_count_reports_and_a_plain_sum_count(spec, kind):
    counts = decode(spec, upload(kind, valid_reports(spec, kind)))
    assert counts == count_reports(spec, simulated(spec))
    assert counts == reference_counts(spec, valid_reports(spec, "bitmaps"))
    assert counts.total == N


@pytest.mark.parametrize("kind", ["index_sets", "bitmaps"])
def test_the_decoded_reports_are_read_only_views_of_the_request(kind):
    spec = SubsetSpec(13, 0.5)
    reports = valid_reports(spec, kind)
    request = upload(kind, reports)
    decoded = (
        decode_index_sets(spec, N, request.index_sets)
        if kind == "index_sets"
        else decode_bitmaps(spec, N, request.bitmaps)
    )
    assert np.array_equal(decoded, reports) and not decoded.flags.writeable


def test_max_reports_is_enforced():
    spec = KrrSpec(6, 1.0)
    request = upload("index_sets", valid_reports(spec, "index_sets", n=7))
    assert decode_upload(request, metric_of(spec), max_reports=7).total == 7
    with pytest.raises(InvalidBatch) as caught:
        decode_upload(request, metric_of(spec), max_reports=6)
    assert caught.value.reason == "oversize batch: 7 reports, at most 6" and caught.value.report is None


# --- bad reports -------------------------------------------------------------------------


def _flip_first_bit(bitmap: np.ndarray, k: int, value: int) -> None:
    """Flip the first bit below k that equals value."""
    j = int(np.flatnonzero(np.unpackbits(bitmap, count=k, bitorder="little") == value)[0])
    bitmap[j // 8] ^= np.uint8(1 << (j % 8))


def _fill(bitmap: np.ndarray, k: int, value: int) -> None:
    """Set every category bit to value, the padding bits to zero."""
    bitmap[:] = np.packbits(np.full(k, value, np.uint8), bitorder="little")


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str
    applies: Callable[[MechanismSpec], bool]
    inject: Callable[[np.ndarray, MechanismSpec], None]  # spoils one report in place
    reason: Callable[[MechanismSpec], str]


def _swap_first_two(report: np.ndarray, spec: MechanismSpec) -> None:
    report[[0, 1]] = report[[1, 0]]


def _repeat_first(report: np.ndarray, spec: MechanismSpec) -> None:
    report[1] = report[0]


def _set_last_to_k(report: np.ndarray, spec: MechanismSpec) -> None:
    report[-1] = spec.k


def _set_first_to_max(report: np.ndarray, spec: MechanismSpec) -> None:
    report[0] = np.iinfo(np.uint32).max


def _set_first_padding_bit(report: np.ndarray, spec: MechanismSpec) -> None:
    report[-1] |= np.uint8(1 << spec.k % 8)


def _set_last_padding_bit(report: np.ndarray, spec: MechanismSpec) -> None:
    report[-1] |= np.uint8(0x80)


UNSORTED = "indices are not strictly increasing (duplicate or unsorted)"
PADDING = "padding bits past k are set"
ADMISSIBLE = "a RAPPOR-admissible report may not be all zeros or all ones"

FAULTS = [
    Fault(
        "index-k",
        "index_sets",
        lambda s: True,
        _set_last_to_k,
        lambda s: f"category index {s.k} is out of range (k = {s.k})",
    ),
    # Out of range and (for q > 1) unsorted at once: range is checked first.
    Fault(
        "index-max",
        "index_sets",
        lambda s: True,
        _set_first_to_max,
        lambda s: f"category index 4294967295 is out of range (k = {s.k})",
    ),
    Fault("duplicate", "index_sets", lambda s: s.q > 1, _repeat_first, lambda s: UNSORTED),
    Fault("unsorted", "index_sets", lambda s: s.q > 1, _swap_first_two, lambda s: UNSORTED),
    # For a q-subset design these also raise the weight to q + 1: padding is checked first.
    Fault("padding-first", "bitmaps", lambda s: s.k % 8 != 0, _set_first_padding_bit, lambda s: PADDING),
    Fault("padding-last", "bitmaps", lambda s: s.k % 8 != 0, _set_last_padding_bit, lambda s: PADDING),
    Fault(
        "extra-bit",
        "bitmaps",
        lambda s: s.q is not None,
        lambda r, s: _flip_first_bit(r, s.k, 0),
        lambda s: f"weight {s.q + 1} is not q = {s.q}",
    ),
    Fault(
        "missing-bit",
        "bitmaps",
        lambda s: s.q is not None,
        lambda r, s: _flip_first_bit(r, s.k, 1),
        lambda s: f"weight {s.q - 1} is not q = {s.q}",
    ),
    Fault(
        "all-zeros",
        "bitmaps",
        lambda s: isinstance(s, AdmissibleRapporSpec),
        lambda r, s: _fill(r, s.k, 0),
        lambda s: ADMISSIBLE,
    ),
    Fault(
        "all-ones",
        "bitmaps",
        lambda s: isinstance(s, AdmissibleRapporSpec),
        lambda r, s: _fill(r, s.k, 1),
        lambda s: ADMISSIBLE,
    ),
]
FAULT = {fault.name: fault for fault in FAULTS}
FAULT_CASES = [
    (spec, kind, fault) for spec, kind in ENCODINGS for fault in FAULTS if fault.kind == kind and fault.applies(spec)
]


def fault_id(spec: MechanismSpec, kind: str, fault: Fault) -> str:
    return f"{encoding_id(spec, kind)}-{fault.name}"


def spoiled(spec: MechanismSpec, kind: str, faults: dict[int, Fault]) -> veil_pb2.UploadRequest:
    """A valid batch with each given report spoiled by its fault."""
    reports = valid_reports(spec, kind)
    for index, fault in faults.items():
        fault.inject(reports[index], spec)
    return upload(kind, reports)


@pytest.mark.parametrize("index", [0, 17, N - 1])
@pytest.mark.parametrize(("spec", "kind", "fault"), FAULT_CASES, ids=[fault_id(*c) for c in FAULT_CASES])
def test_one_bad_report_rejects_the_batch_naming_it(spec, kind, fault, index):
    error = rejection(spec, spoiled(spec, kind, {index: fault}))
    assert (error.report, error.reason) == (index, fault.reason(spec))
    assert str(error) == f"report {index}: {fault.reason(spec)}"


PAIR_CASES = [
    (spec, kind, first, second)
    for spec, kind in ENCODINGS
    for first, second in itertools.permutations(FAULTS, 2)
    if first.kind == second.kind == kind and first.applies(spec) and second.applies(spec)
]


@pytest.mark.parametrize(
    ("spec", "kind", "earlier", "later"),
    PAIR_CASES,
    ids=[f"{encoding_id(s, k)}-{a.name}-before-{b.name}" for s, k, a, b in PAIR_CASES],
)
def test_the_smallest_bad_report_is_named_whatever_its_fault(spec, kind, earlier, later):
    error = rejection(spec, spoiled(spec, kind, {23: later, 5: earlier, 31: later}))
    assert (error.report, error.reason) == (5, earlier.reason(spec))


# --- bad batches -------------------------------------------------------------------------


def _set(**fields) -> Callable[[veil_pb2.UploadRequest], None]:
    def mutate(request: veil_pb2.UploadRequest) -> None:
        for name, value in fields.items():
            setattr(request, name, value)

    return mutate


def _clear_payload(request: veil_pb2.UploadRequest) -> None:
    request.ClearField(request.WhichOneof("reports"))


def _set_size(size: int) -> Callable[[veil_pb2.UploadRequest], None]:
    def mutate(request: veil_pb2.UploadRequest) -> None:
        request.index_sets.set_size = size

    return mutate


def _replace_payload(request: veil_pb2.UploadRequest, data: bytes) -> None:
    if request.HasField("index_sets"):
        request.index_sets.indices = data
    else:
        request.bitmaps.bits = data


def _resize_payload(change: int) -> Callable[[veil_pb2.UploadRequest], None]:
    def mutate(request: veil_pb2.UploadRequest) -> None:
        data = payload_of(request)
        _replace_payload(request, data[:change] if change < 0 else data + b"\xff" * change)

    return mutate


SUBSET = SubsetSpec(13, 0.5)  # q = 5: 20 bytes an index set, 2 bytes a bitmap
INDEX_BYTES = f"index_sets.indices has {{}} bytes, expected {N * 20} ({N} reports of 5 uint32 indices)"
BITMAP_BYTES = f"bitmaps.bits has {{}} bytes, expected {N * 2} ({N} reports of 2 bytes)"
# (spec, encoding, mutations, reason): several mutations check that the earlier check wins.
# The RAPPOR "index sets" are its bitmap bytes sent as uint32 indices.
BATCH_CASES = {
    "batch-id-short": (SUBSET, "index_sets", [_set(batch_id=bytes(15))], "batch_id must be 16 bytes, not 15"),
    "batch-id-long": (SUBSET, "bitmaps", [_set(batch_id=bytes(17))], "batch_id must be 16 bytes, not 17"),
    "batch-id-missing-and-empty": (
        SUBSET,
        "index_sets",
        [_set(batch_id=b"", count=0)],
        "batch_id must be 16 bytes, not 0",
    ),
    "empty": (SUBSET, "index_sets", [_set(count=0)], "empty batch"),
    "empty-without-payload": (SUBSET, "bitmaps", [_set(count=0), _clear_payload], "empty batch"),
    "oversize": (
        SUBSET,
        "bitmaps",
        [_set(count=MAX_REPORTS + 1)],
        f"oversize batch: {MAX_REPORTS + 1} reports, at most {MAX_REPORTS}",
    ),
    "oversize-without-payload": (
        SUBSET,
        "index_sets",
        [_set(count=MAX_REPORTS + 1), _clear_payload],
        f"oversize batch: {MAX_REPORTS + 1} reports, at most {MAX_REPORTS}",
    ),
    "no-payload": (SUBSET, "index_sets", [_clear_payload], "no reports payload: set index_sets or bitmaps"),
    "rappor-index-sets": (
        RapporSpec(13, 1.0),
        "index_sets",
        [],
        "rappor reports must be sent as bitmaps, not index sets",
    ),
    "admissible-index-sets-of-wrong-length": (
        AdmissibleRapporSpec(13, 1.0),
        "index_sets",
        [_resize_payload(-1)],
        "rappor-admissible reports must be sent as bitmaps, not index sets",
    ),
    "set-size": (SUBSET, "index_sets", [_set_size(4)], "set_size 4 is not q = 5"),
    "set-size-zero": (SUBSET, "index_sets", [_set_size(0)], "set_size 0 is not q = 5"),
    "indices-truncated": (SUBSET, "index_sets", [_resize_payload(-1)], INDEX_BYTES.format(N * 20 - 1)),
    "indices-extended": (SUBSET, "index_sets", [_resize_payload(4)], INDEX_BYTES.format(N * 20 + 4)),
    "bits-truncated": (SUBSET, "bitmaps", [_resize_payload(-2)], BITMAP_BYTES.format(N * 2 - 2)),
    "bits-extended": (SUBSET, "bitmaps", [_resize_payload(1)], BITMAP_BYTES.format(N * 2 + 1)),
    "count-below-payload": (
        SUBSET,
        "bitmaps",
        [_set(count=N - 1)],
        f"bitmaps.bits has {N * 2} bytes, expected {(N - 1) * 2} ({N - 1} reports of 2 bytes)",
    ),
}


@pytest.mark.parametrize("case", BATCH_CASES)
@pytest.mark.parametrize("bad_report", [False, True], ids=["reports-fine", "report-0-bad-too"])
def test_a_malformed_batch_is_rejected_as_a_whole(case, bad_report):
    spec, kind, mutations, reason = BATCH_CASES[case]
    # A bad report too changes nothing: the batch's own checks come first.
    fault = FAULT["index-k" if kind == "index_sets" else "padding-last"]
    request = spoiled(spec, kind, {0: fault} if bad_report else {})
    for mutate in mutations:
        mutate(request)
    error = rejection(spec, request)
    assert (error.report, error.reason) == (None, reason)
    assert str(error) == f"batch: {reason}"


LENGTH_CASES = [(SUBSET, "index_sets"), (SUBSET, "bitmaps"), (AdmissibleRapporSpec(13, 1.0), "bitmaps")]


@pytest.mark.parametrize(("spec", "kind"), LENGTH_CASES, ids=[encoding_id(*e) for e in LENGTH_CASES])
def test_every_truncation_and_extension_of_the_payload_is_a_length_error(spec, kind):
    data = payload_of(upload(kind, valid_reports(spec, kind, n=3)))
    for changed in [data[:cut] for cut in range(len(data))] + [
        data + bytes([b]) * extra for extra in range(1, 9) for b in (0, 0xFF)
    ]:
        request = upload(kind, valid_reports(spec, kind, n=3))
        _replace_payload(request, changed)
        error = rejection(spec, request)
        field = "index_sets.indices" if kind == "index_sets" else "bitmaps.bits"
        assert error.report is None and error.reason.startswith(f"{field} has {len(changed)} bytes, expected")


def test_random_and_corrupted_payloads_raise_only_invalid_batch():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    specs = [SubsetSpec(13, 0.5), KrrSpec(6, 1.0), RapporSpec(13, 1.0), AdmissibleRapporSpec(9, 1.0)]

    @st.composite
    def cases(draw):
        def rarely() -> bool:
            # Each corruption on its own now and then, so that most batches pass the batch's
            # checks and reach those of single reports.
            return draw(st.integers(0, 7)) == 0

        spec = draw(st.sampled_from(specs))
        kind = draw(st.sampled_from(["index_sets", "bitmaps"]))
        request = upload(kind, valid_reports(spec, kind, n=draw(st.integers(0, 12)), seed=draw(st.integers(0, 9))))
        if rarely():
            _replace_payload(request, draw(st.binary(max_size=120)))
        payload = bytearray(payload_of(request))
        for position in draw(st.lists(st.integers(0, len(payload) - 1), max_size=3)) if payload else ():
            payload[position] ^= draw(st.integers(1, 255))
        if rarely():
            payload = payload[: draw(st.integers(0, len(payload)))] + draw(st.binary(max_size=4))
        _replace_payload(request, bytes(payload))
        if kind == "index_sets" and rarely():
            request.index_sets.set_size = draw(st.integers(0, 6))
        if rarely():
            request.count = draw(st.integers(0, 2**32 - 1))
        if rarely():
            request.batch_id = draw(st.binary(max_size=20))
        if rarely():
            _clear_payload(request)
        return spec, request

    @hypothesis.settings(max_examples=400, derandomize=True, database=None, deadline=None)
    @hypothesis.given(cases())
    def check(case):
        spec, request = case
        try:
            counts = decode(spec, request)
        except InvalidBatch:
            return
        assert counts.total == request.count

    check()


# --- the one-pass kernels behind decode_upload -----------------------------------------------

# Widths around the kernels' 64-bit words and byte lanes: k a multiple of 8 and of 64 or not,
# more than 255 reports (a byte lane is spilled every 255) and more than 2 * 255.
WIDE_SPECS = [
    SubsetSpec(k, eps) for k, eps in ((8, 1.0), (13, 0.5), (64, 1.0), (65, 2.0), (127, 1.0), (1024, 1.0), (1031, 4.0))
]
WIDE_SPECS += [RapporSpec(65, 1.0), AdmissibleRapporSpec(72, 2.0), KrrSpec(300, 1.0)]
WIDE = [
    (spec, kind) for spec in WIDE_SPECS for kind in ("index_sets", "bitmaps") if kind == "bitmaps" or spec.q is not None
]


@pytest.mark.parametrize("n", [1, 255, 256, 777])
@pytest.mark.parametrize(("spec", "kind"), WIDE, ids=[encoding_id(*e) for e in WIDE])
def test_large_and_wide_batches_count_exactly(spec, kind, n):
    reports = valid_reports(spec, kind, n=n, seed=n)
    counts = decode_upload(upload(kind, reports), metric_of(spec), max_reports=MAX_REPORTS)
    assert counts == reference_counts(spec, valid_reports(spec, "bitmaps", n=n, seed=n))
    assert counts.total == n


@pytest.mark.parametrize(("spec", "kind"), WIDE, ids=[encoding_id(*e) for e in WIDE])
def test_the_kernels_reject_what_the_whole_array_checks_reject(spec, kind):
    """decode_upload (one kernel pass) and decode_bitmaps / decode_index_sets (numpy masks)
    name the same first bad report with the same reason, over random corruptions."""
    rng = np.random.default_rng(spec.k)
    n = 600
    clean = valid_reports(spec, kind, n=n, seed=1)
    for _ in range(25):
        reports = clean.copy()
        for index in rng.choice(n, size=rng.integers(1, 4), replace=False):
            row = reports[index]
            if kind == "bitmaps":
                row[rng.integers(row.size)] ^= np.uint8(1 << rng.integers(8))
            else:
                row[rng.integers(row.size)] = rng.choice([rng.integers(spec.k + 2), row[0], 2**32 - 1])
        request = upload(kind, reports)
        decode_numpy = decode_bitmaps if kind == "bitmaps" else decode_index_sets
        try:
            decode_numpy(spec, n, getattr(request, kind))
        except InvalidBatch as error:
            expected = (error.report, error.reason)
        else:
            expected = None
        try:
            counts = decode_upload(request, metric_of(spec), max_reports=MAX_REPORTS)
        except InvalidBatch as error:
            assert (error.report, error.reason) == expected
        else:
            assert expected is None and counts.total == n


def test_warm_up_compiles_every_signature_an_upload_uses():
    """After warm_up, no upload of any design or encoding makes numba compile anything more."""
    from veil.aggregator import _kernels
    from veil.aggregator.decode import warm_up

    warm_up()
    kernels = (_kernels.decode_subset_bitmaps, _kernels.decode_bitmaps, _kernels.decode_index_sets)
    compiled = [len(kernel.signatures) for kernel in kernels]
    warm_up()
    for spec, kind in ENCODINGS + WIDE:
        request = upload(kind, valid_reports(spec, kind))
        assert decode(spec, request) == count_reports(spec, simulated(spec))
    assert [len(kernel.signatures) for kernel in kernels] == compiled
