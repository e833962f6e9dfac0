"""The discovery rounds on the aggregator's side (veil.aggregator.discovery, docs/math.md 10): the
support-counting kernel against a NumPy reference, which prefixes survive a round, the detection
floor, what a verification round reports and its selective intervals; and the benchmark's
vectorized reports against HashedSpec.randomize_prefix on the same words."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy.stats import binom
from veil_testing.benchlib import load_script

from veil.aggregator._kernels import decode_hashed
from veil.aggregator.counts import Counts
from veil.aggregator.discovery import (
    DEFAULT_SURVIVORS,
    FALSE_REPORT_RATE,
    count_hashed,
    detection_floor,
    discovered,
    first_round,
    next_round,
    selective_interval,
)
from veil.aggregator.estimate import Z95, Estimate, estimate
from veil.mechanism import (
    CODE_BYTES,
    MODULUS,
    REPORT_WORDS,
    ROUNDS,
    MechanismError,
    MetricSpec,
    SeededRandomSource,
    StringsRound,
    WordRandomSource,
    buckets_for,
    code_text,
    epsilon_to_gamma,
)


def random_reports(rng: np.random.Generator, count: int, buckets: int) -> np.ndarray:
    reports = np.empty((count, REPORT_WORDS), np.uint32)
    reports[:, : CODE_BYTES + 1] = rng.integers(0, MODULUS, (count, CODE_BYTES + 1))
    reports[:, CODE_BYTES + 1] = rng.integers(0, buckets, count)
    return reports


def reference_held(strings: StringsRound, reports: np.ndarray) -> np.ndarray:
    """(reports, candidates): whether each report holds each candidate, by the definition
    h(u) = (c + sum_i a_i u_i) mod P over the candidate's bytes, reduced once at the end (each
    term is below 2^39, the sum below 2^43: exact in int64), its bucket h mod g against the
    report's; no table of extensions, no running reduction (the kernel's shortcuts)."""
    candidates = np.array([list(c) for c in strings.candidates], np.int64).reshape(len(strings.candidates), -1)
    a = reports[:, : candidates.shape[1]].astype(np.int64)
    h = reports[:, CODE_BYTES].astype(np.int64)[:, None] + a @ candidates.T
    return (h % MODULUS) % strings.buckets == reports[:, CODE_BYTES + 1].astype(np.int64)[:, None]


# --- counting ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strings",
    [
        StringsRound("m", 0, 64, (b"",)),
        StringsRound("m", 4, 8, (b"\x00\x00\x00\x00", b"SIGS", b"\xff\xfe\x80\x01")),
        StringsRound("m", ROUNDS - 1, 64, (b"SIGBUS", b"\xff" * CODE_BYTES, bytes(CODE_BYTES), b"\x80abcde")),
    ],
    ids=["round0", "round4", "verification"],
)
def test_decode_hashed_counts_the_reports_each_candidate_hashes_into(strings):
    rng = np.random.default_rng(28)
    reports = random_reports(rng, 600, strings.buckets)
    reports[:3, : CODE_BYTES + 1] = MODULUS - 1  # the largest coefficients: sums near the top of int64's use
    spec = MetricSpec.strings_round(strings, 4.0)
    counts = Counts.zeros(spec.mechanism)
    assert count_hashed(spec, reports, counts) == -1
    assert counts.n.tolist() == [600]
    held = reference_held(strings, reports)
    assert counts.v[0].tolist() == held.sum(axis=0).tolist()
    # And the client's own definition, report by report.
    for i in range(20):
        assert (
            spec.mechanism.support([int(x) for x in reports[i]], strings.candidates) == np.flatnonzero(held[i]).tolist()
        )


def test_counts_add_up_over_batches():
    strings = StringsRound("m", 1, 16, (b"a", b"b"))
    spec = MetricSpec.strings_round(strings, 2.0)
    reports = random_reports(np.random.default_rng(3), 300, 16)
    whole, parts = Counts.zeros(spec.mechanism), Counts.zeros(spec.mechanism)
    count_hashed(spec, reports, whole)
    count_hashed(spec, reports[:100], parts)
    count_hashed(spec, reports[100:], parts)
    assert whole == parts


@pytest.mark.parametrize(
    ("column", "value"),
    [(0, MODULUS), (CODE_BYTES, MODULUS), (3, 0xFFFFFFFF), (CODE_BYTES + 1, 64), (CODE_BYTES + 1, 0xFFFFFFFF)],
)
def test_a_bad_report_is_named_and_nothing_is_counted_as_reports(column, value):
    strings = StringsRound("m", 2, 64, (b"ab",))
    spec = MetricSpec.strings_round(strings, 4.0)
    reports = random_reports(np.random.default_rng(1), 50, 64)
    reports[37, column] = value
    counts = Counts.zeros(spec.mechanism)
    assert count_hashed(spec, reports, counts) == 37
    assert counts.n.tolist() == [0]
    parents = np.frombuffer(b"ab", np.uint8).reshape(1, 2)
    assert decode_hashed(reports, parents, True, MODULUS, 64, np.zeros(256, np.int64)) == 37


def test_count_hashed_refuses_a_spec_that_is_not_a_strings_round():
    spec = MetricSpec.create("plain", ["a", "b"], "krr", 1.0)
    with pytest.raises(MechanismError):
        count_hashed(spec, np.zeros((1, REPORT_WORDS), np.uint32), Counts.zeros(spec.mechanism))


# --- survivors -----------------------------------------------------------------------------------


def fixed_estimate(values: list[float], n: int = 1000) -> Estimate:
    x = np.array(values, dtype=np.float64)
    return Estimate(n, "minimax", x, np.full(x.size, 0.01), x - 0.02, x + 0.02)


def test_next_round_keeps_the_best_above_zero_ties_in_candidate_order():
    strings = StringsRound("m", 2, 16, (b"ab", b"cd"))
    spec = MetricSpec.strings_round(strings, 4.0)
    values = [0.0] * spec.k
    values[5] = 0.3
    values[300] = 0.1  # candidate 300 = b"cd" + 44
    values[7] = 0.1
    values[260] = 0.1
    values[9] = 0.05
    values[10] = -0.2
    values[11] = math.nan
    following = next_round(spec, fixed_estimate(values), keep=3)
    assert following is not None
    assert (following.round, following.buckets, following.metric) == (3, 16, "m")
    # The best (0.3), then the ties at 0.1 in candidate order: 7 and 260 (300 comes later).
    assert set(following.parents) == {strings.candidates[5], strings.candidates[7], strings.candidates[260]}
    # Fewer above zero than keep: all of them, never a candidate at zero or below, never NaN.
    following = next_round(spec, fixed_estimate(values), keep=DEFAULT_SURVIVORS)
    assert following is not None
    assert set(following.parents) == {strings.candidates[i] for i in (5, 7, 260, 300, 9)}


def test_next_round_stops_after_verification_with_nothing_above_zero_or_no_reports():
    strings = StringsRound("m", 2, 16, (b"ab",))
    spec = MetricSpec.strings_round(strings, 4.0)
    assert next_round(spec, fixed_estimate([0.0] * 255 + [-0.1])) is None
    assert next_round(spec, fixed_estimate([0.1] * 256, n=0)) is None
    last = StringsRound("m", ROUNDS - 2, 16, (b"abcdefg"[: ROUNDS - 2],))
    following = next_round(MetricSpec.strings_round(last, 4.0), fixed_estimate([0.1] * 256))
    assert following is not None and following.verification and len(following.candidates) == 32
    verification = MetricSpec.strings_round(following, 4.0)
    assert next_round(verification, fixed_estimate([0.1] * 32)) is None


def test_first_round_extends_the_empty_prefix():
    assert first_round("m", 64) == StringsRound("m", 0, 64, (b"",))


# --- the floor and what is reported --------------------------------------------------------------


def verification(codes: int = 12, epsilon: float = 4.0, buckets: int = 64) -> MetricSpec:
    parents = tuple(bytes([i]) * CODE_BYTES for i in range(codes))
    return MetricSpec.strings_round(StringsRound("m", ROUNDS - 1, buckets, parents), epsilon)


@pytest.mark.parametrize("epsilon", [1.0, 4.0, 8.0])
def test_detection_floor_is_the_share_of_the_count_a_value_nobody_holds_reaches_with_chance_005_over_k(epsilon):
    spec = verification(32, epsilon, buckets_for(epsilon_to_gamma(epsilon)))
    hashed = spec.mechanism
    b = hashed.other_probability
    alpha, beta = hashed.estimator.alpha[0], hashed.estimator.beta[0]
    for n, c in ((1000, 1), (111_111, 1), (111_111, 3)):
        devices = n // c
        count = int(binom.isf(0.05 / 32, devices, b)) + 1  # the smallest count with P(X >= count) <= 0.05/k
        assert binom.sf(count - 1, devices, b) <= 0.05 / 32 < binom.sf(count - 2, devices, b)
        assert detection_floor(spec, n, c) == pytest.approx((c * count * alpha + beta * n) / n, rel=1e-12)
    # Where the count is large it is the normal floor, z standard errors of a share of zero, within a count.
    p = hashed.gamma / (hashed.gamma + hashed.buckets - 1)
    z = NormalDist().inv_cdf(1 - 0.05 / 32)
    n = 111_111
    normal = z * math.sqrt(b * (1 - b) / (p - b) ** 2 / n)
    if epsilon < 8.0:  # at epsilon 8 b is tiny: a count of a few dozen, far from normal
        assert detection_floor(spec, n) == pytest.approx(normal, rel=0.03)
    assert math.isnan(detection_floor(spec, 0))
    assert FALSE_REPORT_RATE == 0.05


def test_at_a_high_epsilon_the_floor_is_a_count_of_a_few_not_a_normal_tail():
    """Epsilon 8 and 700 answers: a value nobody holds shows up in a report 1 time in 4096, so two
    chance counts already make a share of about 0.6%, and happen in about 1% of candidates: the
    normal floor would report such a value in about a third of runs over 32 candidates."""
    spec = verification(32, 8.0, 4096)
    n = 700
    floor = detection_floor(spec, n)
    count = round((floor * n - spec.mechanism.estimator.beta[0] * n) / spec.mechanism.estimator.alpha[0])
    b = spec.mechanism.other_probability
    assert count >= 3 and 32 * binom.sf(count - 1, n, b) <= 0.05
    z = NormalDist().inv_cdf(1 - 0.05 / 32)
    p = spec.mechanism.keep_probability
    assert floor > z * math.sqrt(b * (1 - b) / (p - b) ** 2 / n)


def test_discovered_reports_only_values_above_the_floor_largest_first():
    spec = verification(12)
    n = 20_000
    floor = detection_floor(spec, n)
    values = [0.0] * 12
    values[3] = 3 * floor
    values[7] = 10 * floor
    values[1] = floor * 1.2
    values[4] = floor * 1.0001
    values[2] = floor  # at the floor: the share of the count that reaches it, reported
    values[5] = floor * 0.9
    values[9] = -floor
    x = np.array(values)
    found = discovered(spec, Estimate(n, "minimax", x, np.full(12, 0.001), x, x))
    assert found.floor == floor and found.n == n and found.candidates == 12 and found.metric == "m"
    assert [v.code for v in found.values] == [bytes([i]) * CODE_BYTES for i in (7, 3, 1, 4, 2)]
    for value in found.values:
        assert value.text == code_text(value.code)
        assert value.stderr == 0.001  # the estimate's, as served
        assert 0.0 <= value.lower <= value.upper <= 1.0
    assert all(v.lower <= v.estimate <= v.upper for v in found.values)
    assert found.values[2].lower == 0.0  # 1.2 floors: the selection cannot rule out a share of 0
    # Just above the floor no share in [0, 1] puts the estimate above the lower 2.5% of its law
    # given selection (the solved upper end is below 0): the interval is widened to hold the
    # estimate, [0, estimate], which can only add coverage.
    assert (found.values[3].lower, found.values[3].upper) == (0.0, found.values[3].estimate)
    with pytest.raises(MechanismError):
        discovered(MetricSpec.strings_round(first_round("m", 64), 4.0), fixed_estimate([0.0] * 256))


def test_discovered_from_counts_finds_the_planted_values():
    """Reports drawn by randomize_prefix: two frequent codes among ten are found, nothing else."""
    spec = verification(10, 8.0, 2048)
    source = SeededRandomSource(5)
    codes = spec.strings.candidates
    population = [codes[2]] * 1500 + [codes[6]] * 900 + [b"\x77" * CODE_BYTES] * 2600  # 30% and 18%, the rest another
    reports = np.array([spec.mechanism.randomize_prefix(code, source) for code in population], np.uint32)
    counts = Counts.zeros(spec.mechanism)
    assert count_hashed(spec, reports, counts) == -1
    found = discovered(spec, estimate(spec.mechanism, counts))
    assert [v.code for v in found.values] == [codes[2], codes[6]]
    assert found.values[0].lower <= 0.3 <= found.values[0].upper
    assert found.values[1].lower <= 0.18 <= found.values[1].upper


# --- selective intervals -------------------------------------------------------------------------


def test_far_above_the_floor_the_selective_interval_is_the_normal_one():
    sigma = 0.001
    lower, upper = selective_interval(0.05, 0.003, lambda theta: sigma)
    assert lower == pytest.approx(0.05 - Z95 * sigma, abs=1e-9)
    assert upper == pytest.approx(0.05 + Z95 * sigma, abs=1e-9)


def test_near_the_floor_the_lower_end_reaches_zero():
    sigma = 0.001
    floor = 3 * sigma
    lower, upper = selective_interval(floor + 0.1 * sigma, floor, lambda theta: sigma)
    assert lower == 0.0
    assert upper > floor + 0.1 * sigma
    # The usual interval would have excluded 0 (x is 3.1 sigma above it).
    assert floor + 0.1 * sigma - Z95 * sigma > 0


def test_the_selective_interval_moves_up_with_the_estimate():
    floor = 0.0025
    spec = verification(32)
    _, _, a, b = spec.mechanism.estimator.moments(spec.mechanism.weight_law())
    n = 111_111

    def sigma(theta: float) -> float:
        return math.sqrt(max((b + (a - b) * theta - theta * theta) / n, 1e-300))

    ends = [selective_interval(x, floor, sigma) for x in np.linspace(floor * 1.0001, 0.02, 60)]
    lowers, uppers = zip(*ends)
    assert all(lo <= hi for lo, hi in ends)
    assert all(a <= b + 1e-12 for a, b in zip(lowers, lowers[1:]))
    assert all(a <= b + 1e-12 for a, b in zip(uppers, uppers[1:]))
    assert lowers[0] == 0.0 and lowers[-1] > 0.0


def test_the_selective_interval_has_its_coverage_under_selection():
    """Draws of X ~ N(theta, sigma) kept when X > floor: the interval holds theta at least 95% of
    the time (within 4 binomial sds), for theta below, at and above the floor, and at 0; no more
    than 97.5% (an interval widened just above the floor to hold its estimate adds the rest)."""
    rng = np.random.default_rng(10)
    sigma, floor = 0.001, 0.003
    for theta in (0.0, 0.0015, 0.003, 0.005):
        xs = rng.normal(theta, sigma, 2_000_000)
        xs = xs[xs > floor][:1500]
        held = [lo <= theta <= hi for lo, hi in (selective_interval(x, floor, lambda t: sigma) for x in xs)]
        # At theta = 0, the end of the shares' range, the interval cannot miss from below: 97.5%.
        target = 0.975 if theta == 0.0 else 0.95
        slack = 4 * math.sqrt(target * (1 - target) / len(held))
        assert target - slack <= np.mean(held) <= 0.975 + slack, (theta, np.mean(held))


# --- the benchmark's reports are randomize_prefix's ----------------------------------------------


@pytest.mark.parametrize(("epsilon", "length"), [(4.0, 1), (2.0, 5), (8.0, CODE_BYTES)])
def test_the_vectorized_reports_are_randomize_prefix_on_the_same_words(epsilon, length):
    bench = load_script("bench_discovery")
    hashed = MetricSpec.strings_round(first_round("m", buckets_for(epsilon_to_gamma(epsilon))), epsilon).mechanism
    rng = np.random.default_rng(length)
    count = 3000
    prefixes = rng.integers(0, 256, (count, length), dtype=np.uint8)
    words = rng.integers(0, 1 << 32, (count, bench.ROW_WORDS), dtype=np.uint32)
    # Words Lemire's rule rejects, in a coefficient's place and in the other bucket's, and a
    # keep decision on each side of the threshold: the rows taken by the scalar path and the edges.
    words[0, 3] = 0
    keep = CODE_BYTES + 1  # the words after the coefficients: keep's two, then the other bucket's
    words[1, keep : keep + 3] = [0xFFFFFFFF, 0xFFFFFFFF, 0]
    t = hashed.keep_threshold
    words[2, keep : keep + 2] = [(t - 1) >> 32, (t - 1) & 0xFFFFFFFF]
    words[3, keep : keep + 2] = [t >> 32, t & 0xFFFFFFFF]
    reports = bench.draw_reports(hashed, prefixes, words)
    for i in range(count):
        expected = hashed.randomize_prefix(prefixes[i].tobytes(), WordRandomSource(words[i].tolist()))
        assert tuple(int(x) for x in reports[i]) == expected, i
