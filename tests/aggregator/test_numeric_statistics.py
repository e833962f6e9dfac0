"""Numeric metrics against their theory, over the grid of issue 27 (slow, seeded; docs/math.md 9):
epsilon in {0.5, 1, 2, 4} x n in {10^3, 10^5} x five populations (a point mass at each end of the
range, uniform, exponential, bimodal).

- the mean part's n x MSE is within 5% of its exact n x Var (the devices' average of
  mean_variance), over REPS repetitions: its relative standard error is sqrt(2 / REPS) = 1.3%,
  so 5% is about four of them;
- the 95% intervals of the mean, and of the quantiles q = 0.5, 0.9, 0.99 of a distribution part
  over realistic buckets, cover at least 93% of the time;
- the peers the benchmark sets beside Veil (Duchi's, PM, HM) are unbiased with their published
  variances.

The draws and the cells are bench/bench_numeric.py's (loaded as a module), so the test and the
benchmark measure the same thing; the benchmark runs more repetitions and adds the peers.
"""

from __future__ import annotations

import numpy as np
import pytest
from veil_testing.benchlib import load_script

from veil.aggregator.numeric import QUANTILES

pytestmark = pytest.mark.slow

REPS = 12_000
QUANTILE_REPS = 400


bench = load_script("bench_numeric")
GRID = [(e, n, name) for e in bench.EPSILONS for n in bench.NS for name in bench.DISTRIBUTIONS]


@pytest.mark.parametrize(("epsilon", "n", "name"), GRID, ids=[f"eps{e:g}-n{n}-{d}" for e, n, d in GRID])
def test_mean_error_is_the_exact_variance_and_intervals_cover(epsilon, n, name):
    index = GRID.index((epsilon, n, name))
    rng = np.random.default_rng([20261127, index])
    values, devices = bench.population(name, n)
    mean = bench.mean_cell(bench.mean_spec(epsilon), values, devices, REPS, rng)
    assert abs(mean["ratio"] - 1.0) <= 0.05, mean
    assert mean["coverage"] >= 0.93, mean
    quantiles = bench.quantile_cell(bench.distribution_spec(epsilon), values, devices, QUANTILE_REPS, 1000 * index)
    assert all(quantiles[f"coverage_q{q}"] >= 0.93 for q in QUANTILES), quantiles


@pytest.mark.parametrize("peer", sorted(bench.PEERS))
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_the_peers_are_unbiased_with_their_published_variances(peer, epsilon):
    """The benchmark's Duchi, PM and HM, implemented from the papers: at every input t on
    [-1, 1] the mean of 400,000 outputs is t (within 4 standard errors) and their variance the
    published one (within 2%; the sampling error of a variance of 400,000 draws is below 0.5%)."""
    draw, variance = bench.PEERS[peer]
    rng = np.random.default_rng([7, int(epsilon * 10), len(peer)])
    for t in (-1.0, -0.3, 0.0, 0.6, 1.0):
        out = draw(epsilon, np.full(400_000, t), rng)
        exact = float(variance(epsilon, np.array([t]))[0])
        assert abs(out.mean() - t) <= 4 * np.sqrt(exact / out.size), (t, out.mean())
        assert out.var() == pytest.approx(exact, rel=0.02), t
