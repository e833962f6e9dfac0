"""A numeric metric's parts (docs/math.md 9): the spec's checks and labels, the category of a
number against a brute-force reference, and the mean part's exact variance, its worst case and
its choice of rounding points against independent computations."""

from __future__ import annotations

import math
import random

import pytest

from veil.mechanism import (
    DISTRIBUTION,
    MAX_LEVELS,
    MEAN,
    MechanismError,
    NumericSpec,
    epsilon_to_gamma,
    mean_levels,
    mean_variance,
    worst_mean_variance,
)

BUCKETS = (100.0, 250.0, 500.0, 1000.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": "", "part": MEAN, "low": 0, "high": 1, "levels": 2}, "non-empty name"),
        ({"metric": "m", "part": "median", "low": 0, "high": 1, "levels": 2}, "'median'"),
        ({"metric": "m", "part": MEAN, "low": math.nan, "high": 1, "levels": 2}, "low must be a finite number"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": math.inf, "levels": 2}, "high must be a finite number"),
        ({"metric": "m", "part": MEAN, "low": True, "high": 1, "levels": 2}, "low must be a finite number"),
        ({"metric": "m", "part": MEAN, "low": 1, "high": 1, "levels": 2}, r"low < high"),
        ({"metric": "m", "part": MEAN, "low": -1e308, "high": 1e308, "levels": 2}, "finite width"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": 1, "boundaries": (0.5,), "levels": 2}, "no bucket boundaries"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": 1, "levels": 1}, f"2 to {MAX_LEVELS} rounding points, not 1"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": 1, "levels": MAX_LEVELS + 1}, "rounding points"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": 1, "levels": True}, "not True"),
        ({"metric": "m", "part": MEAN, "low": 0, "high": 1, "levels": 2.0}, "not 2.0"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (0.5,), "levels": 2}, "no rounding"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1}, "1 to 1023 bucket boundaries, not 0"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (0.5, 0.5)}, "increase strictly"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (0.7, 0.3)}, "increase strictly"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (0.0,)}, "strictly inside"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (1.0,)}, "strictly inside"),
        ({"metric": "m", "part": DISTRIBUTION, "low": 0, "high": 1, "boundaries": (math.nan,)}, "boundary must be"),
        # Three points on a range one ulp wide: the middle one rounds onto an end.
        ({"metric": "m", "part": MEAN, "low": 1.0, "high": math.nextafter(1.0, 2.0), "levels": 3}, "too close"),
    ],
)
def test_a_bad_numeric_spec_is_refused_with_a_message_naming_it(kwargs, message):
    with pytest.raises(MechanismError, match=message):
        NumericSpec(**kwargs)


def test_labels_name_the_points_and_the_buckets():
    mean = NumericSpec("load_ms", MEAN, 0, 10, (), 5)
    assert mean.labels == ("0", "2.5", "5", "7.5", "10")
    assert mean.points == (0.0, 2.5, 5.0, 7.5, 10.0)
    assert (mean.name, mean.k) == ("load_ms.mean", 5)
    dist = NumericSpec("load_ms", DISTRIBUTION, 0, 2000, BUCKETS)
    assert dist.labels == ("[0, 100)", "[100, 250)", "[250, 500)", "[500, 1000)", "[1000, 2000]")
    assert (dist.name, dist.k, dist.edges) == ("load_ms.distribution", 5, (0.0, *BUCKETS, 2000.0))
    assert NumericSpec("x", MEAN, -0.5, 0.25, (), 2).labels == ("-0.5", "0.25")


def _mean_reference(spec: NumericSpec, value: float, alpha: float) -> int:
    """The point as the count of rounding thresholds j + alpha (j = 0 .. G - 1) that t exceeds."""
    steps = spec.levels - 1
    t = (value - spec.low) / (spec.high - spec.low) * steps
    return sum(1 for j in range(steps) if t - j > alpha)


def _bucket_reference(spec: NumericSpec, value: float) -> int:
    """The bucket i with edges[i] <= value < edges[i + 1] (the last one closed at high)."""
    edges = spec.edges
    for i in range(spec.k):
        if edges[i] <= value < edges[i + 1] or (i == spec.k - 1 and value == edges[-1]):
            return i
    raise AssertionError(value)


@pytest.mark.parametrize("levels", [2, 3, 5, 17, MAX_LEVELS])
def test_the_mean_category_matches_a_brute_force_reference(levels):
    spec = NumericSpec("m", MEAN, -3.0, 7.0, (), levels)
    rng = random.Random(levels)
    points = [spec.low + (spec.high - spec.low) * j / (levels - 1) for j in range(levels)]
    values = [spec.low, spec.high, *points, *(rng.uniform(spec.low, spec.high) for _ in range(2000))]
    for value in values:
        for alpha in (0.0, 0.5, math.nextafter(1.0, 0.0), rng.random(), rng.random()):
            assert spec.category(value, alpha) == _mean_reference(spec, value, alpha), (value, alpha)


def test_the_bucket_matches_a_brute_force_reference():
    spec = NumericSpec("m", DISTRIBUTION, 0.0, 2000.0, BUCKETS)
    rng = random.Random(7)
    values = [0.0, 2000.0, *BUCKETS, *(math.nextafter(b, 0.0) for b in BUCKETS)]
    values += [rng.uniform(0.0, 2000.0) for _ in range(5000)]
    for value in values:
        assert spec.category(value, 0.5) == _bucket_reference(spec, value), value


def test_alpha_point_rounding_is_unbiased_over_alpha():
    """Averaged over alphas spread evenly on [0, 1), the rounded point is the value (to the
    grid's resolution): the measure of alphas below f is f."""
    spec = NumericSpec("m", MEAN, 10.0, 30.0, (), 5)
    grid = 4000
    alphas = [(i + 0.5) / grid for i in range(grid)]
    rng = random.Random(3)
    for value in [10.0, 30.0, 15.0, 17.3, 29.99, *(rng.uniform(10.0, 30.0) for _ in range(20))]:
        mean = sum(spec.points[spec.category(value, a)] for a in alphas) / grid
        step = (spec.high - spec.low) / (spec.levels - 1)
        assert abs(mean - value) <= step / grid + 1e-9, value


def _enumerated_variance(epsilon: float, levels: int, u: float) -> float:
    """n Var of one report's contribution, by enumerating the rounding and every response."""
    gamma = epsilon_to_gamma(epsilon)
    steps = levels - 1
    keep, other = gamma / (gamma + steps), 1.0 / (gamma + steps)
    j = min(math.floor(u * steps), steps - 1)
    f = u * steps - j
    s1 = sum(i / steps for i in range(levels))
    outcomes: dict[int, float] = {}
    for rounded, weight in ((j, 1.0 - f), (j + 1, f)):
        for report in range(levels):
            outcomes[report] = outcomes.get(report, 0.0) + weight * (keep if report == rounded else other)
    z = {report: (report / steps - other * s1) / (keep - other) for report in outcomes}
    mean = sum(p * z[r] for r, p in outcomes.items())
    assert mean == pytest.approx(u, abs=1e-12)  # the contribution is unbiased
    return sum(p * (z[r] - mean) ** 2 for r, p in outcomes.items())


def _closed_form(epsilon: float, levels: int, u: float) -> float:
    """docs/math.md 9.2's rearranged formula."""
    gamma = epsilon_to_gamma(epsilon)
    steps = levels - 1
    d = (gamma - 1.0) / (gamma + steps)
    j = min(math.floor(u * steps), steps - 1)
    f = u * steps - j
    return (
        f * (1.0 - f) / (steps * steps * d)
        - (1.0 - d) * u * (1.0 - u) / d
        + (1.0 - d) * ((steps + 2) / (12.0 * steps) + d / 4.0) / d**2
    )


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("levels", [2, 3, 5, 9])
def test_mean_variance_is_the_enumerated_variance_and_the_documented_formula(epsilon, levels):
    for u in (0.0, 1.0, 0.5, 0.3, 0.71, 1.0 / (levels - 1), 0.999):
        exact = _enumerated_variance(epsilon, levels, u)
        assert mean_variance(epsilon, levels, u) == pytest.approx(exact, rel=1e-9)
        assert _closed_form(epsilon, levels, u) == pytest.approx(exact, rel=1e-9)


def test_two_points_are_duchis_mechanism():
    """At two points the worst case on [-1, 1] is ((e^eps + 1) / (e^eps - 1))^2, at the middle."""
    for epsilon in (0.5, 1.0, 2.0):
        gamma = epsilon_to_gamma(epsilon)
        assert 4 * worst_mean_variance(epsilon, 2) == pytest.approx(((gamma + 1) / (gamma - 1)) ** 2, rel=1e-12)
        assert 4 * mean_variance(epsilon, 2, 0.5) == pytest.approx(((gamma + 1) / (gamma - 1)) ** 2, rel=1e-12)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("levels", [2, 3, 4, 5, 17])
def test_worst_mean_variance_is_the_maximum_over_a_dense_grid(epsilon, levels):
    grid = [i / 20_000 for i in range(20_001)]
    dense = max(mean_variance(epsilon, levels, u) for u in grid)
    worst = worst_mean_variance(epsilon, levels)
    assert dense <= worst * (1 + 1e-12)
    assert worst <= dense * (1 + 1e-6)  # the grid comes within a hair of the vertex


def test_mean_levels_are_in_range_grow_with_epsilon_and_match_the_documented_figures():
    epsilons = [0.5 * i for i in range(1, 21)]
    levels = [mean_levels(e) for e in epsilons]
    assert all(2 <= x <= MAX_LEVELS for x in levels)
    assert levels == sorted(levels)  # more points as epsilon grows, never fewer
    assert mean_levels(1e-4) == 2 and mean_levels(1.0) == 2 and mean_levels(4.0) == 5
    assert mean_levels(11.0) < MAX_LEVELS == mean_levels(13.0)  # the cap binds from about epsilon 12
    for epsilon in (1.0, 2.0, 4.0):  # the choice is the least worst case among 2 .. MAX_LEVELS
        best = mean_levels(epsilon)
        assert all(
            worst_mean_variance(epsilon, best) <= worst_mean_variance(epsilon, x) for x in range(2, MAX_LEVELS + 1)
        )
    # docs/math.md 9.2 (and NUMERIC.md): worst-case n Var on [-1, 1].
    figures = {0.5: 16.67, 1.0: 4.68, 2.0: 1.00, 4.0: 0.177, 8.0: 0.0111}
    for epsilon, figure in figures.items():
        assert 4 * worst_mean_variance(epsilon, mean_levels(epsilon)) == pytest.approx(figure, rel=5e-3)
