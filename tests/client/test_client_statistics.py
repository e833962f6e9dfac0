"""10^5 simulated devices reporting through the SDK into the loopback collector: the
foundation's estimators recover the truth within 4 standard errors.

Each simulated device reports once, so memoization is off (a device's one report is the same
either way) and the randomness is a seeded source (simulation only; devices use the CSPRNG).
Every report goes through Reporter.report(), the batching worker, gRPC and the collector's own
decoder into per-weight Counts.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from veil.aggregator.estimate import estimate
from veil.mechanism import SeededRandomSource

DEVICES = 100_000
CHUNK = 20_000  # reports between flushes, below the queue bound, so nothing is dropped


@pytest.mark.parametrize("metric,seed", [("page", 1), ("screen", 2), ("country", 3), ("theme", 4)])
def test_estimates_from_sdk_reports_are_within_4_standard_errors(ready_reporter, state, metric, seed):
    spec = state.by_name(metric)
    rng = random.Random(seed)
    weights = [1.0 / (j + 1) ** 1.1 for j in range(spec.k)]  # Zipf-like
    values = rng.choices(range(spec.k), weights=weights, k=DEVICES)
    reporter = ready_reporter(
        memoize=False, random_source=SeededRandomSource(seed), max_queue_size=CHUNK + 1, max_batch_size=4096
    )
    for start in range(0, DEVICES, CHUNK):
        for value in values[start : start + CHUNK]:
            reporter.report(metric, spec.labels[value])
        assert reporter.force_flush(30)
    counters = reporter.counters()
    assert (counters.accepted, counters.sent, counters.dropped, counters.failed) == (DEVICES, DEVICES, 0, 0)

    result = estimate(spec.mechanism, state.counts[spec.fingerprint])
    truth = np.bincount(values, minlength=spec.k) / DEVICES
    assert result.n == DEVICES
    z = np.abs(result.estimate - truth) / result.stderr
    assert z.max() < 4, (metric, z.round(2))
