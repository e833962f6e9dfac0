"""Mechanism specs and the q-subset family (subset, k-RR, Warner).

A spec is immutable: the number of categories k, the privacy level epsilon, and everything
derived from them. ``randomize`` turns one true category into one report on the device; a
report is always the sorted tuple of the categories it contains (a set: the order carries
nothing, and the true value is never first by construction).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from types import MappingProxyType
from typing import ClassVar

from ._epsilon import check_epsilon, epsilon_to_gamma
from ._errors import MechanismError
from ._law import LinearEstimator, WeightLaw
from ._random import RandomSource, SystemRandomSource, bernoulli, choose

__all__ = ["MechanismSpec", "SubsetSpec", "KrrSpec", "WarnerSpec", "subset_objective", "subset_gain", "minimax_q"]

ONE64 = 1 << 64  # thresholds are out of 2**64 (see _random)
_SYSTEM = SystemRandomSource()

Report = tuple[int, ...]


def subset_objective(k: int, gamma: float, x: float) -> float:
    """f(x) = k^2 (x gamma^2 + k - x) / (x gamma + k - x)^2 (docs/math.md 3.1, 003 ch. 6); the minimax
    q maximizes it, and the price of privacy of a q-subset design is (k-1)^2 / (f(q) - k).
    Near gamma = 1 it is k plus a sliver: take differences from subset_gain."""
    return k + subset_gain(k, gamma, x)


def subset_gain(k: int, gamma: float, x: float) -> float:
    """f(x) - k = k x (k - x) d^2 / (k + x d)^2 with d = gamma - 1, the same number without
    the cancellation of f(x) - k, which loses all digits as epsilon goes to 0. (d is exact:
    gamma - 1 of a float gamma in [1, 2] is a float.)"""
    d = gamma - 1.0
    return k * x * (k - x) * d * d / (k + x * d) ** 2


def minimax_q(k: int, gamma: float) -> int:
    """The minimax subset size, eq. 4.4 / 6.9: floor(k/(1+gamma)) when it is at least 1 and f
    is no smaller there than at the ceiling; otherwise the ceiling.

    Decided in exact arithmetic on the float gamma: floor and ceiling of a float division, and
    f at two neighbours, can each be off by a rounding error, and the two values of f differ
    by less than that near a tie and at small epsilon. f(x) - k is compared, as x (k-x) /
    (k + x d)^2, cross-multiplied."""
    g = Fraction(gamma)
    low = k * g.denominator // (g.numerator + g.denominator)  # floor(k / (1 + g))
    high = low if low * (1 + g) == k else low + 1
    d = g - 1
    if low >= 1 and low * (k - low) * (k + high * d) ** 2 >= high * (k - high) * (k + low * d) ** 2:
        return low
    return high


@dataclass(frozen=True)
class MechanismSpec:
    """Base of every spec: k categories (indices 0..k-1) and epsilon > 0."""

    k: int
    epsilon: float

    name: ClassVar[str]
    admissible: ClassVar[bool]  # every TPM row has parity gamma and two distinct values

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 2:
            raise MechanismError(f"k must be a whole number of categories of at least 2, not {self.k!r}.")
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @cached_property
    def gamma(self) -> float:
        """The privacy level gamma = e^epsilon, rounded down (epsilon_to_gamma): the largest
        likelihood ratio a report allows. Thresholds and estimators all derive from it."""
        return epsilon_to_gamma(self.epsilon)

    @property
    def q(self) -> int | None:
        """Categories per report for a q-subset design; None where reports vary in size."""
        return None

    def canonical(self) -> dict[str, object]:
        """The spec as plain data: what two parties must agree on to add reports together."""
        return {"mechanism": self.name, "k": self.k, "epsilon": self.epsilon}

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_of(self.canonical())

    def check_value(self, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.k:
            raise MechanismError(f"A true value must be a category index from 0 to {self.k - 1}.")
        return value

    # --- what subclasses define ---------------------------------------------------------

    @property
    def outputs(self) -> int:
        """The number of distinct reports the mechanism can send."""
        raise NotImplementedError

    @property
    def parity(self) -> float:
        """The largest likelihood ratio of any report between two true values, as randomized
        (integer thresholds included); at most gamma."""
        raise NotImplementedError

    def randomize(self, value: int, source: RandomSource = _SYSTEM) -> Report:
        """One randomized report of the true category ``value``. The value itself is private:
        it exists only inside this call and is never stored or sent."""
        raise NotImplementedError

    def probability(self, report: Report, value: int) -> Fraction:
        """P(report | true value), as randomized (integer thresholds included), exactly: one
        entry of the transition matrix."""
        raise NotImplementedError

    def output_space(self) -> Iterator[Report]:
        """Every report the mechanism can send, in a fixed order."""
        raise NotImplementedError

    def _build_weight_law(self) -> WeightLaw:
        raise NotImplementedError

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        raise NotImplementedError

    # --- shared calculus ----------------------------------------------------------------

    @cached_property
    def _weight_law(self) -> WeightLaw:
        return self._build_weight_law()

    @cached_property
    def _estimators(self) -> Mapping[str, LinearEstimator]:
        return MappingProxyType(self._build_estimators())

    def weight_law(self) -> WeightLaw:
        """The distribution of report weights and memberships (computed once per spec)."""
        return self._weight_law

    def estimators(self) -> Mapping[str, LinearEstimator]:
        """The linear unbiased estimators of this design, the minimax one first."""
        return self._estimators

    @property
    def estimator(self) -> LinearEstimator:
        """The minimax linear unbiased estimator."""
        return self.estimators()["minimax"]

    def variances(self, pi: Sequence[float], estimator: LinearEstimator | None = None) -> list[float]:
        """n * Var(pi_hat_j) per category, exactly, under the population distribution pi."""
        if len(pi) != self.k:
            raise MechanismError(f"A distribution of this metric needs {self.k} shares, not {len(pi)}.")
        return (estimator or self.estimator).variances(self.weight_law(), pi)

    def risk(self, pi: Sequence[float], estimator: LinearEstimator | None = None) -> float:
        """n * (sum of the estimator's variances), the risk of docs/math.md 4, under pi."""
        return math.fsum(self.variances(pi, estimator))

    def risk_uniform(self, estimator: LinearEstimator | None = None) -> float:
        return self.risk([1.0 / self.k] * self.k, estimator)

    def risk_worst(self, estimator: LinearEstimator | None = None) -> float:
        """The largest n * risk over all distributions. Every design here treats categories
        alike, so n * risk = A + (k-1) B - sum pi_j^2 (see LinearEstimator.variances) and the
        worst case is where sum pi_j^2 is smallest: the uniform distribution."""
        return self.risk_uniform(estimator)


def fingerprint_of(canonical: dict[str, object]) -> str:
    """A short hex digest of canonical JSON (sorted keys, no spaces, floats by repr)."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SubsetSpec(MechanismSpec):
    """The q-subset design with the minimax q (docs/math.md 3.1, 4.1; 003 ch. 6-7, 000 sec. 4.2).

    The true category j is kept with probability p = q gamma / (q gamma + k - q); the report
    then holds j and q-1 of the other k-1 categories, or q of them without j, chosen uniformly.
    A report containing j thus has probability p / C(k-1, q-1), one without it
    (1-p) / C(k-1, q), and their ratio is p (k-q) / ((1-p) q) = gamma.
    """

    name: ClassVar[str] = "subset"
    admissible: ClassVar[bool] = True

    @cached_property
    def q(self) -> int:
        return minimax_q(self.k, self.gamma)

    @cached_property
    def keep_threshold(self) -> int:
        """floor(2**64 p), computed exactly from the float gamma: rounding p down can only
        lower the realized ratio p (k-q) / ((1-p) q) below gamma, never raise it."""
        g, q, k = Fraction(self.gamma), self.q, self.k
        return math.floor(ONE64 * q * g / (q * g + k - q))

    @property
    def keep_probability(self) -> float:
        return self.keep_threshold / ONE64

    @property
    def outputs(self) -> int:
        return math.comb(self.k, self.q)

    @property
    def parity(self) -> float:
        t, k, q = self.keep_threshold, self.k, self.q
        return float(Fraction(t * (k - q), (ONE64 - t) * q))

    def randomize(self, value: int, source: RandomSource = _SYSTEM) -> Report:
        value = self.check_value(value)
        keep = bernoulli(source, self.keep_threshold)
        # Indices 0..k-2 stand for the other categories; i >= value shifts past the true one.
        others = choose(source, self.k - 1, self.q - 1 if keep else self.q)
        report = [i + (i >= value) for i in others]
        if keep:
            report.append(value)
        return tuple(sorted(report))

    def probability(self, report: Report, value: int) -> Fraction:
        if len(report) != self.q or len(set(report)) != self.q:
            return Fraction(0)
        keep = Fraction(self.keep_threshold, ONE64)
        if value in report:
            return keep / math.comb(self.k - 1, self.q - 1)
        return (1 - keep) / math.comb(self.k - 1, self.q)

    def output_space(self) -> Iterator[Report]:
        return itertools.combinations(range(self.k), self.q)

    def _ideal_keep(self) -> float:
        g, q, k = self.gamma, self.q, self.k
        return q * g / (q * g + k - q)

    def _build_weight_law(self) -> WeightLaw:
        k, q, p = self.k, self.q, self._ideal_keep()
        # Another category is in the report when it is among the q-1 (kept) or q (not kept)
        # drawn from the k-1 others.
        other = (p * (q - 1) + (1.0 - p) * q) / (k - 1)
        return WeightLaw((q,), (1.0,), (p,), (other,))

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        # pi_j = c V_j / n + d (docs/math.md 4.1; 000 eq. 4.5, 003 eq. 7.2), in e = gamma - 1:
        # d = ((1-k)(q gamma + k - q) / (e (k-q)) + 1) / k, summed over one denominator so that no
        # two large terms cancel.
        e, q, k = self.gamma - 1.0, self.q, self.k
        c = (k - 1) * (k + q * e) / (q * e * (k - q))
        d = -((k - 1) + e * (q - 1)) / (e * (k - q))
        return {"minimax": LinearEstimator("minimax", (q,), (c,), (d,))}


@dataclass(frozen=True)
class KrrSpec(SubsetSpec):
    """k-ary randomized response, the gamma-diagonal design: the q-subset design with q = 1,
    keeping the true category with probability gamma / (gamma + k - 1) (003 sec. 6.1)."""

    name: ClassVar[str] = "krr"

    @cached_property
    def q(self) -> int:
        return 1


@dataclass(frozen=True)
class WarnerSpec(KrrSpec):
    """Warner's design for a binary attribute: k = 2, the truth kept with probability
    gamma / (1 + gamma) (000 Thm 4.2; 002 scheme 1 with p = 1 / (1 + gamma))."""

    name: ClassVar[str] = "warner"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k != 2:
            raise MechanismError(f"Warner's design is for two categories, not {self.k}.")
