"""Basic RAPPOR and admissible RAPPOR (docs/math.md, 3.3-3.4 and 4.2; 003 sec. 7.2).

The one-hot vector of the true category has every bit flipped independently with probability
f = 1 / (sqrt(gamma) + 1). Two true values i != j differ in bits i and j only, so a report's
likelihood ratio is at most ((1 - f) / f)^2 = gamma. Given its number of ones t, a report is
a t-subset design, so RAPPOR is a mixture of them with weights p_t; its minimax estimator uses
per-weight counts (docs/math.md, 4.2, from 003 eq. 7.11).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

from ._law import LinearEstimator, WeightLaw, binomial_pmf
from ._random import RandomSource, bernoulli
from ._specs import _SYSTEM, ONE64, MechanismSpec, Report, subset_gain

__all__ = ["RapporSpec", "AdmissibleRapporSpec"]


@dataclass(frozen=True)
class RapporSpec(MechanismSpec):
    """Basic RAPPOR: not admissible, since its all-zeros and all-ones reports are equally
    likely under every true value and so carry no information."""

    name: ClassVar[str] = "rappor"
    admissible: ClassVar[bool] = False

    @cached_property
    def flip_threshold(self) -> int:
        """ceil(2**64 f), with f bounded from above exactly: a larger f can only lower the
        realized ratio ((1-f)/f)^2 below gamma. sqrt(gamma) >= r / 2**64 with
        r = isqrt(floor(gamma * 2**128)), so f <= 2**64 / (r + 2**64)."""
        r = math.isqrt(math.floor(Fraction(self.gamma) * ONE64 * ONE64))
        return -(-ONE64 * ONE64 // (r + ONE64))

    @property
    def outputs(self) -> int:
        return 1 << self.k

    @property
    def parity(self) -> float:
        t = self.flip_threshold
        return float(Fraction(ONE64 - t, t) ** 2)

    def _draw(self, value: int, source: RandomSource) -> list[int]:
        # Bit j is 1 when it differs from the one-hot bit (j == value) after a flip.
        return [j for j in range(self.k) if (j == value) != bernoulli(source, self.flip_threshold)]

    def randomize(self, value: int, source: RandomSource = _SYSTEM) -> Report:
        return tuple(self._draw(self.check_value(value), source))

    def _raw_probability(self, report: Report, value: int) -> Fraction:
        differ = len(report) - 1 if value in report else len(report) + 1
        f = Fraction(self.flip_threshold, ONE64)
        return f**differ * (1 - f) ** (self.k - differ)

    def probability(self, report: Report, value: int) -> Fraction:
        return self._raw_probability(report, value)

    def output_space(self) -> Iterator[Report]:
        for mask in range(2**self.k):
            yield tuple(j for j in range(self.k) if mask >> j & 1)

    def _ideal_flip(self) -> float:
        return 1.0 / (math.sqrt(self.gamma) + 1.0)

    def _full_law(self) -> WeightLaw:
        k, f = self.k, self._ideal_flip()
        weights = tuple(range(k + 1))
        # P(T = t): the true bit kept and t-1 of the other k-1 flipped on, or the true bit
        # flipped off and t of the others flipped on.
        p = tuple((1 - f) * binomial_pmf(k - 1, f, t - 1) + f * binomial_pmf(k - 1, f, t) for t in weights)
        one_true = tuple((1 - f) * binomial_pmf(k - 1, f, t - 1) for t in weights)
        # Bit j on under X = i != j: j flipped on, and bit i either kept (t-2 of the other
        # k-2 on) or flipped off (t-1 of them on).
        one_other = tuple(
            f * ((1 - f) * binomial_pmf(k - 2, f, t - 2) + f * binomial_pmf(k - 2, f, t - 1)) for t in weights
        )
        return WeightLaw(weights, p, one_true, one_other)

    def _build_weight_law(self) -> WeightLaw:
        return self._full_law()

    def _minimax(self, law: WeightLaw) -> LinearEstimator:
        # docs/math.md 4.2: pi_j = ((gamma-1) sum_t w(t) V_j^(t) + sum_t (w(t)-1) n_t) / (n a*) + 1/k with
        # w(t) = k / (t gamma + k - t), a_t = (f(t) - k) / (k - 1) (zero at t = 0 and t = k) and
        # a* = sum_t p_t a_t. In d = gamma - 1, without cancellation: w(t) = k / (k + t d),
        # w(t) - 1 = -t d / (k + t d), and f(t) - k is subset_gain.
        k, d = self.k, self.gamma - 1.0
        a = [0.0 if t in (0, k) else subset_gain(k, self.gamma, t) / (k - 1) for t in law.weights]
        a_star = math.fsum(p * at for p, at in zip(law.p, a))
        alpha = tuple(d * k / (k + t * d) / a_star for t in law.weights)
        beta = tuple(-t * d / (k + t * d) / a_star + 1 / k for t in law.weights)
        return LinearEstimator("minimax", law.weights, alpha, beta)

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        law = self.weight_law()
        # The empirical estimator (7.13) reads each bit on its own, whatever the weight:
        # c = (s+1)/(s-1) and -1/(s-1) with s = sqrt(gamma), s - 1 = (gamma-1)/(s+1) exactly.
        s = math.sqrt(self.gamma)
        s_minus_1 = (self.gamma - 1.0) / (s + 1.0)
        c, d = (s + 1) / s_minus_1, -1 / s_minus_1
        n = len(law.weights)
        empirical = LinearEstimator("empirical", law.weights, (c,) * n, (d,) * n)
        return {"minimax": self._minimax(law), "empirical": empirical}


@dataclass(frozen=True)
class AdmissibleRapporSpec(RapporSpec):
    """RAPPOR whose all-zeros and all-ones reports are redrawn on the device. Every remaining
    row has parity exactly gamma with two distinct values, so the design is admissible; given
    t in 1..k-1 it is the same t-subset design, with p_t renormalised (docs/math.md, 4.2)."""

    name: ClassVar[str] = "rappor-admissible"
    admissible: ClassVar[bool] = True

    @property
    def outputs(self) -> int:
        return (1 << self.k) - 2

    def randomize(self, value: int, source: RandomSource = _SYSTEM) -> Report:
        value = self.check_value(value)
        while True:
            report = self._draw(value, source)
            if 0 < len(report) < self.k:
                return tuple(report)

    def probability(self, report: Report, value: int) -> Fraction:
        if not 0 < len(report) < self.k:
            return Fraction(0)
        f, k = Fraction(self.flip_threshold, ONE64), self.k
        # The redrawn reports: all zeros (the true bit flipped, no other) and all ones.
        redrawn = f * (1 - f) ** (k - 1) + (1 - f) * f ** (k - 1)
        return self._raw_probability(report, value) / (1 - redrawn)

    def output_space(self) -> Iterator[Report]:
        return (r for r in super().output_space() if 0 < len(r) < self.k)

    def _build_weight_law(self) -> WeightLaw:
        full = self._full_law()
        kept = 1.0 - full.p[0] - full.p[-1]
        cut = slice(1, self.k)
        return WeightLaw(
            full.weights[cut],
            tuple(x / kept for x in full.p[cut]),
            tuple(x / kept for x in full.one_true[cut]),
            tuple(x / kept for x in full.one_other[cut]),
        )

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        # The empirical per-bit estimator is biased once reports are redrawn.
        return {"minimax": self._minimax(self.weight_law())}
