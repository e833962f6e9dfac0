"""Frequency estimates, with standard errors and intervals, from sufficient statistics.

Every estimator of veil.mechanism is linear per report: category j's estimate is the mean of
Y_j = alpha_t z_j + beta_t over the n reports, t a report's weight and z_j whether it holds j:

    pi_hat_j = (1/n) sum_t (alpha_t V_j^(t) + beta_t n_t)

Its variance is the design's, known exactly as a function of the share pi_j alone
(veil.mechanism.LinearEstimator.variances): per report, s2(pi) = pi A + (1 - pi) B - pi^2, with
A and B the second moments of Y_j under X = j and X != j. Two things make the sample spread of
the Y_j the wrong yardstick in the field, and the design variance the right one:

- Small n: a category in no report (or in all) has zero sample spread, so a sample-based
  interval has width 0. The design variance never vanishes (B > 0 for every design here).
- Repeated reports: a device that sends m reports into one bucket, often the same memoized
  response, contributes a cluster of m correlated Y_j. With clusters of at most c reports,
  Var(sum Y_j) = sum over devices of Var(cluster sum) <= sum c_i^2 s2 <= c n s2, so
  c s2 / n bounds the variance of the mean, with equality when every device sends c identical
  responses (the memoized steady state). c is the bucket's reports_per_device.

The standard error is sqrt(c s2(pi~) / n) at pi~ = pi_hat clipped to [0, 1]. The 95% interval
is the score interval with a continuity correction: the shares pi whose distance from the
estimate, less half a step of the estimate's lattice, is at most z standard errors evaluated at
pi itself, (|pi_hat - pi| - delta)^2 <= z^2 c s2(pi) / n, a quadratic inequality in pi on each
side (Wilson's interval, for a design's variance). One report moves pi_hat by alpha_t / n, and a
device's c reports together by c alpha / n, so delta = c |alpha| / (2n) where every report moves
it by the same alpha (the q-subset designs; RAPPOR's steps differ by weight, and its lattice is
fine enough to need none). Without it the
interval keeps the score interval's dips at small counts: where a category's reports number
about one in expectation (k-RR, k = 1024, n = 1000) coverage fell to 92.3%, the Poisson score
interval's own dip at a mean of 1. It is clipped to [0, 1] (the truth is a share),
except when no share in [0, 1] satisfies it: then the data contradict the model and the interval
is shown as solved, outside [0, 1]. s2 is concave, so its value at any point of the interval is
at least its value at one of the interval's ends: the standard error is never below the design's
at a share the data cannot rule out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from veil.mechanism import LinearEstimator, MechanismError, MechanismSpec

from ._kernels import score_intervals, simplex_projections
from .counts import Counts

__all__ = [
    "Estimate",
    "GroupEstimate",
    "estimate",
    "estimate_many",
    "group_estimate",
    "rest_estimate",
    "project_to_simplex",
    "Z95",
]

Z95 = NormalDist().inv_cdf(0.975)  # 1.959964...: the two-sided 95% normal quantile


@dataclass(frozen=True, eq=False)
class Estimate:
    """The estimate of a population distribution over k categories from n reports."""

    n: int
    estimator: str  # which linear unbiased estimator ("minimax" unless asked otherwise)
    estimate: np.ndarray  # unbiased; entries may fall outside [0, 1]
    stderr: np.ndarray  # the design's standard error of each entry (see the module docstring)
    lower: np.ndarray  # 95% score interval
    upper: np.ndarray
    # The Euclidean projection of `estimate` onto the probability simplex: a distribution, but
    # biased. None unless asked for; never to be mistaken for the unbiased estimate.
    projection: np.ndarray | None = None
    reports_per_device: int = 1  # c: the most reports one device can have in these counts


def estimate(
    spec: MechanismSpec,
    counts: Counts,
    *,
    estimator: str = "minimax",
    project: bool = False,
    reports_per_device: int = 1,
) -> Estimate:
    """The unbiased estimate of the distribution behind ``counts`` (reports of ``spec``), with
    standard errors and intervals allowing for up to ``reports_per_device`` reports of one
    device among them (1: independent reports)."""
    return estimate_many(spec, [counts], estimator=estimator, project=project, reports_per_device=[reports_per_device])[
        0
    ]


def estimate_many(
    spec: MechanismSpec,
    counts: Sequence[Counts],
    *,
    estimator: str = "minimax",
    project: bool = False,
    reports_per_device: Sequence[int] | None = None,
) -> list[Estimate]:
    """estimate() of each of several counts of one design (e.g. the buckets of a series), the
    same numbers, computed over a (buckets, k) matrix at once: the per-bucket cost of a long
    series is then a few numpy passes, not a few dozen numpy calls. reports_per_device: one per
    counts (default 1 each). Each Estimate's arrays are rows of shared matrices: read-only."""
    try:
        linear = spec.estimators()[estimator]
    except KeyError:
        raise MechanismError(
            f"The {spec.name} design has no {estimator!r} estimator; it has {', '.join(spec.estimators())}."
        ) from None
    per_device = [1] * len(counts) if reports_per_device is None else list(reports_per_device)
    if len(per_device) != len(counts):
        raise MechanismError("estimate_many takes one reports_per_device per counts.")
    for per, each in zip(per_device, counts):
        if each.weights != linear.weights or each.k != spec.k:
            raise MechanismError(f"These counts were not made by the {spec.name} design with k = {spec.k}.")
        if isinstance(per, bool) or not isinstance(per, int) or per < 1:
            raise MechanismError(f"reports_per_device must be a whole number of at least 1, not {per!r}.")
    totals = [each.total for each in counts]
    found: list[Estimate | None] = [None] * len(counts)
    for i, total in enumerate(totals):
        if total == 0:
            nan = np.full(spec.k, np.nan)
            found[i] = Estimate(0, estimator, nan, nan, nan, nan, nan.copy() if project else None, per_device[i])
    rows = [i for i, n in enumerate(totals) if n]
    if not rows:
        return found  # type: ignore[return-value]

    alpha = np.asarray(linear.alpha)
    beta = np.asarray(linear.beta)
    n = np.array([totals[i] for i in rows], dtype=np.float64)[:, None]
    c = np.array([per_device[i] for i in rows], dtype=np.float64)[:, None]
    # alpha @ V per bucket: V has a row per report weight (RAPPOR: k + 1 of them), so the
    # buckets' V are never stacked into one (buckets, weights, k) array. The mean is made in
    # place in one (buckets, k) matrix: at k = 1024 each fresh matrix of a 720-bucket series is
    # 5.9 MB, whose pages cost more to get from the system than the arithmetic on them.
    mean = np.empty((len(rows), spec.k))
    if len(linear.weights) == 1:  # one row of V per bucket: the rows stacked, then one product
        stacked = np.empty((len(rows), spec.k), np.int64)
        for row, i in enumerate(rows):
            stacked[row] = counts[i].v[0]
        np.multiply(stacked, alpha[0], out=mean)
        mean += beta[0] * n  # n holds the one weight's count of each bucket
    else:
        for row, i in enumerate(rows):
            np.matmul(alpha, counts[i].v.astype(np.float64), out=mean[row])
        mean += np.array([beta @ counts[i].n.astype(np.float64) for i in rows])[:, None]
    mean /= n
    _, _, a, b = linear.moments(spec.weight_law())
    # Variance of the mean at share pi: scale * s2(pi), s2(pi) = b + (a - b) pi - pi^2.
    scale = c / n
    stderr, lower, upper = _score_interval(mean, _half_step(linear, c, n)[:, 0], scale[:, 0], a, b)
    projection = project_to_simplex(mean) if project else None
    for row, i in enumerate(rows):
        found[i] = Estimate(
            n=totals[i],
            estimator=estimator,
            estimate=mean[row],
            stderr=stderr[row],
            lower=lower[row],
            upper=upper[row],
            projection=None if projection is None else projection[row],
            reports_per_device=per_device[i],
        )
    return found  # type: ignore[return-value]


@dataclass(frozen=True)
class GroupEstimate:
    """The estimate of the share of a group of categories (their estimates added), with the
    design's standard error of that sum and its score interval, as for one category."""

    labels: tuple[str, ...]
    estimate: float
    stderr: float
    lower: float
    upper: float


def group_estimate(
    spec: MechanismSpec, e: Estimate, members: Sequence[int], labels: Sequence[str] = ()
) -> GroupEstimate:
    """The share of the categories ``members`` (indices, no repeats) from an estimate of
    ``spec``: sum_G pi_hat_j, whose per-report variance is s2_G(pi_G) = B_G + (A_G - B_G) pi_G
    - pi_G^2 with (A_G, B_G) = LinearEstimator.group_moments (the covariances of the categories
    included), so the standard error and the interval follow the single-category rules at the
    group's share, times sqrt(reports_per_device)."""
    members = sorted(set(members))
    if not members or members[0] < 0 or members[-1] >= spec.k:
        raise MechanismError(f"A group is a non-empty set of the {spec.k} categories.")
    if e.n == 0:
        return GroupEstimate(tuple(labels), math.nan, math.nan, math.nan, math.nan)
    linear = spec.estimators()[e.estimator]
    a, b = linear.group_moments(spec.weight_law(), spec.k, len(members))
    mean = np.array([[float(np.sum(e.estimate[members]))]])
    scale = e.reports_per_device / e.n
    # A report moves the sum by alpha_t times the group members it holds: the same lattice.
    delta = _half_step(linear, np.array([float(e.reports_per_device)]), np.array([float(e.n)]))
    stderr, lower, upper = _score_interval(mean, delta, np.array([scale]), a, b)
    return GroupEstimate(tuple(labels), float(mean[0, 0]), float(stderr[0, 0]), float(lower[0, 0]), float(upper[0, 0]))


def rest_estimate(spec: MechanismSpec, e: Estimate, top: int, labels: Sequence[str] = ()) -> GroupEstimate:
    """The share of every category outside the ``top`` largest estimates (the dashboard's
    "other"; labels: the spec's, to name them), indices in order.

    Its estimate and standard error are group_estimate's, but its interval allows for the group
    being chosen by the same data: the categories kept are those whose estimates came out high,
    so their summed estimate runs high and the rest's low (the winner's curse), and the interval
    of a fixed group then misses the rest's true share far more often than 5% (0% coverage at
    k = 128, epsilon = 1, n = 1000, where noise decides the top). Its lower end is the fixed
    group's (the choice only pushes the truth up from the estimate). Its upper end is also at
    least 1 - sum of the kept categories' lower bounds at z = Phi^-1(1 - 0.025 / k): together
    those hold for every category at once with probability >= 97.5% (Bonferroni), so for
    whichever categories were kept (exact binomial bounds where a design has one report weight
    and a category's reports are few). Where the top is clear the upper end moves out a little
    (the 5 smallest of 16 categories at epsilon = 4, n = 200,000: 0.113 to 0.135); where noise
    picks it, far: the interval says how little is known. Conservative, never short."""
    if not 0 <= top < spec.k:
        raise MechanismError(f"The rest of the top {top} of {spec.k} categories is not a group.")
    order = np.argsort(-e.estimate, kind="stable")
    kept, members = order[:top], np.sort(order[top:])
    chosen = [labels[j] for j in members.tolist()] if labels else ()
    plain = group_estimate(spec, e, members.tolist(), chosen)
    if e.n == 0 or top == 0:
        return plain
    level = 0.025 / spec.k
    linear = spec.estimators()[e.estimator]
    _, _, a, b = linear.moments(spec.weight_law())
    c, n = np.array([float(e.reports_per_device)]), np.array([float(e.n)])
    _, lower, _ = _score_interval(
        e.estimate[None, kept], _half_step(linear, c, n), c / n, a, b, NormalDist().inv_cdf(1.0 - level)
    )
    lower = lower[0]
    if len(linear.weights) == 1 and linear.alpha[0] > 0:
        # One weight: pi_hat_j = alpha V_j / n + beta, and V_j ~ Binomial(n, pi_j / alpha - beta /
        # alpha) (per device, c reports alike: V_j / c of n / c). The score bound, a normal
        # approximation, is far off this deep in the tail where a category's reports are few
        # (k-RR at k = 1024: two or so), and the kept ones are those whose counts spiked: there
        # the exact binomial bound is the one that holds.
        alpha, beta, per_device = linear.alpha[0], linear.beta[0], e.reports_per_device
        trials = math.ceil(e.n / per_device)
        for i, j in enumerate(kept.tolist()):
            hits = math.floor(round(e.n * (e.estimate[j] - beta) / alpha) / per_device)
            if hits <= _EXACT_HITS:
                lower[i] = alpha * _binomial_lower(hits, trials, level) + beta
    upper = min(1.0, 1.0 - float(np.sum(np.maximum(lower, 0.0))))
    return dataclasses.replace(plain, upper=max(plain.upper, upper))


_EXACT_HITS = 2000  # counts up to this get the exact binomial bound; above, the normal one is close


def _binomial_lower(hits: int, trials: int, level: float) -> float:
    """The exact (Clopper-Pearson) one-sided lower bound on p from `hits` of `trials`: the p at
    which P(X >= hits) = level, by bisection (0 for no hits)."""
    if hits <= 0:
        return 0.0
    i = np.arange(hits)  # P(X >= hits) = 1 - sum_{i < hits} C(trials, i) p^i (1 - p)^(trials - i)
    log_choose = np.concatenate([[0.0], np.cumsum(np.log((trials - i[1:] + 1) / i[1:]))])
    low, high = 0.0, hits / trials
    for _ in range(60):
        p = 0.5 * (low + high)
        below = float(np.exp(log_choose + i * math.log(p) + (trials - i) * math.log1p(-p)).sum())
        if 1.0 - below < level:
            low = p
        else:
            high = p
    return low


def _half_step(linear: LinearEstimator, c: np.ndarray, n: np.ndarray) -> np.ndarray:
    """delta, half a lattice step of the estimate from n reports, c per device, where every report
    moves it by the same step (one weight, or the same alpha for every weight); 0 with several
    steps: then the lattice is fine-grained and a correction of the largest step would only
    widen the interval."""
    if len(set(linear.alpha)) == 1:
        return c * abs(linear.alpha[0]) / (2.0 * n)
    return np.zeros_like(n)


def _score_interval(
    mean: np.ndarray, delta: np.ndarray, scale: np.ndarray, a: float, b: float, z: float = Z95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of each row i of mean (rows, k), with its half step delta[i] and variance scale[i]: the
    standard error sqrt(scale s2(pi~)) at the clipped share pi~, and the shares pi in [0, 1]
    with (|mean - pi| - delta)_+^2 <= w s2(pi), w = z^2 scale (z: Z95 unless asked): the union of three pieces, each
    an interval because its side's function is a convex quadratic: below mean - delta, the
    roots of (mean - delta - pi)^2 = w s2(pi), i.e. of (1 + w) pi^2 - (2 c + w (a - b)) pi +
    c^2 - w b = 0 at c = mean - delta (taken by the form that avoids cancellation); between
    mean - delta and mean + delta, all of it (s2 >= 0 on [0, 1]); above mean + delta, the roots
    at c = mean + delta. Where no share qualifies, the data contradict the design, and the
    interval is the clipped share's standard error either side, unclipped. One pass of a numba
    kernel (_kernels.score_intervals) over the matrix."""
    mean = np.ascontiguousarray(mean, dtype=np.float64)
    stderr, lower, upper = np.empty_like(mean), np.empty_like(mean), np.empty_like(mean)
    score_intervals(
        mean,
        np.ascontiguousarray(delta, dtype=np.float64),
        np.ascontiguousarray(scale, dtype=np.float64),
        float(a),
        float(b),
        z,
        stderr,
        lower,
        upper,
    )
    return stderr, lower, upper


def project_to_simplex(x: np.ndarray) -> np.ndarray:
    """The closest point (Euclidean) of the probability simplex to x, or to each row of a 2-D x:
    max(x - theta, 0) with theta chosen so the result sums to 1, found by dropping the entries at
    or below the mean excess (sum - 1) / count until none drops (Michelot's algorithm, exact; no
    sort). A numba kernel, _kernels.simplex_projections."""
    x = np.asarray(x, dtype=np.float64)
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    out = np.empty_like(rows)
    simplex_projections(rows, out)
    return out.reshape(x.shape)
