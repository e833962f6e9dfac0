"""The estimates of a numeric metric's parts (veil.aggregator.numeric; docs/math.md 9.4, 9.5) on
counts whose estimate is known: the mean and its standard error on a point mass, quantiles and
their intervals on known shares, interval ends on boundaries, and no reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

from veil.aggregator.counts import Counts
from veil.aggregator.estimate import Z95, estimate
from veil.aggregator.numeric import QUANTILES, mean_estimate, quantile_estimates
from veil.aggregator.simulate import FastKeystream, simulate_counts
from veil.mechanism import DISTRIBUTION, MEAN, MechanismError, MetricSpec, NumericSpec, mean_variance

EDGES = (0.0, 10.0, 20.0, 30.0, 40.0)


def mean_part(epsilon: float, levels: int, low: float = 100.0, high: float = 300.0) -> MetricSpec:
    return MetricSpec.numeric_part(NumericSpec("load_ms", MEAN, low, high, (), levels), epsilon=epsilon)


def distribution_part(mechanism: str = "krr", epsilon: float = 1.0) -> MetricSpec:
    return MetricSpec.numeric_part(
        NumericSpec("load_ms", DISTRIBUTION, EDGES[0], EDGES[-1], EDGES[1:-1]), mechanism, epsilon
    )


def counts_estimating(spec: MetricSpec, shares: list[float], n: int) -> Counts:
    """Counts of n reports whose estimate is the given shares (to within 1/n): V_j solved from
    pi_hat_j = alpha V_j / n + beta."""
    linear = spec.mechanism.estimators()["minimax"]
    v = np.rint((np.array(shares) - linear.beta[0]) / linear.alpha[0] * n).astype(np.int64)
    return Counts(linear.weights, np.array([n]), v[None, :])


def expected_counts(spec: MetricSpec, point: int, n: int) -> Counts:
    """The expected counts of n reports of devices all at one point: n p there, n r elsewhere."""
    p = spec.mechanism.keep_probability  # type: ignore[attr-defined]
    r = (1.0 - p) / (spec.k - 1)
    v = np.rint(np.where(np.arange(spec.k) == point, p, r) * n).astype(np.int64)
    return Counts((1,), np.array([int(v.sum())]), v[None, :])


@pytest.mark.parametrize(("epsilon", "levels"), [(1.0, 2), (2.0, 3), (4.0, 5)])
@pytest.mark.parametrize("where", ["low", "middle", "high"])
def test_the_mean_of_a_point_mass_is_the_point_with_the_exact_standard_error(epsilon, levels, where):
    spec = mean_part(epsilon, levels)
    point = {"low": 0, "middle": (levels - 1) // 2, "high": levels - 1}[where]
    n = 10**12
    m = mean_estimate(spec, estimate(spec.mechanism, expected_counts(spec, point, n)))
    assert spec.numeric is not None
    assert m.estimate == pytest.approx(spec.numeric.points[point], abs=1e-6)
    # The spread of the contributions of a point mass is that point's exact variance (9.2); the
    # floor is the least over the points, so it never raises it.
    exact = 200.0 * math.sqrt(mean_variance(epsilon, levels, point / (levels - 1)) / n)
    assert m.stderr == pytest.approx(exact, rel=1e-5)
    assert m.lower == pytest.approx(max(100.0, m.estimate - Z95 * m.stderr), rel=1e-12)
    assert m.upper == pytest.approx(min(300.0, m.estimate + Z95 * m.stderr), rel=1e-12)


def test_the_mean_interval_is_clipped_to_the_range_and_widens_with_reports_per_device():
    spec = mean_part(1.0, 2)
    counts = expected_counts(spec, 0, 1000)
    one = mean_estimate(spec, estimate(spec.mechanism, counts))
    four = mean_estimate(spec, estimate(spec.mechanism, counts, reports_per_device=4))
    assert one.lower == 100.0 and four.lower == 100.0  # the range's end, not below it
    assert four.stderr == pytest.approx(2.0 * one.stderr, rel=1e-12)


def test_the_mean_standard_error_is_never_below_the_design_minimum():
    """All reports on one point (possible at small n): the spread is 0, the floor holds."""
    spec = mean_part(4.0, 5)
    counts = Counts((1,), np.array([20]), np.array([[0, 0, 20, 0, 0]]))
    m = mean_estimate(spec, estimate(spec.mechanism, counts))
    least = min(mean_variance(4.0, 5, j / 4) for j in range(5))
    assert m.stderr == pytest.approx(200.0 * math.sqrt(least / 20), rel=1e-12)


def test_the_mean_over_simulated_devices_is_within_its_interval_and_its_variance():
    """50,000 devices at 137.5 (a value between points), each with its own alpha, reported
    through the device's randomization: the estimate is near 137.5 and the standard error near
    the exact one (a point mass: no spread of values)."""
    spec = mean_part(2.0, 3)
    numeric = spec.numeric
    assert numeric is not None
    rng = np.random.default_rng(5)
    alphas = rng.integers(0, 2**53, 50_000) / 2.0**53
    categories = np.array([numeric.category(137.5, a) for a in alphas.tolist()], np.uint32)
    counts = simulate_counts(spec.mechanism, categories, keystream=FastKeystream(11))
    m = mean_estimate(spec, estimate(spec.mechanism, counts))
    exact = 200.0 * math.sqrt(mean_variance(2.0, 3, 0.1875) / 50_000)
    assert m.stderr == pytest.approx(exact, rel=0.05)
    assert abs(m.estimate - 137.5) < 4 * exact


def test_quantiles_of_known_shares_interpolate_within_boundaries():
    spec = distribution_part()
    e = estimate(spec.mechanism, counts_estimating(spec, [0.1, 0.3, 0.4, 0.2], 10**12))
    found = {x.q: x for x in quantile_estimates(spec, e)}
    assert tuple(found) == QUANTILES
    assert found[0.5].estimate == pytest.approx(22.5, abs=1e-6)
    assert (found[0.5].lower, found[0.5].upper) == (20.0, 30.0)
    assert found[0.9].estimate == pytest.approx(35.0, abs=1e-6)
    assert found[0.99].estimate == pytest.approx(39.5, abs=1e-6)
    assert (found[0.9].lower, found[0.9].upper) == (found[0.99].lower, found[0.99].upper) == (30.0, 40.0)


def test_a_point_mass_on_a_boundary_has_its_quantiles_in_the_bucket_above():
    spec = distribution_part()
    e = estimate(spec.mechanism, counts_estimating(spec, [0.0, 1.0, 0.0, 0.0], 10**12))
    for x in quantile_estimates(spec, e):
        assert (x.lower, x.upper) == (10.0, 20.0)
        assert 10.0 <= x.estimate <= 20.0


def test_only_the_boundaries_next_to_the_quantile_bound_it():
    """Cumulative shares 0.5, 1.1, 0.8 (an estimate, unbiased, not monotone): for q = 0.9 the
    first boundary from below whose interval reaches q is 20 and the last from the top whose
    interval falls below q is 30, so the interval is [10, 40], not the crossed [30, 20] that the
    farthest boundaries would give."""
    spec = distribution_part()
    e = estimate(spec.mechanism, counts_estimating(spec, [0.5, 0.6, -0.3, 0.2], 10**12))
    (q90,) = quantile_estimates(spec, e, (0.9,))
    assert (q90.lower, q90.upper) == (10.0, 40.0)


@pytest.mark.parametrize("mechanism", ["subset", "krr", "rappor"])
@pytest.mark.parametrize("n", [5, 200, 20_000])
def test_quantile_interval_ends_are_boundaries_in_order(mechanism, n):
    spec = distribution_part(mechanism, 1.0)
    rng = np.random.default_rng(n)
    for run in range(20):
        values = rng.choice(spec.k, n, p=[0.05, 0.45, 0.3, 0.2]).astype(np.uint32)
        e = estimate(spec.mechanism, simulate_counts(spec.mechanism, values, keystream=FastKeystream(run)))
        for x in quantile_estimates(spec, e):
            assert x.lower in EDGES and x.upper in EDGES
            assert x.lower < x.upper
            assert x.lower <= x.estimate <= x.upper


def test_no_reports_give_no_estimates():
    mean, dist = mean_part(1.0, 2), distribution_part()
    m = mean_estimate(mean, estimate(mean.mechanism, Counts.zeros(mean.mechanism)))
    assert all(math.isnan(x) for x in (m.estimate, m.stderr, m.lower, m.upper))
    assert quantile_estimates(dist, estimate(dist.mechanism, Counts.zeros(dist.mechanism))) == ()


def test_a_part_of_the_other_kind_is_refused():
    mean, dist = mean_part(1.0, 2), distribution_part()
    with pytest.raises(MechanismError, match="not the mean part"):
        mean_estimate(dist, estimate(dist.mechanism, Counts.zeros(dist.mechanism)))
    with pytest.raises(MechanismError, match="not the distribution part"):
        quantile_estimates(mean, estimate(mean.mechanism, Counts.zeros(mean.mechanism)))
