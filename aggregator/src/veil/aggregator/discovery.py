"""Discovery rounds of a strings metric: which prefixes go on, and what was found (docs/math.md 10).

A round's estimates are those of any design (veil.aggregator.estimate over its candidates); this
module decides what follows from them:

- ``next_round``: the prefixes that survive a round are its candidates with the ``keep`` largest
  estimates above zero (ties in candidate order). No test is made here: a prefix only needs to
  rank, and a wrong survivor costs one parent's worth of candidates in the next round, while a
  floor would lose true values to noise in every one of the six rounds that extend prefixes.
- ``discovered``: the verification round's candidates were chosen by other devices, so its
  estimates carry no selection bias and their intervals are those of a declared category. A code
  is reported when its estimate reaches the detection floor, the share of the smallest count
  that a candidate nobody holds reaches with probability at most 0.05 / k (Bonferroni over the
  k candidates; the count binomial): with no frequent value among them, all k stay below it
  together with probability at least 95%.
  A value is reported because its estimate cleared the floor, so its interval is the selective
  one (Fithian, Sun and Taylor 2014; Lee et al. 2016): the shares theta at which the estimate
  is within the middle 95% of its law given that it cleared the floor, the normal law with the
  design's variance at theta truncated at the floor. Far above the floor it is the usual
  interval; near it, it reaches down to what the selection cannot rule out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from veil.mechanism import DEFAULT_SURVIVORS, MODULUS, HashedSpec, MechanismError, MetricSpec, StringsRound, code_text

from ._kernels import decode_hashed
from .counts import Counts
from .estimate import Estimate

__all__ = [
    "FALSE_REPORT_RATE",
    "DiscoveredValue",
    "Discovery",
    "first_round",
    "next_round",
    "detection_floor",
    "binomial_threshold",
    "discovered",
    "selective_interval",
    "count_hashed",
]

FALSE_REPORT_RATE = 0.05  # the chance that a round with no frequent value reports any


def first_round(metric: str, buckets: int) -> StringsRound:
    """Round 0: the first byte of every code, as the extension of the empty prefix."""
    return StringsRound(metric, 0, buckets, (b"",))


def next_round(spec: MetricSpec, estimate: Estimate, keep: int = DEFAULT_SURVIVORS) -> StringsRound | None:
    """The round after ``spec``'s, extending its ``keep`` best candidates; None after the
    verification round, or when no candidate's estimate is above zero (nothing to extend)."""
    strings = _strings(spec)
    if strings.verification or estimate.n == 0:
        return None
    order = np.argsort(-np.nan_to_num(estimate.estimate, nan=-math.inf), kind="stable")[:keep]
    survivors = tuple(strings.candidates[i] for i in order if estimate.estimate[i] > 0.0)
    if not survivors:
        return None
    return StringsRound(strings.metric, strings.round + 1, strings.buckets, survivors)


def detection_floor(spec: MetricSpec, n: int, reports_per_device: int = 1) -> float:
    """The share below which the verification round reports nothing: the estimate of the
    smallest count that a candidate nobody holds reaches with probability at most 0.05 / k.
    Such a candidate's count is binomial (n / c independent answers, each holding it with
    probability b; c = reports_per_device), counted exactly: at a high epsilon b is tiny and a
    count of two is already a large share, where a normal tail would call it rare when it is not."""
    if n <= 0:
        return math.nan
    design = spec.mechanism
    assert isinstance(design, HashedSpec)  # a strings round's (MetricSpec checks it)
    devices = max(n // reports_per_device, 1)
    count = reports_per_device * binomial_threshold(devices, design.other_probability, FALSE_REPORT_RATE / spec.k)
    linear = spec.mechanism.estimator
    return (count * linear.alpha[0] + linear.beta[0] * n) / n  # as estimate() computes a share from a count


def binomial_threshold(n: int, b: float, alpha: float) -> int:
    """The smallest c with P(X >= c) <= alpha for X binomial(n, b): the upper tail summed from
    far above the mean (40 standard deviations, where it is nothing) down."""
    sd = math.sqrt(n * b * (1.0 - b))
    top = min(n, math.ceil(n * b + 40.0 * sd + 40.0))
    log_b, log_rest = math.log(b), math.log1p(-b)
    tail = 0.0
    for c in range(top, -1, -1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(c + 1) - math.lgamma(n - c + 1) + c * log_b + (n - c) * log_rest
        tail += math.exp(log_pmf)
        if tail > alpha:
            return c + 1
    return 0


@dataclass(frozen=True)
class DiscoveredValue:
    """A code the verification round found above the floor, with its share."""

    code: bytes
    text: str  # code_text(code): the value itself when short, else "#" and the hash's hex
    estimate: float
    stderr: float
    lower: float
    upper: float


@dataclass(frozen=True)
class Discovery:
    """What a verification round found: the codes above its floor, largest share first."""

    metric: str
    n: int
    floor: float
    candidates: int
    values: tuple[DiscoveredValue, ...]


def discovered(spec: MetricSpec, estimate: Estimate) -> Discovery:
    """The codes of a verification round whose estimates exceed its detection floor."""
    strings = _strings(spec)
    if not strings.verification:
        raise MechanismError(f"{spec.name!r} is not a verification round.")
    floor = detection_floor(spec, estimate.n, estimate.reports_per_device)
    found = [i for i in range(spec.k) if estimate.n and estimate.estimate[i] >= floor]
    found.sort(key=lambda i: (-estimate.estimate[i], i))
    _, _, a, b = spec.mechanism.estimator.moments(spec.mechanism.weight_law())
    scale = estimate.reports_per_device / estimate.n if estimate.n else math.nan

    def sigma(theta: float) -> float:
        return math.sqrt(max(scale * (b + (a - b) * theta - theta * theta), 1e-300))

    values = []
    for i in found:
        x = float(estimate.estimate[i])
        lower, upper = selective_interval(x, floor, sigma)
        code = strings.candidates[i]
        values.append(DiscoveredValue(code, code_text(code), x, float(estimate.stderr[i]), lower, upper))
    return Discovery(strings.metric, estimate.n, floor, spec.k, tuple(values))


def selective_interval(
    x: float, floor: float, sigma: Callable[[float], float], level: float = 0.95
) -> tuple[float, float]:
    """The shares theta in [0, 1] at which P(X >= x | X > floor) and P(X <= x | X > floor) are
    both at least (1 - level) / 2, X normal with mean theta and sd sigma(theta). The conditional
    CDF falls as theta grows, so each end is found by bisection."""
    tail = (1.0 - level) / 2.0

    def below(theta: float) -> float:  # P(X <= x | X > floor) under theta
        s = sigma(theta)
        beyond_floor = _survival((floor - theta) / s)
        if beyond_floor <= 0.0:
            return 0.0
        return 1.0 - _survival((x - theta) / s) / beyond_floor

    def solve(target: float) -> float:
        low, high = 0.0, 1.0
        if below(low) <= target:
            return 0.0
        if below(high) >= target:
            return 1.0
        for _ in range(60):
            middle = (low + high) / 2.0
            if below(middle) > target:
                low = middle
            else:
                high = middle
        return (low + high) / 2.0

    # Just above the floor no share in [0, 1] puts x below the upper tail (the solved upper end
    # would be negative, clipped to 0): the interval is widened to hold x, which costs no coverage.
    return solve(1.0 - tail), max(solve(tail), x)


def _survival(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def count_hashed(spec: MetricSpec, reports: np.ndarray, counts: Counts) -> int:
    """Add hashed reports (uint32, one row of REPORT_WORDS per report) into ``counts`` of the
    round ``spec``; returns the first malformed report's index, or -1 (nothing of a batch
    with a bad report should be kept: the caller counts into scratch counts)."""
    strings = _strings(spec)
    joined = np.frombuffer(b"".join(strings.parents), np.uint8)
    parents = joined.reshape(len(strings.parents), strings.parent_bytes)
    bad = decode_hashed(reports, parents, not strings.verification, MODULUS, strings.buckets, counts.v[0])
    if bad < 0:
        counts.n[0] += reports.shape[0]
    return int(bad)


def _strings(spec: MetricSpec) -> StringsRound:
    if spec.strings is None:
        raise MechanismError(f"{spec.name!r} is not a round of a strings metric.")
    return spec.strings
