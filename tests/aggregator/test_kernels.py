"""The batch kernels, word for word against veil.mechanism's one-report randomization.

Every kernel runs on a keystream whose words are recorded; the reference is ``spec.randomize``
on a WordRandomSource over those same words, report after report. Both must agree exactly,
also when the words run out mid-batch and the driver refills many times.
"""

from __future__ import annotations

import numpy as np
import pytest

from veil.aggregator import simulate
from veil.aggregator.counts import Counts
from veil.aggregator.simulate import AesCtrKeystream, FastKeystream, count_reports, simulate_counts, simulate_reports
from veil.mechanism import (
    AdmissibleRapporSpec,
    KrrSpec,
    MechanismError,
    MechanismSpec,
    RapporSpec,
    SubsetSpec,
    WarnerSpec,
    WordRandomSource,
)

EPSILONS = (0.5, 1.0, 4.0)
SIZES = (2, 3, 5, 16, 64)
SPECS = [
    *(
        cls(k, eps)
        for cls in (SubsetSpec, KrrSpec, RapporSpec, AdmissibleRapporSpec)
        for k in SIZES
        for eps in EPSILONS
    ),
    *(WarnerSpec(2, eps) for eps in EPSILONS),
]
KEY = bytes.fromhex("5eed" * 16)


def spec_id(spec: MechanismSpec) -> str:
    return f"{spec.name}-k{spec.k}-eps{spec.epsilon}"


class Recording:
    """Serves another keystream's words and keeps them, so the reference can replay exactly the
    stream the kernels consumed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.fills: list[np.ndarray] = []

    def fill(self, out: np.ndarray) -> None:
        self.inner.fill(out)
        self.fills.append(out.copy())

    @property
    def words(self) -> np.ndarray:
        return np.concatenate(self.fills)


def true_values(spec: MechanismSpec, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, spec.k, n)


def reference_reports(spec: MechanismSpec, values: np.ndarray, words: np.ndarray) -> np.ndarray:
    """spec.randomize on one WordRandomSource, in the layout simulate_reports returns."""
    source = WordRandomSource(words)
    reports = [spec.randomize(int(v), source) for v in values]
    if spec.q is not None:
        return np.array(reports, dtype=np.uint32).reshape(len(values), spec.q)
    one_hot = np.zeros((len(values), spec.k), np.uint8)
    for row, report in zip(one_hot, reports):
        row[list(report)] = 1
    return np.packbits(one_hot, axis=1, bitorder="little")


def reference_counts(spec: MechanismSpec, reports: np.ndarray) -> Counts:
    """Per-weight sums with plain numpy."""
    counts = Counts.zeros(spec)
    if spec.q is None:
        members = np.unpackbits(reports, axis=1, count=spec.k, bitorder="little").astype(bool)
    else:
        members = np.zeros((len(reports), spec.k), bool)
        np.put_along_axis(members, reports.astype(np.int64), True, axis=1)
    weights = members.sum(axis=1)
    rows = counts.row_of_weight()[weights]
    np.add.at(counts.n, rows, 1)
    np.add.at(counts.v, rows, members.astype(np.int64))
    return counts


def keystream(kind: str, seed: int):
    return FastKeystream(seed) if kind == "fast" else AesCtrKeystream(KEY, seed.to_bytes(16, "big"))


@pytest.mark.parametrize("kind", ["fast", "aes"])
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_reports_are_randomize_on_the_same_words(spec, kind):
    values = true_values(spec, 150, seed=spec.k)
    recording = Recording(keystream(kind, seed=11))
    reports = simulate_reports(spec, values, keystream=recording)
    assert np.array_equal(reports, reference_reports(spec, values, recording.words))


REFILL_SPECS = [
    SubsetSpec(64, 0.5),
    SubsetSpec(16, 1.0),
    KrrSpec(5, 1.0),
    RapporSpec(16, 1.0),
    AdmissibleRapporSpec(2, 0.5),
]


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("spec", REFILL_SPECS, ids=spec_id)
def test_words_running_out_mid_batch_continue_one_stream(spec, chunk, monkeypatch):
    monkeypatch.setattr(simulate, "CHUNK_WORDS", chunk)
    values = true_values(spec, 300, seed=3)
    recording = Recording(FastKeystream(5))
    reports = simulate_reports(spec, values, keystream=recording)
    assert len(recording.fills) > 5  # the refill path ran, many times
    assert np.array_equal(reports, reference_reports(spec, values, recording.words))

    counted = simulate_counts(spec, values, keystream=FastKeystream(5))
    assert counted == count_reports(spec, reports)


class ZeroSprinkled:
    """FastKeystream words with about a third set to zero. below(n) rejects the word 0 unless n
    is a power of two ((0 * n) mod 2**32 = 0 is under the floor (2**32 - n) mod n), a case
    random words hit once in 2**32 / n draws."""

    def __init__(self, seed: int) -> None:
        self.inner = FastKeystream(seed)
        self.rng = np.random.default_rng(seed)

    def fill(self, out: np.ndarray) -> None:
        self.inner.fill(out)
        out[self.rng.random(out.size) < 1 / 3] = 0


@pytest.mark.parametrize("chunk", [7, 1 << 20])
@pytest.mark.parametrize("spec", [SubsetSpec(3, 0.5), SubsetSpec(64, 1.0), KrrSpec(5, 4.0)], ids=spec_id)
def test_rejected_words_are_redrawn_as_lemire(spec, chunk, monkeypatch):
    monkeypatch.setattr(simulate, "CHUNK_WORDS", chunk)
    values = true_values(spec, 300, seed=8)
    recording = Recording(ZeroSprinkled(9))
    reports = simulate_reports(spec, values, keystream=recording)
    assert np.array_equal(reports, reference_reports(spec, values, recording.words))
    assert simulate_counts(spec, values, keystream=ZeroSprinkled(9)) == count_reports(spec, reports)


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_fused_counts_equal_counted_reports_and_numpy(spec):
    values = true_values(spec, 2000, seed=spec.k + 1)
    reports = simulate_reports(spec, values, keystream=FastKeystream(21))
    counted = count_reports(spec, reports)
    assert simulate_counts(spec, values, keystream=FastKeystream(21)) == counted
    assert counted == reference_counts(spec, reports)
    assert counted.total == len(values)


def test_counts_add_into_out():
    spec = SubsetSpec(16, 1.0)
    first, second = true_values(spec, 500, seed=1), true_values(spec, 700, seed=2)
    expected = simulate_counts(spec, first, keystream=FastKeystream(1))
    expected.add(simulate_counts(spec, second, keystream=FastKeystream(2)))

    running = simulate_counts(spec, first, keystream=FastKeystream(1))
    assert simulate_counts(spec, second, keystream=FastKeystream(2), out=running) is running
    assert running == expected

    reports = simulate_reports(spec, second, keystream=FastKeystream(2))
    again = simulate_counts(spec, first, keystream=FastKeystream(1))
    assert count_reports(spec, reports, out=again) is again
    assert again == expected


@pytest.mark.parametrize("spec", [SubsetSpec(16, 1.0), RapporSpec(9, 1.0)], ids=spec_id)
def test_default_keystream_and_empty_batches(spec):
    assert simulate_counts(spec, true_values(spec, 1000, seed=0)).total == 1000
    assert simulate_counts(spec, np.array([], np.int64)) == Counts.zeros(spec)
    empty = simulate_reports(spec, np.array([], np.int64))
    assert empty.shape == (0, spec.q if spec.q else 2)
    assert count_reports(spec, empty) == Counts.zeros(spec)


@pytest.mark.parametrize("values", [[0, 16], [-1, 0], [0.0, 1.0], [[0, 1]], [True, False]])
def test_bad_true_values_raise(values):
    spec = SubsetSpec(16, 1.0)
    with pytest.raises(MechanismError):
        simulate_counts(spec, np.array(values), keystream=FastKeystream(0))
    with pytest.raises(MechanismError):
        simulate_reports(spec, np.array(values), keystream=FastKeystream(0))


def test_bad_subset_reports_raise_and_count_nothing():
    spec = SubsetSpec(16, 1.0)  # q = 4
    good = simulate_reports(spec, true_values(spec, 10, seed=0), keystream=FastKeystream(0))
    counts = count_reports(spec, good)
    before = Counts(counts.weights, counts.n.copy(), counts.v.copy())
    outside = good.copy()
    outside[7, 2] = 16
    negative = good.astype(np.int64)
    negative[3, 0] = -1
    for bad in (outside, negative, good[:, :3], good.astype(np.float64), good[0]):
        with pytest.raises(MechanismError):
            count_reports(spec, bad, out=counts)
    assert counts == before


@pytest.mark.parametrize("spec", [RapporSpec(10, 1.0), AdmissibleRapporSpec(10, 1.0)], ids=spec_id)
def test_bad_bitmap_reports_raise_and_count_nothing(spec):
    good = simulate_reports(spec, true_values(spec, 10, seed=0), keystream=FastKeystream(0))
    counts = count_reports(spec, good)
    before = Counts(counts.weights, counts.n.copy(), counts.v.copy())
    padding = good.copy()
    padding[4, 1] |= 0b0000_0100  # bit 10: past category 9
    bad_reports = [padding, good[:, :1], good.astype(np.int64)]
    if spec.admissible:
        for weight_without_row in (np.zeros(2, np.uint8), np.array([0xFF, 0x03], np.uint8)):
            bad_reports.append(np.vstack([good, weight_without_row]))
    for bad in bad_reports:
        with pytest.raises(MechanismError):
            count_reports(spec, bad, out=counts)
    assert counts == before


def test_counts_of_another_design_are_refused():
    values = np.arange(5)
    with pytest.raises(MechanismError):
        simulate_counts(SubsetSpec(16, 1.0), values, out=Counts.zeros(SubsetSpec(16, 4.0)))
    with pytest.raises(MechanismError):
        count_reports(RapporSpec(8, 1.0), np.zeros((1, 1), np.uint8), out=Counts.zeros(RapporSpec(9, 1.0)))


def test_kernels_import_and_run_where_numba_cannot_cache():
    # A read-only install without NUMBA_CACHE_DIR: every cache locator fails. The kernels must
    # still import (compiling at each start), not take the aggregator down.
    import subprocess
    import sys

    code = (
        "import numba.core.caching as c\n"
        "def refuse(self):\n    raise OSError('read-only')\n"
        "c._CacheLocator.ensure_cache_path = refuse\n"
        "import numpy as np\n"
        "from veil.aggregator.simulate import FastKeystream, simulate_counts\n"
        "from veil.mechanism import SubsetSpec\n"
        "print(simulate_counts(SubsetSpec(8, 1.0), np.arange(8), keystream=FastKeystream(1)).total)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "8", out.stderr


@pytest.mark.parametrize("spec", [SubsetSpec(16, 1.0), SubsetSpec(64, 0.5), KrrSpec(5, 1.0)], ids=spec_id)
def test_subset_kernels_stop_at_the_last_complete_report_at_every_cut(spec):
    # The kernels on every prefix of a stream with many rejections: a report cut anywhere (in
    # its keep decision, a draw or a run of rejected words) is neither sent nor counted, and
    # the kernels say where the complete ones end, as the reference does.
    from veil.aggregator import _kernels

    values = true_values(spec, 12, seed=4)
    words = np.empty(12 * (spec.q + 2) * 3, np.uint32)
    ZeroSprinkled(6).fill(words)
    source = WordRandomSource(words)
    expected, ends = [], [0]
    for value in values:
        expected.append(spec.randomize(int(value), source))
        ends.append(source.position)
    assert ends[-1] < words.size
    args = (spec.k, spec.q, np.uint64(spec.keep_threshold))
    for cut in range(ends[-1] + 1):
        done = int(np.searchsorted(ends, cut, side="right")) - 1
        out = np.zeros((len(values), spec.q), np.uint32)
        assert _kernels.subset_reports(words[:cut], values, *args, out) == (done, ends[done])
        assert np.array_equal(out[:done], np.array(expected[:done], np.uint32).reshape(done, spec.q))
        counts = Counts.zeros(spec)
        assert _kernels.subset_counts(words[:cut], values, *args, counts.row_of_weight(), counts.n, counts.v) == (
            done,
            ends[done],
        )
        assert counts == reference_counts(spec, out[:done])
