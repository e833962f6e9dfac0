"""Discovery against its theory, end to end on the aggregator's code (slow, seeded; docs/math.md
10): populations of n = 2 x 10^5 devices holding Zipf(1.1) values over 2^64, through the seven
rounds, at epsilon 4 and 8.

- recall: the top 20 values whose share is at least twice the detection floor are found in at
  least 95% of their chances (each clears six rounds and the floor with a margin of about three
  standard errors). The top 20, not every value above twice the floor: no more than the 32
  survivors of a round can go on, and at epsilon 8 some 44 values are that frequent;
- coverage: the 95% selective intervals of the values found hold their true shares at least 93%
  of the time, pooled.

The simulation is bench/bench_discovery.py's (loaded as a module), so the test and the benchmark
measure the same thing; the benchmark runs n = 10^6 and 10^7 and reports more.
"""

from __future__ import annotations

import numpy as np
import pytest
from veil_testing.benchlib import load_script

pytestmark = pytest.mark.slow

N = 200_000
SIMULATIONS = 120


bench = load_script("bench_discovery")


@pytest.mark.parametrize("epsilon", [4.0, 8.0])
def test_values_well_above_the_floor_are_found_and_their_intervals_cover(epsilon):
    zipf = bench.Zipf(explicit=200_000)
    runs = [bench.simulate(zipf, N, epsilon, np.random.default_rng([28, int(epsilon), s])) for s in range(SIMULATIONS)]
    chances = found = 0
    held = []
    for run in runs:
        assert run["floor"] is not None, "a simulation found nothing to verify"
        ranks = {rank for rank, *_ in run["found"]}
        strong = np.flatnonzero(zipf.shares[: bench.TOP] >= 2 * run["floor"])
        chances += strong.size
        found += sum(int(rank) in ranks for rank in strong)
        held += [lower <= share <= upper for rank, share, _, lower, upper, _ in run["found"] if rank >= 0]
    assert chances >= SIMULATIONS
    assert found / chances >= 0.95, (found, chances)
    assert np.mean(held) >= 0.93, (np.mean(held), len(held))
