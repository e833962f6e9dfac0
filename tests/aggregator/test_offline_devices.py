"""Devices offline at a period's end, through the real SDK: their reports are counted in the
period they were made in, not the one they arrive in (issue 25; wire revision 2's made_unix).

The field failure: 200 devices whose report of period t waited on disk (the endpoint
unreachable) and went out in t+1 beside their own report of t+1 made the t+1 bucket show
n = 400, reports_per_device 1, and a standard error 0.70-0.76x the truth. Here a population of
devices, each its own Reporter with its own queue directory (as apps use it), reports one value
per hourly period to an in-process aggregator on a SQLite file, both on one simulated time
(Reporter(clock=, elapsed_clock=)). In period t half the devices report while the aggregator is down:
their batches wait on disk, and half of these apps are closed, the others stay open, retrying.
In t+1 the aggregator is back and every device reports again (a tenth with a new value); the
open and the reopened apps send the batch of t beside the one of t+1. The t bucket must count
every device's report of t, the t+1 bucket each device's one report of t+1, and the served
standard error must be within 10% of the truth: the exact standard error of the estimator for
the devices' true values (the randomization's alone: per report pi A + (1 - pi) B - pi, A and B
the design's second moments, docs/math.md 4; LinearEstimator.variances is the same with - pi^2,
the devices drawn from a law, which the served error estimates). Counted by arrival
(made_unix 0, revision 1), the t+1 bucket held n = 1.5 N and a standard error sqrt(1 / 1.5) =
0.82x the truth. 200 devices and one seed by default; slow, 600 devices and 10 seeds, whose intervals must
also cover the devices' shares 93% of the time and whose squared z-scores against the oracle
must average 0.8-1.25. A batch kept longer than server.max_lateness is refused and counted as
too_late by the SDK.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from veil_testing.data import zipf_shares
from veil_testing.processes import free_port
from veil_testing.running import SimulatedTime
from veil_testing.waiting import wait_until

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator
from veil.aggregator.live import WindowEstimate
from veil.client import Counters, Reporter
from veil.mechanism import SeededRandomSource

HOUR = 3600
K = 12
EPSILON = 1.0
OFFLINE = 0.5  # the share of devices offline at period t's end
CHURN = 0.1
FAST = {"retry_initial_backoff_ms": 20, "retry_max_backoff_ms": 200}  # find the aggregator back at once


class Aggregators:
    """The aggregator of a test, stopped and started again on one port and one SQLite file."""

    def __init__(self, tmp_path: Path, clock: SimulatedTime, **server: object) -> None:
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.config = parse_config(
            {
                "server": {"grpc": self.endpoint, "http": "", "min_n": 1, "max_concurrent_rpcs": 4096, **server},
                "store": {"url": f"sqlite://{tmp_path}/veil.db"},
                "metrics": [
                    {
                        "name": "browser",
                        "labels": [f"b{j}" for j in range(K)],
                        "mechanism": "subset",
                        "epsilon": EPSILON,
                        "period": "1h",
                        "windows": ["1h"],
                    }
                ],
            }
        )
        self.clock = clock
        self.running: Aggregator | None = None

    def start(self) -> Aggregator:
        self.running = Aggregator(self.config, clock=self.clock)
        self.running.start()
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop(grace=0)
            self.running = None


def device(endpoint: str, queue_dir: Path, clock: SimulatedTime, seed: int | None = None) -> Reporter:
    source = None if seed is None else SeededRandomSource(seed)
    return Reporter(
        endpoint, tls=False, queue_dir=queue_dir, clock=clock, elapsed_clock=clock, random_source=source, **FAST
    )


def bucket(aggregator: Aggregator, start: float) -> WindowEstimate:
    (found,) = [e for e in aggregator.live.series("browser", "1h") if e.start == start]
    return found


def true_stderr(aggregator: Aggregator, values: list[int]) -> np.ndarray:
    """The estimator's exact standard error of each category for these devices' values, one
    report each: sqrt((pi A + (1 - pi) B - pi) / n), from LinearEstimator.variances (which
    subtracts pi^2, the variance of drawing the devices, for the randomization's pi)."""
    mechanism = aggregator.config.metrics[0].spec.mechanism
    shares = np.bincount(values, minlength=K) / len(values)
    per_report = np.array(mechanism.variances(shares.tolist())) + shares**2 - shares
    return np.sqrt(per_report / len(values))


def run_offline_boundary(tmp_path: Path, clock: SimulatedTime, devices: int, seed: int) -> dict[str, np.ndarray]:
    """One population across the boundary (see the module docstring), its two buckets checked
    for n; per bucket, the served standard errors over the true ones, and whether the intervals
    cover the devices' own shares."""
    tmp_path.mkdir(exist_ok=True)
    rng = random.Random(seed)
    law = zipf_shares(K)
    clock.now = 1_800_000_000 // HOUR * HOUR + 600  # period t, ten minutes in
    t = clock.now // HOUR * HOUR
    aggregators = Aggregators(tmp_path, clock)
    aggregator = aggregators.start()
    dirs = [tmp_path / f"device{d}" for d in range(devices)]
    offline = set(rng.sample(range(devices), int(devices * OFFLINE)))
    closed = {d for d in offline if d % 2}
    values = [rng.choices(range(K), law)[0] for _ in range(devices)]
    reporters: list[Reporter] = []
    try:
        with ThreadPoolExecutor(16) as pool:
            reporters = list(
                pool.map(lambda d: device(aggregators.endpoint, dirs[d], clock, seed * 1_000_003 + d), range(devices))
            )
            assert all(pool.map(lambda r: r.wait_for_specs(30), reporters))
            online = [r for d, r in enumerate(reporters) if d not in offline]
            for d, reporter in enumerate(reporters):
                if d not in offline:
                    reporter.report("browser", values[d])
            assert all(pool.map(lambda r: r.force_flush(60), online))
            aggregators.stop()  # unreachable: the others' reports of t wait on disk
            for d in offline:
                reporters[d].report("browser", values[d])
            # Half of these apps close; the others stay open, retrying.
            assert not any(
                pool.map(lambda d: reporters[d].shutdown(30) if d in closed else reporters[d].force_flush(0.5), offline)
            )
            assert wait_until(lambda: all(len(list((dirs[d] / "outbox").iterdir())) == 1 for d in offline), 30)
            assert all(reporters[d].counters().queued == 1 for d in offline)
            values_t = list(values)

            clock.now += HOUR  # period t+1: the aggregator is back, the closed apps reopen
            aggregator = aggregators.start()
            for d in closed:
                reporters[d] = device(aggregators.endpoint, dirs[d], clock, seed * 1_000_003 + devices + d)
            values = [rng.choices(range(K), law)[0] if rng.random() < CHURN else v for v in values]
            for d, reporter in enumerate(reporters):
                reporter.report("browser", values[d])
            assert all(pool.map(lambda r: r.force_flush(60), reporters))
            counters = [r.counters() for r in reporters]
            assert sum(c.sent for c in counters) == 2 * devices  # every report of both periods
            assert all(c.dropped == c.failed == c.too_late == 0 for c in counters)

        result: dict[str, np.ndarray] = {}
        for name, start, truth in (("t", t, values_t), ("t+1", t + HOUR, values)):
            window = bucket(aggregator, start)
            assert not window.withheld, window.reason
            # Each device's one report of the period in its bucket: the delayed ones in t, not in t+1.
            assert (window.n, window.reports_per_device, window.periods) == (devices, 1, 1), (name, window.n)
            assert window.provisional  # ended less than max_lateness ago (or still open)
            est = window.estimate
            assert est is not None
            shares = np.bincount(truth, minlength=K) / devices
            result[f"ratio {name}"] = est.stderr / true_stderr(aggregator, truth)
            result[f"covered {name}"] = (est.lower <= shares) & (shares <= est.upper)
            result[f"z {name}"] = (est.estimate - shares) / true_stderr(aggregator, truth)
        return result
    finally:
        for reporter in reporters:
            reporter.shutdown(1)
        aggregators.stop()


def test_devices_offline_at_a_periods_end_count_once_in_each_period(tmp_path):
    result = run_offline_boundary(tmp_path, SimulatedTime(0), devices=200, seed=1)
    for name in ("t", "t+1"):
        ratio = result[f"ratio {name}"]
        assert (np.abs(ratio - 1) < 0.1).all(), (name, ratio)


@pytest.mark.slow
def test_devices_offline_at_a_periods_end_get_honest_intervals(tmp_path):
    ratios, covered, z = [], [], []
    for seed in range(10):
        result = run_offline_boundary(tmp_path / f"seed{seed}", SimulatedTime(0), devices=600, seed=seed)
        for name in ("t", "t+1"):
            ratios.append(result[f"ratio {name}"])
            covered.append(result[f"covered {name}"])
            z.append(result[f"z {name}"])
    ratio = np.concatenate(ratios)
    assert (np.abs(ratio - 1) < 0.1).all(), ratio
    assert np.mean(np.concatenate(covered)) >= 0.93
    # The oracle is the estimates' true spread: mean z^2 near 1 (24 per seed).
    assert 0.8 <= float(np.mean(np.square(np.concatenate(z)))) <= 1.25


def test_a_batch_kept_longer_than_max_lateness_is_refused_as_too_late(tmp_path):
    clock = SimulatedTime(1_800_000_000 // HOUR * HOUR - HOUR + 60)  # a minute into period t-1
    t = clock.now // HOUR * HOUR + HOUR
    aggregators = Aggregators(tmp_path, clock, max_lateness="10m")
    aggregators.start()
    late, later = (device(aggregators.endpoint, tmp_path / name, clock) for name in ("late", "later"))
    for reporter in (late, later):
        assert reporter.wait_for_specs(10)
    aggregators.stop()
    late.report("browser", "b1")  # made in t-1
    clock.now += HOUR
    later.report("browser", "b2")  # made in t
    assert not late.shutdown(30) and not later.shutdown(30)  # both wait on disk
    clock.now = t + HOUR + 300  # t ended 5 minutes ago, t-1 65 minutes ago
    aggregator = aggregators.start()
    try:
        late, later = (device(aggregators.endpoint, tmp_path / name, clock) for name in ("late", "later"))
        assert later.force_flush(10) and later.counters() == Counters(sent=1)
        assert not late.force_flush(10)  # lost, and said so
        assert late.counters() == Counters(too_late=1)
        assert bucket(aggregator, t).n == 1
        assert bucket(aggregator, t - HOUR).n == 0
    finally:
        late.shutdown(1)
        later.shutdown(1)
        aggregators.stop()
