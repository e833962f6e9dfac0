"""Unit tests of veil.aggregator.estimate: exact identities, no simulation.

The estimators are linear per report (Y_j = alpha_t z_j + beta_t for a report of weight t), so
everything here can be checked exactly: against the mechanism's own transition probabilities,
against a per-report NumPy computation, and against the closed forms of docs/math.md.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from veil.aggregator.counts import Counts
from veil.aggregator.estimate import Z95, estimate, project_to_simplex
from veil.mechanism import (
    MECHANISMS,
    KrrSpec,
    MechanismError,
    MechanismSpec,
    RapporSpec,
    SubsetSpec,
    WarnerSpec,
    spec_for,
    transition_matrix,
)

K_GRID = (2, 3, 5, 16, 128, 1024)
EPSILON_GRID = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 20.0)


def specs_of(mechanisms, ks, epsilons) -> list[MechanismSpec]:
    """Every valid spec of the product (Warner exists for k = 2 only)."""
    specs = []
    for name, k, epsilon in itertools.product(mechanisms, ks, epsilons):
        if name == WarnerSpec.name and k != 2:
            continue
        specs.append(spec_for(name, k, epsilon))
    return specs


def spec_ids(spec: MechanismSpec) -> str:
    return f"{spec.name}-k{spec.k}-eps{spec.epsilon}"


def spec_estimator_pairs(specs):
    """(spec, estimator name) for every estimator of every spec."""
    return [pytest.param(spec, name, id=f"{spec_ids(spec)}-{name}") for spec in specs for name in spec.estimators()]


def dirichlet(k: int, seed: int) -> np.ndarray:
    """A seeded, non-uniform distribution over k categories."""
    return np.random.default_rng(seed).dirichlet(np.ones(k))


def counts_of(spec: MechanismSpec, reports) -> Counts:
    """The sufficient statistics of a list of reports, tallied one by one."""
    counts = Counts.zeros(spec)
    rows = counts.row_of_weight()
    for report in reports:
        row = rows[len(report)]
        counts.n[row] += 1
        counts.v[row, list(report)] += 1
    return counts


def per_report_contributions(spec: MechanismSpec, estimator: str, reports) -> np.ndarray:
    """Y[r, j] = alpha_t z_j + beta_t for report r of weight t: the definition, report by report."""
    linear = spec.estimators()[estimator]
    coefficients = dict(zip(linear.weights, zip(linear.alpha, linear.beta)))
    y = np.empty((len(reports), spec.k))
    for r, report in enumerate(reports):
        alpha, beta = coefficients[len(report)]
        z = np.zeros(spec.k)
        z[list(report)] = 1.0
        y[r] = alpha * z + beta
    return y


# --- unbiasedness and variances --------------------------------------------------------------


ALL_SPECS = specs_of(MECHANISMS, K_GRID, EPSILON_GRID)
# Small enough to enumerate every report (RAPPOR has 2^k).
ENUMERABLE_SPECS = specs_of(MECHANISMS, (2, 3, 4, 5), (0.5, 1.0, 4.0))


@pytest.mark.parametrize(("spec", "estimator"), spec_estimator_pairs(ALL_SPECS))
def test_every_estimator_is_unbiased(spec, estimator):
    # E[Y_j | X = j] = 1 and E[Y_j | X != j] = 0 make E[pi_hat_j] = pi_j for every pi. They are
    # sums of up to k + 1 rounded terms: an absolute 1e-9 (the worst seen is about 1e-11).
    mean_true, mean_other, _, _ = spec.estimators()[estimator].moments(spec.weight_law())
    assert mean_true == pytest.approx(1.0, abs=1e-9)
    assert mean_other == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("spec", "estimator"), spec_estimator_pairs(ENUMERABLE_SPECS))
def test_mean_and_variance_agree_with_the_exact_transition_matrix(spec, estimator):
    # Enumerating every report with its probability as randomized (spec.probability) checks the
    # weight law behind spec.variances independently: mean pi_j and n * Var = variances[j].
    pi = dirichlet(spec.k, seed=spec.k)
    reports, rows = transition_matrix(spec)
    probability = np.asarray(rows, dtype=np.float64) @ pi  # P(report) under pi
    y = per_report_contributions(spec, estimator, reports)
    mean = probability @ y
    variance = probability @ (y - mean) ** 2
    np.testing.assert_allclose(mean, pi, rtol=0, atol=1e-12)
    np.testing.assert_allclose(variance, spec.variances(pi, spec.estimators()[estimator]), rtol=1e-10)


# --- estimate() against a per-report computation ---------------------------------------------

SMALL_SPECS = [
    SubsetSpec(5, 1.0),
    SubsetSpec(6, 0.5),
    KrrSpec(4, 2.0),
    WarnerSpec(2, 1.0),
    RapporSpec(4, 1.0),
    spec_for("rappor-admissible", 4, 1.0),
]


def every_report_repeated(spec: MechanismSpec) -> list[tuple[int, ...]]:
    """Every report the design can send, the i-th one (i % 3 + 1) times: all weights present,
    unequal counts, no randomness."""
    return [report for i, report in enumerate(spec.output_space()) for _ in range(i % 3 + 1)]


def design_stderr(spec: MechanismSpec, estimator: str, shares: np.ndarray, n: int, c: int = 1) -> np.ndarray:
    """sqrt(c Var / n) at each share, through the estimator's variances (checked against the
    transition matrix above)."""
    linear = spec.estimators()[estimator]
    return np.sqrt(np.asarray(linear.variances(spec.weight_law(), list(shares))) * c / n)


def in_score_set(spec, estimator, mean: float, pi: np.ndarray, n: int, c: int) -> np.ndarray:
    """Brute force: which shares pi satisfy (|mean - pi| - delta)_+^2 <= z^2 c Var(pi) / n."""
    linear = spec.estimators()[estimator]
    delta = c * abs(linear.alpha[0]) / (2 * n) if len(set(linear.alpha)) == 1 else 0.0
    variance = np.asarray(linear.variances(spec.weight_law(), list(pi))) * c / n
    return np.maximum(np.abs(mean - pi) - delta, 0.0) ** 2 <= Z95 * Z95 * variance


@pytest.mark.parametrize("c", [1, 7])
@pytest.mark.parametrize(("spec", "estimator"), spec_estimator_pairs(SMALL_SPECS))
def test_estimate_is_the_per_report_mean_with_the_design_error_and_score_interval(spec, estimator, c):
    reports = every_report_repeated(spec)
    y = per_report_contributions(spec, estimator, reports)
    n = len(reports)

    result = estimate(spec, counts_of(spec, reports), estimator=estimator, reports_per_device=c)

    assert result.n == n and result.reports_per_device == c
    assert result.estimator == estimator
    assert result.projection is None
    np.testing.assert_allclose(result.estimate, y.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        result.stderr, design_stderr(spec, estimator, np.clip(y.mean(axis=0), 0, 1), n, c), rtol=1e-9
    )
    grid = np.linspace(0.0, 1.0, 20001)
    for j in range(spec.k):
        inside = grid[in_score_set(spec, estimator, result.estimate[j], grid, n, c)]
        # The interval is exactly the set of shares on a fine grid (to its resolution).
        assert inside.min() == pytest.approx(result.lower[j], abs=1e-4)
        assert inside.max() == pytest.approx(result.upper[j], abs=1e-4)
        assert result.lower[j] <= max(result.estimate[j], 0) and result.upper[j] >= min(result.estimate[j], 1)


def test_z95_is_the_two_sided_95_percent_normal_quantile():
    assert Z95 == pytest.approx(1.959963984540054, rel=1e-12)


@pytest.mark.parametrize("spec", SMALL_SPECS, ids=spec_ids)
def test_no_reports_give_nan_everywhere(spec):
    result = estimate(spec, Counts.zeros(spec), project=True)
    assert result.n == 0
    for field in (result.estimate, result.stderr, result.lower, result.upper, result.projection):
        assert field.shape == (spec.k,)
        assert np.isnan(field).all()


@pytest.mark.parametrize("spec", SMALL_SPECS, ids=spec_ids)
def test_one_report_gives_its_contribution_and_the_design_error(spec):
    # One report has no sample spread, but the design's error is known: never a zero width.
    report = next(iter(spec.output_space()))
    result = estimate(spec, counts_of(spec, [report]))
    assert result.n == 1
    contribution = per_report_contributions(spec, "minimax", [report])[0]
    np.testing.assert_allclose(result.estimate, contribution, rtol=1e-12)
    assert (result.stderr > 0).all() and (result.upper > result.lower).all()


def test_a_category_in_no_report_keeps_the_design_error():
    # The field failure: k-RR at k = 1024, epsilon = 1, n = 1000 gave 408 of 1024 categories the
    # interval [-0.58198, -0.58198]; the smallest true standard error there is 0.589.
    spec = KrrSpec(1024, 1.0)
    v = np.zeros(1024, np.int64)
    v[408:] = np.random.default_rng(5).multinomial(1000, np.ones(616) / 616)
    result = estimate(spec, Counts((1,), np.array([1000]), v[None, :]))
    assert result.estimate[0] == pytest.approx(-0.58198, abs=1e-5)
    floor = design_stderr(spec, "minimax", np.array([0.0]), 1000)[0]
    assert floor == pytest.approx(0.589, abs=1e-3)
    assert (result.stderr[:408] == floor).all()
    assert (result.lower[:408] == 0.0).all() and (result.upper[:408] > 0.5).all()


def test_a_category_in_every_report_keeps_the_design_error():
    spec = WarnerSpec(2, 1.0)
    result = estimate(spec, Counts((1,), np.array([5]), np.array([[0, 5]])))
    floor = design_stderr(spec, "minimax", np.array([1.0]), 5)[0]
    assert result.stderr[1] == floor > 0
    assert result.upper[1] == 1.0 and result.lower[1] < 1.0


def test_more_reports_per_device_widen_by_the_square_root():
    spec = SubsetSpec(16, 1.0)
    counts = counts_of(spec, every_report_repeated(spec)[:5000])
    one, nine = estimate(spec, counts), estimate(spec, counts, reports_per_device=9)
    np.testing.assert_allclose(nine.stderr, 3 * one.stderr, rtol=1e-12)
    assert ((nine.upper - nine.lower) > (one.upper - one.lower)).all()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_reports_per_device_must_be_a_positive_whole_number(bad):
    spec = SubsetSpec(4, 1.0)
    with pytest.raises(MechanismError, match="reports_per_device"):
        estimate(spec, Counts.zeros(spec), reports_per_device=bad)


# --- misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "estimator"),
    [
        (SubsetSpec(4, 1.0), "bogus"),
        (SubsetSpec(4, 1.0), "empirical"),  # only RAPPOR has an empirical estimator
        (spec_for("rappor-admissible", 4, 1.0), "empirical"),  # biased once reports are redrawn
    ],
)
def test_unknown_estimator_raises(spec, estimator):
    with pytest.raises(MechanismError, match=repr(estimator)):
        estimate(spec, Counts.zeros(spec), estimator=estimator)


@pytest.mark.parametrize(
    ("spec", "counts_spec"),
    [
        (SubsetSpec(4, 1.0), SubsetSpec(5, 1.0)),  # another k
        (SubsetSpec(8, 1.0), KrrSpec(8, 1.0)),  # another subset size (q = 3 against q = 1)
        (SubsetSpec(4, 1.0), RapporSpec(4, 1.0)),  # one weight against weights 0..k
        (RapporSpec(4, 1.0), spec_for("rappor-admissible", 4, 1.0)),  # weights 1..k-1 only
    ],
    ids=["k", "q", "subset-rappor", "rappor-admissible"],
)
def test_counts_of_another_design_raise(spec, counts_spec):
    with pytest.raises(MechanismError, match="not made by"):
        estimate(spec, Counts.zeros(counts_spec))


def test_counts_with_inconsistent_shapes_raise():
    with pytest.raises(MechanismError):
        Counts((1, 2), np.zeros(1, np.int64), np.zeros((2, 4), np.int64))
    with pytest.raises(MechanismError):
        Counts((1,), np.zeros(1, np.int64), np.zeros(4, np.int64))


# --- closed forms of docs/math.md ------------------------------------------------------------


def math_md_f(k: int, gamma: float, x: float) -> float:
    """f(x) of docs/math.md, written out again here so the test does not borrow the code's."""
    return k**2 * (x * gamma**2 + k - x) / (x * gamma + k - x) ** 2


@pytest.mark.parametrize("spec", specs_of(("subset", "krr", "warner"), K_GRID, EPSILON_GRID), ids=spec_ids)
def test_q_subset_risk_is_eq_4_6(spec):
    # n R = (k-1)^2 / (f(q) - k) + 1/k - 1 + sum pi_i (1 - pi_i), for any q (k-RR has q = 1).
    k, gamma, q = spec.k, spec.gamma, spec.q
    pi = dirichlet(k, seed=k)
    closed_form = (k - 1) ** 2 / (math_md_f(k, gamma, q) - k) + 1 / k - 1 + np.sum(pi * (1 - pi))
    assert spec.risk(pi) == pytest.approx(closed_form, rel=1e-9)


@pytest.mark.parametrize("spec", specs_of(("rappor",), K_GRID, EPSILON_GRID), ids=spec_ids)
def test_rappor_empirical_risk_is_eq_7_14(spec):
    # n R = k sqrt(g) / (sqrt(g) - 1)^2 + 1 - sum pi_i^2.
    s = math.sqrt(spec.gamma)
    pi = dirichlet(spec.k, seed=spec.k)
    closed_form = spec.k * s / (s - 1) ** 2 + 1 - np.sum(pi**2)
    assert spec.risk(pi, spec.estimators()["empirical"]) == pytest.approx(closed_form, rel=1e-9)


def random_single_weight_counts(spec: MechanismSpec, n: int, seed: int) -> Counts:
    """Counts of a one-weight design with arbitrary V_j in [0, n] (sums need not be consistent:
    the estimator is a linear map, valid on any input)."""
    v = np.random.default_rng(seed).integers(0, n + 1, size=spec.k)
    return Counts((spec.q,), [n], [v])


@pytest.mark.parametrize("spec", specs_of(("krr",), (2, 3, 16, 128), (0.5, 1.0, 4.0)), ids=spec_ids)
def test_krr_estimate_is_the_gamma_diagonal_inversion(spec):
    # pi_j = ((gamma + k - 1) lambda_j - 1) / (gamma - 1), lambda_j the share of reports equal to c_j.
    n = 1000
    counts = random_single_weight_counts(spec, n, seed=spec.k)
    share = counts.v[0] / n
    expected = ((spec.gamma + spec.k - 1) * share - 1) / (spec.gamma - 1)
    np.testing.assert_allclose(estimate(spec, counts).estimate, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("epsilon", (0.5, 1.0, 4.0))
def test_warner_estimate_is_scheme_1(epsilon):
    # 002 scheme 1: z = x XOR y with P(y = 1) = p = 1/(1 + gamma), and pi = (mean(z) - p)/(1 - 2p)
    # where z = 1 means the report is category 1.
    spec = WarnerSpec(2, epsilon)
    p = 1 / (1 + spec.gamma)
    n, ones = 1000, 377
    counts = Counts((1,), [n], [[n - ones, ones]])
    share_one = (ones / n - p) / (1 - 2 * p)
    np.testing.assert_allclose(estimate(spec, counts).estimate, [1 - share_one, share_one], rtol=1e-12)


# --- projection onto the simplex -------------------------------------------------------------


def brute_force_projection(x: np.ndarray) -> np.ndarray:
    """The closest point of the simplex to x, by trying every support S: on the face of S the
    closest point is x_S shifted by a constant to sum to 1; keep the feasible one nearest x."""
    best, best_distance = None, math.inf
    for size in range(1, x.size + 1):
        for support in itertools.combinations(range(x.size), size):
            point = np.zeros_like(x)
            point[list(support)] = x[list(support)] - (x[list(support)].sum() - 1) / size
            distance = np.sum((point - x) ** 2)
            if point.min() >= 0 and distance < best_distance:
                best, best_distance = point, distance
    return best


def unbiased_estimate_like(k: int, seed: int) -> np.ndarray:
    """Points like the unbiased estimates that get projected: a distribution plus noise, so some
    entries are negative, some above 1, and the sum is near but not at 1."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(k)) + rng.normal(0, rng.choice([0.01, 0.3, 3.0]), size=k)


@pytest.mark.parametrize("k", (2, 3, 5, 16, 1024))
def test_projection_is_a_distribution(k):
    for seed in range(50):
        projection = project_to_simplex(unbiased_estimate_like(k, seed))
        assert projection.min() >= 0
        assert projection.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", (2, 3, 5, 16, 1024))
def test_projection_is_idempotent_on_the_simplex(k):
    rng = np.random.default_rng(k)
    for _ in range(50):
        point = rng.dirichlet(np.full(k, 0.3))
        # Points on the faces of the simplex too: zero some entries, never all of them.
        zero = rng.random(k) < 0.2
        zero[rng.integers(k)] = False
        point[zero] = 0.0
        point /= point.sum()
        np.testing.assert_allclose(project_to_simplex(point), point, rtol=0, atol=1e-15)
        projection = project_to_simplex(unbiased_estimate_like(k, rng.integers(1 << 32)))
        np.testing.assert_allclose(project_to_simplex(projection), projection, rtol=0, atol=1e-15)


@pytest.mark.parametrize("k", (2, 3, 4, 6))
def test_projection_is_the_closest_point_of_the_simplex(k):
    for seed in range(100):
        x = unbiased_estimate_like(k, seed)
        np.testing.assert_allclose(project_to_simplex(x), brute_force_projection(x), rtol=0, atol=1e-12)


def sorted_projection(x: np.ndarray) -> np.ndarray:
    """The projection by the textbook sort (Held, Wolfe and Crowder; Duchi et al. 2008): u = x
    descending, theta = (u_1 + ... + u_r - 1) / r at the last rank r with u_r > that."""
    u = np.sort(x)[::-1]
    excess = np.cumsum(u) - 1.0
    ranks = np.arange(1, len(x) + 1)
    last = np.nonzero(u - excess / ranks > 0)[0][-1]
    return np.maximum(x - excess[last] / (last + 1), 0.0)


@pytest.mark.parametrize("k", (2, 16, 1024))
def test_projection_kernel_matches_the_sorting_reference(k):
    rows = np.stack([unbiased_estimate_like(k, seed) for seed in range(200)])
    projected = project_to_simplex(rows)
    for row, got in zip(rows, projected):
        np.testing.assert_allclose(got, sorted_projection(row), rtol=0, atol=1e-13)


def test_projection_of_ties_and_extremes():
    np.testing.assert_allclose(project_to_simplex(np.array([5.0, 5.0, 5.0])), [1 / 3] * 3, atol=1e-15)
    np.testing.assert_allclose(project_to_simplex(np.array([-1.0, -1.0])), [0.5, 0.5], atol=1e-15)
    np.testing.assert_allclose(project_to_simplex(np.array([2.0, -3.0, 0.5])), [1.0, 0.0, 0.0], atol=1e-15)


@pytest.mark.parametrize("spec", SMALL_SPECS, ids=spec_ids)
def test_estimate_projects_only_on_request_and_keeps_the_unbiased_estimate(spec):
    counts = counts_of(spec, every_report_repeated(spec))
    plain = estimate(spec, counts)
    projected = estimate(spec, counts, project=True)
    np.testing.assert_array_equal(projected.estimate, plain.estimate)
    np.testing.assert_array_equal(projected.projection, project_to_simplex(plain.estimate))
