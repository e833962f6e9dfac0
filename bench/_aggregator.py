"""The aggregator under benchmark, for every script here that runs one: its config
(config_dict: a metric per (k, epsilon) cell), the daemon as a subprocess (AggregatorProcess:
this file run as a script does what `veil serve --config FILE` does, plus a page that reads the
counts back from its store, so the memory store can be checked from outside), and one in-process
aggregator of the demo's shape for the scripts that time clients against it (start_aggregator).

    python bench/_aggregator.py --config FILE    # what AggregatorProcess starts
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from veil_testing.processes import ServeProcess, free_port

__all__ = [
    "CALL_TIMEOUT",
    "COUNTS_PATH",
    "MECHANISM",
    "VEIL",
    "WINDOWS",
    "AggregatorProcess",
    "config_dict",
    "http_get",
    "labels",
    "metric_name",
    "serve",
    "start_aggregator",
    "store_counts",
]

MECHANISM = "subset"
WINDOWS = ("total", "1h", "1d")
COUNTS_PATH = "/bench/counts"  # the benchmark's own page on the aggregator's HTTP listener
CALL_TIMEOUT = 120.0
VEIL = str(Path(sys.executable).with_name("veil"))  # the command beside this interpreter


def metric_name(k: int, epsilon: float) -> str:
    return f"ingest_k{k}_e{epsilon:g}".replace(".", "_")


def labels(k: int) -> list[str]:
    return [f"c{j}" for j in range(k)]


def config_dict(ks: list[int], epsilons: list[float], store_url: str, processes: int = 1) -> dict[str, Any]:
    """Every cell's metric, three windows each; defaults otherwise. Ports are chosen by the
    kernel, except with several worker processes, which need fixed gRPC ports to share."""
    server: dict[str, Any] = {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"}
    if processes > 1:
        server = {"grpc": f"127.0.0.1:{free_port()}", "http": f"127.0.0.1:{free_port()}", "processes": processes}
    return {
        "server": server,
        "store": {"url": store_url},
        "metrics": [
            {
                "name": metric_name(k, e),
                "labels": labels(k),
                "mechanism": MECHANISM,
                "epsilon": e,
                "windows": list(WINDOWS),
            }
            for k in ks
            for e in epsilons
        ],
    }


def store_counts(config: Any, store: Any, since: float, metrics: list[str] | None = None) -> dict[str, Any]:
    """{metric: {window: {"n": [...], "v": [[...]]}}}: the counts of every window, summed over its
    buckets from the one holding ``since`` to the current one (an hour may turn during a run)."""
    from veil.aggregator.store import CountsKey

    now = time.time()
    found: dict[str, Any] = {}
    for metric in config.metrics:
        if metrics is not None and metric.name not in metrics:
            continue
        spec = metric.spec.mechanism
        weights = spec.weight_law().weights
        windows = {}
        for window in metric.windows:
            n = np.zeros(len(weights), np.int64)
            v = np.zeros((len(weights), spec.k), np.int64)
            starts = (
                [0] if window.span is None else range(window.bucket(since)[0], window.bucket(now)[0] + 1, window.span)
            )
            for start in starts:
                key = CountsKey(metric.name, metric.spec.fingerprint, window.name, start)
                counts = store.read(key, weights, spec.k)
                n += counts.n
                v += counts.v
            windows[window.name] = {"n": n.tolist(), "v": v.tolist()}
        found[metric.name] = windows
    return found


def serve(config_path: str) -> int:
    """The aggregator process: what `veil serve --config FILE` runs (the same logging, config
    loading, Aggregator, signals), plus one page on its HTTP listener that reads the counts
    back from its store, so the memory store can be checked from outside. Prints its ports."""
    from veil.aggregator.config import load_config
    from veil.aggregator.daemon import Aggregator
    from veil.aggregator.logs import configure_logging
    from veil.aggregator.tuning import freeze_startup_heap, keep_freed_memory

    configure_logging("json", "info")
    config = load_config(config_path)
    since = time.time()
    holder: dict[str, Any] = {}

    def counts_page() -> bytes:
        return json.dumps(store_counts(config, holder["store"], since)).encode()

    keep_freed_memory()
    aggregator = Aggregator(config, pages={COUNTS_PATH: ("application/json", counts_page)})
    holder["store"] = aggregator.store
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    aggregator.start()
    freeze_startup_heap()
    while not stop.wait(0.5):
        pass
    aggregator.stop()
    return 0


class AggregatorProcess:
    """One aggregator subprocess (this file run as a script, serve(); with server.processes > 1
    `veil serve` itself, a supervisor of worker processes) and how to reach it."""

    def __init__(self, store: str, store_url: str, config: dict[str, Any], directory: Path) -> None:
        from veil.aggregator.config import parse_config

        self.store = store
        self.store_url = store_url
        self.config = parse_config(config)
        self.since = time.time()
        command = [sys.executable, str(Path(__file__).resolve())] if self.config.processes == 1 else None
        self.server = ServeProcess(directory / store, config, command=command, parent_death_signal=signal.SIGTERM)
        try:
            self.server.start()
        except RuntimeError as err:
            raise RuntimeError(f"the {store} aggregator did not start: {err}") from None
        self.endpoint = self.server.endpoint  # server.grpc: grpcio's server
        self.http_port = self.server.http_port
        self.redis = None  # for the redis store: a RedisStore reading what the aggregator wrote
        self.redis_pid: int | None = None  # and the redis-server's pid, for its CPU use

    @property
    def pid(self) -> int:
        return self.server.pid

    @property
    def pids(self) -> list[int]:
        return self.server.pids

    def counts(self, metrics: list[str] | None = None) -> dict[str, Any]:
        """What the store holds now (see store_counts)."""
        if self.redis is not None:
            return store_counts(self.config, self.redis, self.since, metrics)
        status, body = http_get(self.http_port, COUNTS_PATH)
        if status != 200:
            raise RuntimeError(f"{COUNTS_PATH} answered {status}")
        found = json.loads(body)
        return found if metrics is None else {m: found[m] for m in metrics}

    def log_tail(self) -> str:
        return self.server.log_text()[-3000:]

    def stop(self) -> None:
        self.server.terminate()
        if self.redis is not None:
            self.redis.close()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    """One GET on a fresh connection (the aggregator's HTTP/1.0 listener closes each one)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def start_aggregator(reports: int = 0) -> Any:
    """An in-process aggregator on free loopback ports (memory store, both listeners) with three
    metrics of the demo's shape (m0, m1, m2: 16 categories, epsilon 1, windows total and 1h),
    each holding `reports` reports sent by `veil simulate` (real uploads)."""
    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import Aggregator

    metrics = [{"name": f"m{i}", "labels": labels(16), "epsilon": 1.0, "windows": ["total", "1h"]} for i in range(3)]
    server = {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "min_n": 10}
    aggregator = Aggregator(parse_config({"server": server, "store": {"url": "memory"}, "metrics": metrics}))
    aggregator.start()
    address = f"127.0.0.1:{aggregator.grpc_port}"
    for i in range(3 if reports else 0):
        command = [VEIL, "simulate", f"m{i}", "--reports", str(reports), "--seed", str(i), "--address", address]
        subprocess.run(command, check=True, capture_output=True)
    return aggregator


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The aggregator process of the benchmarks (see AggregatorProcess).")
    parser.add_argument("--config", required=True, help="the veil.toml to serve")
    sys.exit(serve(parser.parse_args().config))
