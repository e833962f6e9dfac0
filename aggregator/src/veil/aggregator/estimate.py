"""Frequency estimates, with standard errors and intervals, from sufficient statistics.

Every estimator of veil.mechanism is linear per report: category j's estimate is the mean of
Y_j = alpha_t z_j + beta_t over the n reports, t a report's weight and z_j whether it holds j.
So the estimate, and the sample variance of the Y_j (hence an unbiased variance estimate of
the mean), follow exactly from the counts n_t and V_j^(t):

    sum Y_j   = sum_t alpha_t V_j^(t) + beta_t n_t
    sum Y_j^2 = sum_t (alpha_t + beta_t)^2 V_j^(t) + beta_t^2 (n_t - V_j^(t))
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from veil.mechanism import MechanismError, MechanismSpec

from .counts import Counts

__all__ = ["Estimate", "estimate", "project_to_simplex", "Z95"]

Z95 = NormalDist().inv_cdf(0.975)  # 1.95996...: the two-sided 95% normal quantile


@dataclass(frozen=True, eq=False)
class Estimate:
    """The estimate of a population distribution over k categories from n reports."""

    n: int
    estimator: str  # which linear unbiased estimator ("minimax" unless asked otherwise)
    estimate: np.ndarray  # unbiased; entries may fall outside [0, 1]
    stderr: np.ndarray  # estimated standard error of each entry
    lower: np.ndarray  # 95% interval
    upper: np.ndarray
    # The Euclidean projection of `estimate` onto the probability simplex: a distribution, but
    # biased. None unless asked for; never to be mistaken for the unbiased estimate.
    projection: np.ndarray | None = None


def estimate(spec: MechanismSpec, counts: Counts, *, estimator: str = "minimax",
             project: bool = False) -> Estimate:
    """The unbiased estimate of the distribution behind ``counts`` (reports of ``spec``)."""
    try:
        linear = spec.estimators()[estimator]
    except KeyError:
        raise MechanismError(
            f"The {spec.name} design has no {estimator!r} estimator; it has {', '.join(spec.estimators())}."
        ) from None
    if counts.weights != linear.weights or counts.k != spec.k:
        raise MechanismError(f"These counts were not made by the {spec.name} design with k = {spec.k}.")
    n = counts.total
    if n == 0:
        nan = np.full(spec.k, np.nan)
        return Estimate(0, estimator, nan, nan, nan, nan, nan.copy() if project else None)

    alpha = np.asarray(linear.alpha)
    beta = np.asarray(linear.beta)
    v = counts.v.astype(np.float64)
    n_t = counts.n.astype(np.float64)
    sum_y = alpha @ v + beta @ n_t
    sum_y2 = ((alpha + beta) ** 2 - beta**2) @ v + (beta**2) @ n_t
    mean = sum_y / n
    if n > 1:
        # Sample variance of the per-report contributions; clipped at 0 against cancellation.
        variance = np.maximum(sum_y2 - n * mean**2, 0.0) / (n - 1)
        stderr = np.sqrt(variance / n)
    else:
        stderr = np.full(spec.k, np.nan)
    return Estimate(
        n=n,
        estimator=estimator,
        estimate=mean,
        stderr=stderr,
        lower=mean - Z95 * stderr,
        upper=mean + Z95 * stderr,
        projection=project_to_simplex(mean) if project else None,
    )


def project_to_simplex(x: np.ndarray) -> np.ndarray:
    """The closest point (Euclidean) of the probability simplex to x: max(x - theta, 0) with
    theta chosen so the result sums to 1 (sort-based, exact in O(k log k))."""
    x = np.asarray(x, dtype=np.float64)
    u = np.sort(x)[::-1]
    excess = np.cumsum(u) - 1.0
    ranks = np.arange(1, x.size + 1)
    last = np.nonzero(u - excess / ranks > 0)[0][-1]
    theta = excess[last] / (last + 1)
    return np.maximum(x - theta, 0.0)
