"""Estimates of a numeric metric's parts: the mean, and quantiles of the distribution.

A numeric metric's parts are metrics of categories (veil.mechanism.NumericSpec), counted and
estimated as any other; this module turns a part's category estimate into what it stands for
(docs/math.md 9):

- **mean**: the points' estimated shares pi_hat_j are unbiased, so sum_j x_j pi_hat_j is an
  unbiased estimate of the mean of the rounded values, which is the mean value (rounding is
  unbiased). It is the mean over reports of z_R = alpha x_R + beta sum_j x_j (the estimator's
  per-report coefficients), so its variance is estimated by the spread of z over the reports,
  never below the least the design allows (the variance of a device at the point where it is
  smallest), times the bucket's reports_per_device as for a category (estimate.py); the 95%
  interval is the estimate +- 1.96 standard errors, clipped to the range.
- **quantiles**: the share of values below boundary b_i is the sum of the buckets under it, a
  group of categories with its own score interval (estimate.group_estimate). The quantile
  lies at or above a boundary whose cumulative share is below q, and at or below one whose
  cumulative share is at least q. Its interval runs from the last boundary of the first run
  (from low up) whose intervals lie below q, to the first boundary of the last run (up to high)
  whose intervals lie at or above q (or the range's ends): it misses only when one of the two
  boundaries next to the quantile misses on one side, and it never claims more than the
  buckets can resolve. The point estimate interpolates linearly within the bucket where the
  cumulative shares of the projected (simplex) estimate cross q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from veil.mechanism import MEAN, MechanismError, MetricSpec, mean_variance

from .estimate import Z95, Estimate, group_estimate, project_to_simplex

__all__ = ["QUANTILES", "MeanEstimate", "QuantileEstimate", "mean_estimate", "quantile_estimates"]

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class MeanEstimate:
    """The mean of a numeric metric's values, in its units, with its 95% interval."""

    estimate: float
    stderr: float
    lower: float
    upper: float


@dataclass(frozen=True)
class QuantileEstimate:
    """The q-quantile of a numeric metric's values, with its 95% interval (bucket boundaries)."""

    q: float
    estimate: float
    lower: float
    upper: float


def mean_estimate(spec: MetricSpec, e: Estimate) -> MeanEstimate:
    """The mean from an estimate of a mean part's points (NaNs when there are no reports)."""
    numeric = spec.numeric
    if numeric is None or numeric.part != MEAN:
        raise MechanismError(f"Metric {spec.name!r} is not the mean part of a numeric metric.")
    if e.n == 0:
        return MeanEstimate(math.nan, math.nan, math.nan, math.nan)
    linear = spec.mechanism.estimators()[e.estimator]
    alpha, beta = linear.alpha[0], linear.beta[0]  # k-RR: one report weight
    steps = numeric.levels - 1
    units = np.arange(numeric.levels) / steps  # the points on the unit scale
    mean = float(units @ e.estimate)
    # Report frequencies of the points, from pi_hat_j = alpha V_j / n + beta.
    frequency = (e.estimate - beta) / alpha
    per_report = alpha * units + beta * float(units.sum())
    spread = float(frequency @ (per_report - mean) ** 2)
    least = min(mean_variance(spec.mechanism.epsilon, numeric.levels, j / steps) for j in range(numeric.levels))
    width = numeric.high - numeric.low
    stderr = width * math.sqrt(e.reports_per_device * max(spread, least) / e.n)
    value = numeric.low + width * mean
    return MeanEstimate(value, stderr, max(numeric.low, value - Z95 * stderr), min(numeric.high, value + Z95 * stderr))


def quantile_estimates(
    spec: MetricSpec, e: Estimate, quantiles: tuple[float, ...] = QUANTILES
) -> tuple[QuantileEstimate, ...]:
    """The quantiles from an estimate of a distribution part's buckets (none without reports)."""
    numeric = spec.numeric
    if numeric is None or numeric.part == MEAN:
        raise MechanismError(f"Metric {spec.name!r} is not the distribution part of a numeric metric.")
    if e.n == 0:
        return ()
    edges = numeric.edges
    # The share below each boundary b_1 .. b_m: the buckets 0 .. i - 1.
    below = [group_estimate(spec.mechanism, e, range(i)) for i in range(1, spec.k)]
    cumulative = np.concatenate([[0.0], np.cumsum(project_to_simplex(e.estimate))])
    cumulative[-1] = 1.0
    out = []
    for q in quantiles:
        # Only the first run from below (above) counts: the quantile then lies outside only if
        # the one boundary next to it misses (docs/math.md 9.5); the max (min) over all boundaries
        # would add every farther boundary's miss (87% coverage of q = 0.99 for a point mass at low).
        rise = next((i for i, g in enumerate(below) if g.upper >= q), len(below))
        fall = next((i for i in range(len(below) - 1, -1, -1) if below[i].lower < q), -1)
        lower, upper = edges[rise], edges[fall + 2]  # lower < upper: g.lower <= g.upper for each
        # The bucket i where the projected cumulative share reaches q: cumulative[i] < q <= cumulative[i + 1].
        i = min(int(np.searchsorted(cumulative, q, side="left")) - 1, spec.k - 1)
        i = max(i, 0)
        span = cumulative[i + 1] - cumulative[i]
        share = (q - cumulative[i]) / span if span > 0 else 0.5
        point = edges[i] + min(max(share, 0.0), 1.0) * (edges[i + 1] - edges[i])
        out.append(QuantileEstimate(q, float(min(max(point, lower), upper)), float(lower), float(upper)))
    return tuple(out)
