"""Ranges of past buckets: how long LiveEstimates takes to answer a series and a merged range.

    python bench/bench_series.py            # memory, SQLite and Redis, 200 timed calls each
    python bench/bench_series.py --quick    # a smoke run (numbers mean nothing)

The issue's targets (issue 16), at k = 1024 (q-subset, epsilon = 1): the 720 retained hourly
buckets of a window (30 days, read in one store call, one Redis pipeline) estimated one by one
in <= 50 ms p99, and a 7-day merged estimate (7 daily buckets, counts added) in <= 10 ms p99.
Every bucket holds 1,000 reports. Measured in process (store read + estimates, no wire), on the
memory store, on the embedded SQLite store (a file in a temporary directory) and on a
redis-server on loopback started here; the targets apply to SQLite and Redis. A series is timed
as a dashboard polls it (past buckets' estimates kept at their versions: one versions round trip
and the current bucket recomputed) and cold (a fresh LiveEstimates each call: every bucket read
and estimated; the first cold read, which makes RedisStore's packed copies of the ended buckets,
is timed apart as "first read"). Writes series.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from veil_testing.benchlib import QUICK_RESULTS_DIR, RESULTS_DIR, machine_info, progress, write_results
from veil_testing.redis_server import RedisServer

K, EPSILON, HOURS, DAYS, REPORTS = 1024, 1.0, 720, 7, 1000


def config() -> Any:
    from veil.aggregator.config import parse_config

    return parse_config(
        {
            "store": {"url": "memory"},
            "metrics": [
                {
                    "name": "big",
                    "labels": [f"c{j}" for j in range(K)],
                    "mechanism": "subset",
                    "epsilon": EPSILON,
                    "windows": ["total", {"span": "1h", "retention": "30d"}, {"span": "1d", "retention": "30d"}],
                }
            ],
        }
    )


def fill(store: Any, cfg: Any, now: float, hours: int) -> None:
    """REPORTS reports into each of the last `hours` hourly buckets (and their daily buckets)."""
    from veil.aggregator.simulate import FastKeystream, simulate_counts
    from veil.aggregator.store import BatchWrite, CountsKey

    metric = cfg.metrics[0]
    spec = metric.spec.mechanism
    store.since(metric.name, metric.spec.fingerprint, int(now) - hours * 3600)
    rng = np.random.default_rng(1)
    keystream = FastKeystream(1)
    for h in range(hours):
        at = now - h * 3600
        counts = simulate_counts(spec, rng.integers(0, K, REPORTS), keystream=keystream)
        targets = tuple(
            (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(at)[0]), None) for w in metric.windows
        )
        store.add(BatchWrite(metric.name, os.urandom(16), counts, targets, 3600))


def timings(call, repeats: int) -> dict[str, float]:
    call()  # warm: numba, caches
    samples, cpu = [], []
    for _ in range(repeats):
        started, used = time.perf_counter(), time.process_time()
        call()
        samples.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    samples.sort()
    cpu.sort()
    # The CPU time this process spent (Redis's own not included) beside the wall time: on a
    # shared machine the wall time's tail is mostly other processes' turns.
    return {
        "p50_ms": samples[len(samples) // 2],
        "p99_ms": samples[min(len(samples) - 1, int(0.99 * len(samples)))],
        "max_ms": samples[-1],
        "calls": repeats,
        "cpu_p50_ms": cpu[len(cpu) // 2],
        "cpu_p99_ms": cpu[min(len(cpu) - 1, int(0.99 * len(cpu)))],
        "load_average": os.getloadavg(),
    }


def measure(store: Any, repeats: int, hours: int) -> dict[str, Any]:
    from veil.aggregator.live import LiveEstimates
    from veil.aggregator.tuning import freeze_startup_heap, keep_freed_memory

    cfg = config()
    now = time.time()
    fill(store, cfg, now, hours)
    live = LiveEstimates(cfg, store, clock=lambda: now)
    series = live.series("big", "1h")
    assert len(series) == HOURS + 1 and sum(e.n for e in series) == hours * REPORTS, "the series lost reports"
    week = live.merged("big", "1d", now - (DAYS - 1) * 86400)
    assert week.n > 0 and week.estimate is not None
    # As the daemon process does (veil serve): malloc keeps freed memory, and once started the
    # heap of the setup (kernels, the filled store's objects) is out of the collector's sight,
    # so each full collection walks what is new only.
    keep_freed_memory()
    freeze_startup_heap()
    first = LiveEstimates(cfg, store, clock=lambda: now)
    started = time.perf_counter()
    first.series("big", "1h")
    first_ms = (time.perf_counter() - started) * 1000
    cold = timings(lambda: LiveEstimates(cfg, store, clock=lambda: now).series("big", "1h"), repeats)
    return {
        "series_720_hourly_first_read": {"ms": first_ms, "buckets": len(series)},
        "series_720_hourly": {**timings(lambda: live.series("big", "1h"), repeats), "buckets": len(series)},
        "series_720_hourly_cold": {**cold, "buckets": len(series)},
        "merged_7_daily": {**timings(lambda: live.merged("big", "1d", now - (DAYS - 1) * 86400), repeats), "n": week.n},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls")
    parser.add_argument(
        "--stores", nargs="+", default=["memory", "sqlite", "redis"], choices=["memory", "sqlite", "redis"]
    )
    parser.add_argument("--output", type=Path, help="the JSON file (default: series.json in bench/results/)")
    args = parser.parse_args(argv)
    from veil.aggregator.store import MemoryStore, RedisStore, SqliteStore

    repeats, hours = (20, 48) if args.quick else (200, HOURS)  # quick: 48 buckets hold reports, the rest none
    results: dict[str, Any] = {}
    for name in args.stores:
        progress(f"series: {name}")
        if name == "memory":
            results[name] = measure(MemoryStore(), repeats, hours)
        elif name == "sqlite":
            with tempfile.TemporaryDirectory(prefix="veil-series-") as directory:
                store = SqliteStore(Path(directory) / "veil.db")
                try:
                    results[name] = measure(store, repeats, hours)
                finally:
                    store.close()
        else:
            with RedisServer() as server:
                store = RedisStore(server.url)
                try:
                    results[name] = measure(store, repeats, hours)
                finally:
                    store.close()
        for what, row in results[name].items():
            progress(
                f"  {what}: "
                + (
                    f"{row['ms']:.1f} ms"
                    if "ms" in row
                    else f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms (CPU p50 "
                    f"{row['cpu_p50_ms']:.1f} ms, p99 {row['cpu_p99_ms']:.1f} ms; load "
                    f"{row['load_average'][0]:.1f})"
                )
            )
    write_results(
        args.output or (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR) / "series.json",
        {
            "command": shlex.join(["python", "bench/bench_series.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(("numpy", "redis")),
            "settings": {
                "quick": args.quick,
                "k": K,
                "epsilon": EPSILON,
                "hours": HOURS,
                "hours_with_reports": hours,
                "days": DAYS,
                "reports_per_bucket": REPORTS,
                "stores": args.stores,
            },
            "series": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
