"""Numeric metrics: a number in a declared range, reported as a category of a derived design.

A numeric metric has up to two parts, each an ordinary metric on the wire (its own spec, named
``<metric>.mean`` or ``<metric>.distribution``), so counting, periods, the ledger, memoization
and exactly-once ingest are those of categories (docs/math.md 9):

- **mean**: the value's position in the range is rounded to one of ``levels`` equally spaced
  points, up or down at random so the rounded point is the value on average, and the point is
  reported with k-ary randomized response (KrrSpec over the points). The rounding is alpha-point
  rounding: a device's threshold ``alpha`` is drawn once (from its secret), so a value that
  stays put keeps its point and its memoized response, and spends no new epsilon. The mean of
  the points' estimated shares is an unbiased estimate of the mean. ``levels`` is chosen per
  epsilon to minimize the worst-case variance (mean_levels); its exact variance is
  mean_variance.
- **distribution**: the value's bucket among declared boundaries, reported with the metric's
  categorical design (the minimax q-subset by default); quantiles follow from the buckets'
  cumulative shares.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

from ._epsilon import epsilon_to_gamma
from ._errors import MechanismError

__all__ = [
    "MEAN",
    "DISTRIBUTION",
    "PARTS",
    "MAX_LEVELS",
    "NumericSpec",
    "part_name",
    "mean_levels",
    "mean_variance",
    "worst_mean_variance",
    "checked_number",
    "number_text",
    "DEFAULT_MEAN_SHARE",
    "numeric_parts",
]

MEAN = "mean"
DISTRIBUTION = "distribution"
PARTS = (MEAN, DISTRIBUTION)
# The most rounding points a mean part uses. Past about epsilon 12 more points would still cut
# the worst-case variance a little, but every point a device's value visits can cost a fresh
# response over its lifetime (docs/math.md 9.3), so the grid stays small.
MAX_LEVELS = 64
_MAX_BUCKETS = 1024


def part_name(metric: str, part: str) -> str:
    """The wire name of a numeric metric's part: ``<metric>.<part>``."""
    return f"{metric}.{part}"


def number_text(x: float) -> str:
    """A number as labels show it: the shortest repr, without a trailing ``.0``."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class NumericSpec:
    """What maps a number to a category of one part of a numeric metric (docs/protocol.md 9).

    metric: the name apps report under; part: MEAN or DISTRIBUTION; [low, high]: the range,
    values outside it are clipped to it; boundaries (DISTRIBUTION): the bucket boundaries,
    strictly increasing and strictly inside the range, bucket i holding [b_(i-1), b_i) (the first
    from low, the last up to high included); levels (MEAN): the number of rounding points,
    low + j (high - low) / (levels - 1) for j = 0 .. levels - 1."""

    metric: str
    part: str
    low: float
    high: float
    boundaries: tuple[float, ...] = ()
    levels: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise MechanismError("A numeric metric needs a non-empty name.")
        if self.part not in PARTS:
            raise MechanismError(f"A numeric metric's part is one of {', '.join(PARTS)}, not {self.part!r}.")
        low, high = _finite(self.low, "low"), _finite(self.high, "high")
        if not low < high or not math.isfinite(high - low):
            raise MechanismError(
                f"Numeric metric {self.metric!r} needs a range [low, high] with low < high "
                f"and a finite width, not [{self.low!r}, {self.high!r}]."
            )
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        boundaries = tuple(_finite(b, "boundary") for b in self.boundaries)
        object.__setattr__(self, "boundaries", boundaries)
        if self.part == MEAN:
            if boundaries:
                raise MechanismError(f"The mean of numeric metric {self.metric!r} takes no bucket boundaries.")
            if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not 2 <= self.levels <= MAX_LEVELS:
                raise MechanismError(f"A mean part needs 2 to {MAX_LEVELS} rounding points, not {self.levels!r}.")
        else:
            if self.levels != 0:
                raise MechanismError(f"The distribution of numeric metric {self.metric!r} takes no rounding points.")
            if not 1 <= len(boundaries) < _MAX_BUCKETS:
                raise MechanismError(
                    f"The distribution of numeric metric {self.metric!r} needs 1 to {_MAX_BUCKETS - 1} "
                    f"bucket boundaries, not {len(boundaries)}."
                )
            if any(not a < b for a, b in zip((low, *boundaries), (*boundaries, high))):
                raise MechanismError(
                    f"The bucket boundaries of numeric metric {self.metric!r} must increase strictly "
                    f"and lie strictly inside its range [{number_text(low)}, {number_text(high)}]."
                )
        labels = self.labels
        if len(set(labels)) != len(labels):
            raise MechanismError(
                f"Numeric metric {self.metric!r}: its points or buckets are too close together to tell apart."
            )

    @property
    def name(self) -> str:
        """The part's wire name."""
        return part_name(self.metric, self.part)

    @property
    def k(self) -> int:
        """The part's number of categories: rounding points, or buckets."""
        return self.levels if self.part == MEAN else len(self.boundaries) + 1

    @cached_property
    def points(self) -> tuple[float, ...]:
        """MEAN: the value each rounding point stands for."""
        steps = self.levels - 1
        return tuple(self.low + (self.high - self.low) * j / steps for j in range(self.levels))

    @cached_property
    def edges(self) -> tuple[float, ...]:
        """DISTRIBUTION: low, the boundaries, high."""
        return (self.low, *self.boundaries, self.high)

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """The part's category labels: each point's value, or each bucket as "[a, b)" (the last
        "[a, b]")."""
        if self.part == MEAN:
            return tuple(number_text(p) for p in self.points)
        edges = [number_text(e) for e in self.edges]
        last = len(edges) - 2
        return tuple(f"[{edges[i]}, {edges[i + 1]}{']' if i == last else ')'}" for i in range(last + 1))

    def canonical(self) -> dict[str, object]:
        """What the fingerprint covers (docs/protocol.md 1)."""
        return {
            "boundaries": list(self.boundaries),
            "high": self.high,
            "levels": self.levels,
            "low": self.low,
            "metric": self.metric,
            "part": self.part,
        }

    def clip(self, value: float) -> tuple[float, bool]:
        """The value within the range, and whether it had to be moved there. The caller refuses
        NaN and infinities first (they are misuse, not data)."""
        if value < self.low:
            return self.low, True
        if value > self.high:
            return self.high, True
        return value, False

    def category(self, value: float, alpha: float) -> int:
        """The category of a value already in the range (clip), for a device whose rounding
        threshold is alpha in [0, 1) (MEAN only; DISTRIBUTION ignores it).

        MEAN: t = (value - low) / (high - low) * (levels - 1), in that order, in doubles;
        j = min(floor(t), levels - 2); f = t - j; the point is j + 1 when f > alpha, else j. Over
        devices' alphas (uniform) it is j + 1 with probability f: the point is t on average.
        DISTRIBUTION: the number of boundaries at or below the value."""
        if self.part == MEAN:
            steps = self.levels - 1
            t = (value - self.low) / (self.high - self.low) * steps
            j = min(math.floor(t), steps - 1)
            return j + 1 if t - j > alpha else j
        return bisect.bisect_right(self.boundaries, value)  # boundaries increase strictly


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MechanismError(f"A numeric metric's {what} must be a finite number, not {value!r}.")
    return float(value)


# --- the mean part's variance (docs/math.md 9.2) ---------------------------------------------
#
# On the unit scale (u = position in the range, in [0, 1]; points s_j = j / G, G = levels - 1),
# k-RR over the G + 1 points keeps the point with p = gamma / (gamma + G) and sends each other
# point with r = 1 / (gamma + G). The estimate sum_j s_j pi_hat_j is the mean over reports of
# z = (s_R - r S1) / (p - r), S1 = sum_j s_j, whose variance is Var(s_R) / (p - r)^2.


def _krr_rates(epsilon: float, levels: int) -> tuple[float, float]:
    gamma = epsilon_to_gamma(epsilon)
    return gamma / (gamma + levels - 1), 1.0 / (gamma + levels - 1)


def mean_variance(epsilon: float, levels: int, u: float) -> float:
    """n * Var of the mean part's estimate for a device at position u in [0, 1] of the range, in
    units of the range's width squared (multiply by (high - low)^2): the exact variance of one
    report's contribution, alpha-point rounding included."""
    p, r = _krr_rates(epsilon, levels)
    steps = levels - 1
    s1, s2 = levels / 2.0, levels * (2 * steps + 1) / (6.0 * steps)  # sum of j / G and of its square
    j = min(math.floor(u * steps), steps - 1)
    f = u * steps - j
    rounded_second = u * u + f * (1.0 - f) / (steps * steps)
    # P(report = point i) = (p - r) P(rounded to i) + r, so E[s_R] = (p - r) u + r S1 and
    # E[s_R^2] = (p - r) E[s^2] + r S2; z = (s_R - r S1) / (p - r) has mean u.
    mean_s = (p - r) * u + r * s1
    second_s = (p - r) * rounded_second + r * s2
    return (second_s - mean_s * mean_s) / (p - r) ** 2


def worst_mean_variance(epsilon: float, levels: int) -> float:
    """The largest mean_variance over u in [0, 1]: on each segment between two points it is a
    concave quadratic in u, so its maximum is at an end or at the vertex, found exactly."""
    steps = levels - 1
    worst = 0.0
    for j in range(steps):
        a, b = j / steps, (j + 1) / steps
        candidates = [a, b]
        # Three values determine the quadratic: its vertex from them.
        m = 0.5 * (a + b)
        fa, fm, fb = (mean_variance(epsilon, levels, x) for x in (a, m, b))
        curvature = fa - 2.0 * fm + fb
        if curvature < 0.0:
            vertex = m + 0.5 * (b - a) * (fa - fb) / (2.0 * curvature)
            if a < vertex < b:
                candidates.append(vertex)
        worst = max(worst, *(mean_variance(epsilon, levels, x) for x in candidates))
    return worst


def mean_levels(epsilon: float) -> int:
    """The number of rounding points, 2 to MAX_LEVELS, whose worst-case variance is least at
    this epsilon (the fewest on a tie): 2 below about epsilon 1.3 (then the mean part is Duchi et
    al.'s one-bit design), more as epsilon grows (5 at epsilon 4)."""
    return min(range(2, MAX_LEVELS + 1), key=lambda levels: (worst_mean_variance(epsilon, levels), levels))


def checked_number(value: object) -> float:
    """A reported number as a float: MechanismError unless it is a finite int or float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MechanismError("A numeric metric's value must be a finite number.")
    return float(value)


DEFAULT_MEAN_SHARE = 0.5  # the mean's share of epsilon when a metric estimates both parts


def numeric_parts(
    metric: str,
    low: float,
    high: float,
    boundaries: tuple[float, ...],
    parts: tuple[str, ...],
    epsilon: float,
    mean_share: float = DEFAULT_MEAN_SHARE,
) -> list[tuple[NumericSpec, float]]:
    """A numeric metric's parts (of PARTS, each at most once) with each one's share of its epsilon:
    the mean gets mean_share and the distribution the rest when both are estimated, either one all
    of it when alone (basic composition: the parts' spending adds up to the metric's); the mean's
    rounding points chosen for its own epsilon (mean_levels)."""
    if not parts or len(set(parts)) != len(parts) or not set(parts) <= set(PARTS):
        raise MechanismError(f"A numeric metric estimates {MEAN}, {DISTRIBUTION} or both, not {list(parts)!r}.")
    if len(parts) == 2 and not 0 < mean_share < 1:
        raise MechanismError(f"The mean's share of epsilon is above 0 and below 1, not {mean_share!r}.")
    share = mean_share if len(parts) == 2 else 1.0
    found: list[tuple[NumericSpec, float]] = []
    if MEAN in parts:
        found.append((NumericSpec(metric, MEAN, low, high, (), mean_levels(share * epsilon)), share))
    if DISTRIBUTION in parts:
        found.append((NumericSpec(metric, DISTRIBUTION, low, high, boundaries), 1.0 - share if MEAN in parts else 1.0))
    return found
