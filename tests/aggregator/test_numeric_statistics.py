"""Numeric metrics against their theory, over the grid of issue 27 (slow, seeded; docs/math.md 9):
epsilon in {0.5, 1, 2, 4} x n in {10^3, 10^5} x five populations (a point mass at each end of the
range, uniform, exponential, bimodal).

- the mean part's n x MSE is within 5% of its exact n x Var (the devices' average of
  mean_variance), over REPS repetitions: its relative standard error is sqrt(2 / REPS) = 1.3%,
  so 5% is about four of them;
- the 95% intervals of the mean, and of the quantiles q = 0.5, 0.9, 0.99 of a distribution part
  over realistic buckets, cover at least 93% of the time.

The draws and the cells are bench/bench_numeric.py's (loaded as a module), so the test and the
benchmark measure the same thing; the benchmark runs more repetitions and adds the peers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from veil.aggregator.numeric import QUANTILES

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_numeric.py"
REPS = 12_000
QUANTILE_REPS = 400


def _bench():
    spec = importlib.util.spec_from_file_location("bench_numeric", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()
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
