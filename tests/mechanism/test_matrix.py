"""Transition matrices (exact, in Fractions): columns sum to 1, parity within gamma (equal where
admissible, to the rounding of the thresholds), and the randomizer's draws follow the matrix
(chi-square)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from scipy import stats

from veil.mechanism import (
    MECHANISMS,
    SeededRandomSource,
    is_admissible,
    parity,
    spec_for,
    transition_matrix,
)

EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0]
GRID = [(name, k, eps) for name in MECHANISMS for k in ((2,) if name == "warner" else range(2, 9)) for eps in EPSILONS]


@pytest.mark.parametrize("name, k, epsilon", GRID)
def test_columns_sum_to_one_and_parity_is_within_gamma(name, k, epsilon):
    spec = spec_for(name, k, epsilon)
    reports, matrix = transition_matrix(spec)
    assert len(reports) == len(set(reports)) == spec.outputs
    for j in range(k):
        assert sum(row[j] for row in matrix) == 1
    gamma = spec.gamma
    assert parity(matrix) <= Fraction(gamma)  # exact: thresholds are rounded toward privacy
    assert spec.parity == float(parity(matrix))
    if spec.admissible:
        assert parity(matrix) == pytest.approx(gamma, rel=1e-12)
        assert is_admissible(matrix, gamma)
    else:
        # Basic RAPPOR: the all-zeros and all-ones rows are flat (003 sec. 7.2).
        assert not is_admissible(matrix, gamma)
        assert min(max(r) / min(r) for r in matrix) == pytest.approx(1.0)


def _chi_square_p(spec, draws: int, seed: int) -> float:
    """p-value of the draws of spec.randomize against its transition matrix, over every
    (true value, report) cell; cells expected fewer than 5 times are pooled per true value."""
    reports, matrix = transition_matrix(spec)
    source = SeededRandomSource(seed)
    per_value = draws // spec.k
    statistic, dof = 0.0, 0
    for j in range(spec.k):
        seen = Counter(spec.randomize(j, source) for _ in range(per_value))
        assert set(seen) <= set(reports)
        observed, expected = [], []
        pooled_obs = pooled_exp = 0.0
        for report, row in zip(reports, matrix):
            e = float(row[j]) * per_value
            if e < 5:
                pooled_obs += seen[report]
                pooled_exp += e
            else:
                observed.append(seen[report])
                expected.append(e)
        if pooled_exp > 0:
            observed.append(pooled_obs)
            expected.append(pooled_exp)
        statistic += sum((o - e) ** 2 / e for o, e in zip(observed, expected))
        dof += len(observed) - 1
    return stats.chi2.sf(statistic, dof)


# 250,000 draws per design at a representative (k, epsilon) in the default run; a million on
# the whole grid of k <= 8 under the slow marker.
@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("k, epsilon", [(5, 1.0), (8, 0.5)])
def test_draws_match_the_matrix(name, k, epsilon):
    spec = spec_for(name, 2 if name == "warner" else k, epsilon)
    assert _chi_square_p(spec, 250_000, seed=k * 1000 + int(epsilon * 10)) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name, k, epsilon", GRID)
def test_a_million_draws_match_the_matrix_everywhere(name, k, epsilon):
    assert _chi_square_p(spec_for(name, k, epsilon), 10**6, seed=k * 1000 + int(epsilon * 10)) > 1e-4


def test_a_wrong_matrix_is_caught():
    # The test above can fail: draws of one design against another design's matrix.
    krr = spec_for("krr", 4, 1.0)
    wider = spec_for("krr", 4, 1.5)
    source = SeededRandomSource(7)
    _, matrix = transition_matrix(wider)
    counts = Counter(krr.randomize(0, source) for _ in range(200_000))
    observed = [counts[(i,)] for i in range(4)]
    expected = [float(row[0]) * 200_000 for row in matrix]
    assert stats.chisquare(observed, expected).pvalue < 1e-6
