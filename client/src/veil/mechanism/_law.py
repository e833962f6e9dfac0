"""What the estimators and the risk calculus need to know about a design.

Every mechanism here is a mixture of t-subset designs (docs/math.md, 3): a report has some number t of
categories ("Hamming weight"), drawn with a probability p_t that does not depend on the true
value, and given t it is a t-subset design. Every estimator here is linear per report and per
weight: category j's estimate is the mean over reports of Y_j = alpha_t z_j + beta_t, where z_j
says whether the report contains j. So the sufficient statistics are n_t (reports of weight t)
and V_j^(t) (those among them containing j), and the variance of an estimator follows from
two numbers per weight, P(T = t, Z_j = 1) under X = j and under X != j.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import MechanismError

__all__ = ["WeightLaw", "LinearEstimator", "PROJECTION_NOTE"]

# What an estimate's "projected" numbers are, said wherever they are shown (HTTP JSON, the CLI).
PROJECTION_NOTE = "Euclidean projection of the estimate onto the probability simplex: a distribution, but biased."


@dataclass(frozen=True)
class WeightLaw:
    """The distribution of (report weight, membership of a category) under a design."""

    weights: tuple[int, ...]  # the weights t a report can have
    p: tuple[float, ...]  # P(T = t), the same under every true value
    one_true: tuple[float, ...]  # P(T = t, Z_j = 1 | X = j)
    one_other: tuple[float, ...]  # P(T = t, Z_j = 1 | X = i) for any i != j


@dataclass(frozen=True)
class LinearEstimator:
    """pi_hat_j = (1/n) sum_t (alpha_t V_j^(t) + beta_t n_t), over the weights of the law."""

    name: str
    weights: tuple[int, ...]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]

    @property
    def needs_weights(self) -> bool:
        """True when the coefficients differ between weights, so per-weight counts are needed;
        otherwise totals n and V_j suffice."""
        return len(set(self.alpha)) > 1 or len(set(self.beta)) > 1

    def moments(self, law: WeightLaw) -> tuple[float, float, float, float]:
        """(E[Y_j | X=j], E[Y_j | X!=j], E[Y_j^2 | X=j], E[Y_j^2 | X!=j]) for one report.
        An unbiased estimator has the first two equal to 1 and 0."""
        if law.weights != self.weights:
            raise MechanismError("The estimator and the weight law cover different weights.")
        mean_true = mean_other = square_true = square_other = 0.0
        for a, b, p, one_t, one_o in zip(self.alpha, self.beta, law.p, law.one_true, law.one_other):
            mean_true += a * one_t + b * p
            mean_other += a * one_o + b * p
            square_true += (a + b) ** 2 * one_t + b * b * (p - one_t)
            square_other += (a + b) ** 2 * one_o + b * b * (p - one_o)
        return mean_true, mean_other, square_true, square_other

    def group_moments(self, law: WeightLaw, k: int, g: int) -> tuple[float, float]:
        """(E[S^2 | X in G], E[S^2 | X not in G]) for one report, S = sum_{j in G} Y_j the
        report's contribution to the estimate of a group G of g of the k categories.

        Given its weight t, a report is a t-subset holding the true value x with probability
        one_true_t / p_t, its other members drawn uniformly from the k - 1 other categories. So
        M = |report & G| is a hypergeometric count (plus 1 when x is in G and in the report), and
        S = alpha_t M + g beta_t. By symmetry the two moments depend on G only through g, and
        n Var(sum_G pi_hat_j) = pi_G A + (1 - pi_G) B - pi_G^2: a single category's formula
        (g = 1 gives moments()'s A and B). With g = k no value lies outside G: B is A."""
        if not 1 <= g <= k:
            raise MechanismError(f"A group holds 1 to {k} categories, not {g}.")
        if law.weights != self.weights:
            raise MechanismError("The estimator and the weight law cover different weights.")
        inside = outside = 0.0
        for t, a, b, p, one in zip(self.weights, self.alpha, self.beta, law.p, law.one_true):
            c = g * b
            # x in G: the report holds x (and t - 1 others) or not (and t others), G has g - 1 others.
            if one > 0.0:
                inside += one * _square(a, c + a, t - 1, k - 1, g - 1)
            inside += (p - one) * _square(a, c, t, k - 1, g - 1)
            if g < k:  # x outside G: all g members of G are among the others
                if one > 0.0:
                    outside += one * _square(a, c, t - 1, k - 1, g)
                outside += (p - one) * _square(a, c, t, k - 1, g)
        return inside, (outside if g < k else inside)

    def variances(self, law: WeightLaw, pi: Sequence[float]) -> list[float]:
        """n * Var(pi_hat_j) for each category under the population distribution pi.

        Var(Y_j) = E[Y_j^2] - pi_j^2, and by symmetry E[Y_j^2] = pi_j A + (1 - pi_j) B with A
        and B the second moments under X = j and X != j."""
        _, _, a, b = self.moments(law)
        return [p * a + (1.0 - p) * b - p * p for p in pi]


def _square(a: float, c: float, m: int, size: int, good: int) -> float:
    """E[(a H + c)^2], H the members of a group of `good` among `size` categories in a uniform
    draw of m of them (hypergeometric)."""
    if m <= 0 or size <= 0:
        return c * c
    share = good / size
    mean = m * share
    variance = mean * (1.0 - share) * (size - m) / (size - 1) if size > 1 else 0.0
    return a * a * (variance + mean * mean) + 2.0 * a * c * mean + c * c


def binomial_pmf(m: int, p: float, s: int) -> float:
    """C(m, s) p^s (1-p)^(m-s), in logs so that large m neither overflows nor underflows."""
    if s < 0 or s > m:
        return 0.0
    log = math.lgamma(m + 1) - math.lgamma(s + 1) - math.lgamma(m - s + 1)
    return math.exp(log + s * math.log(p) + (m - s) * math.log1p(-p))
