"""Long statistical checks of the release methods (seeded; run with `make test-all`)."""

from __future__ import annotations

import numpy as np
import pytest
from pram_paper import KEYS, PARTITION, XI

from veil.release import dp_pram_design, ifpr_covariance, release_pram

pytestmark = pytest.mark.slow


def test_released_counts_are_unbiased_and_their_variance_is_exact_on_the_population(population, paper_release):
    """Over many releases of the same table: E[S | T] = T for every cell, and the variance of a
    released marginal count equals eq. 6.5 summed over the blocks."""
    runs = 120
    t = paper_release.cell_counts
    blocks = paper_release.blocks
    s = np.zeros((runs, t.size))
    married = []
    for r in range(runs):
        rel = release_pram(population, KEYS, partition=PARTITION, xi=XI, rng=50_000 + r)
        assert all(np.array_equal(a, b) for a, b in zip(rel.blocks, blocks))  # J >= m_0 everywhere: same blocks
        s[r] = rel.released_counts()
        married.append(np.count_nonzero(rel.table["marital"] == "married"))
    var = np.zeros(t.size)
    for cells in blocks:
        var[cells] = np.diag(ifpr_covariance(t[cells], paper_release.theta))
    z = (s.mean(axis=0) - t) / np.sqrt(np.maximum(var, 1e-12) / runs)
    assert np.all(np.abs(z[var > 0]) < 5.5) and np.all(s[:, var == 0] == t[var == 0])
    assert abs(np.mean(z[var > 0])) < 0.05  # no drift over the ~19,000 perturbed cells
    expected = paper_release.perturbation_variance("marital")["married"]
    assert np.var(married, ddof=1) == pytest.approx(expected, rel=4.5 * np.sqrt(2 / runs))
    assert np.mean(married) == pytest.approx(
        np.count_nonzero(population["marital"] == "married"), abs=4.5 * np.sqrt(expected / runs)
    )


def test_pooled_correct_match_over_many_releases(population, paper_release):
    num = np.zeros((3, 3))
    den = np.zeros((3, 3))
    for seed in range(40):
        cm = release_pram(population, KEYS, partition=PARTITION, xi=XI, rng=70_000 + seed).correct_match()
        num += np.nan_to_num(cm.probability) * cm.units
        den += cm.units
    pooled = num / den
    expected = paper_release.expected_correct_match().probability
    assert np.all(np.abs(pooled - expected) <= 4 * np.sqrt(pooled * (1 - pooled) / den))
    assert np.all(pooled <= XI + 2 * np.sqrt(pooled * (1 - pooled) / den))


def test_ordered_search_finds_the_exhaustive_optimum_at_nine_and_ten_categories():
    rng = np.random.default_rng(10)
    for _ in range(25):
        s = int(rng.integers(9, 11))
        epsilon = float(rng.choice([0.2, 1.0, 2.5, 5.0]))
        p = rng.dirichlet(np.ones(s) * float(rng.choice([0.1, 0.5, 2.0])))
        full = dp_pram_design(p, epsilon)
        fast = dp_pram_design(p, epsilon, exhaustive_up_to=0)
        assert fast.mutual_information == pytest.approx(full.mutual_information, rel=1e-9, abs=1e-14)
