"""Running aggregators for the daemon tests: their metrics and configs, in-process aggregators
(any store) and the simulated time they and their devices can share (SimulatedTime), configs
for a `veil serve` process (processes.ServeProcess), tokens and uploads."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from veil.aggregator.config import parse_config
from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2, veil_pb2_grpc
from veil_testing.clock import SimulatedTime
from veil_testing.config_toml import LOAD
from veil_testing.processes import free_port

__all__ = [
    "METRICS",
    "OTHER_UPLOAD_TOKEN",
    "READ_TOKEN",
    "SPEC_NAMES",
    "TOKENS",
    "UPLOAD_TOKEN",
    "InProcessAggregators",
    "SimulatedTime",
    "auth_section",
    "bearer",
    "collector",
    "config_dict",
    "counted",
    "estimates",
    "finish_reporters",
    "make_upload",
    "serve_config",
    "specs_of",
]

# These tests load the aggregator through few Reporters that stand for many devices, so their
# metrics let one device send up to LOAD reports a day (config_toml.LOAD).
METRICS = [
    {
        "name": "browser",
        "labels": ["chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "other"],
        "mechanism": "subset",
        "epsilon": 1.0,
        "windows": ["total", "1h"],
        "reports_per_period": LOAD,
    },
    {
        "name": "os",
        "labels": ["android", "ios", "windows", "macos", "linux", "other"],
        "mechanism": "krr",
        "epsilon": 2.0,
        "reports_per_period": LOAD,
    },
    {"name": "opted_in", "labels": ["no", "yes"], "mechanism": "warner", "epsilon": 1.0, "reports_per_period": LOAD},
    {
        "name": "crash_screen",
        "labels": [f"screen-{i}" for i in range(8)],
        "mechanism": "rappor",
        "epsilon": 2.0,
        "reports_per_period": LOAD,
    },
    {
        "name": "feature",
        "labels": [f"f{i}" for i in range(8)],
        "mechanism": "rappor-admissible",
        "epsilon": 2.0,
        "reports_per_period": LOAD,
    },
]


def config_dict(store_url: str = "memory", grpc_port: int = 0, **server: object) -> dict:
    return {
        "server": {
            "grpc": f"127.0.0.1:{grpc_port}",
            "http": "127.0.0.1:0",
            "min_n": 100,
            "watch_interval": 0.1,
            "grace_period": 2.0,
            **server,
        },
        "store": {"url": store_url},
        "metrics": METRICS,
    }


def serve_config(store_url: str, *, sections: dict | None = None, **server: object) -> dict:
    """A config for a `veil serve` process: config_dict on a fixed free gRPC port (so a restart
    listens where its clients reconnect), server keys added (e.g. processes), and more tables of
    the config file in sections (e.g. tls, auth)."""
    return {**config_dict(store_url, free_port(), **server), **(sections or {})}


class InProcessAggregators:
    """Starts in-process Aggregators on configs of config_dict(); stop_all() stops them all."""

    def __init__(self) -> None:
        self._started: list = []

    def start(
        self,
        store_url: str = "memory",
        *,
        sections: dict | None = None,
        clock: Callable[[], float] | None = None,
        **server: object,
    ):
        """A started Aggregator; sections adds tables to the config (e.g. {"tls": ..., "auth": ...}),
        clock replaces the wall clock its estimates and windows go by."""
        from veil.aggregator.config import parse_config
        from veil.aggregator.daemon import Aggregator

        config = parse_config({**config_dict(store_url, **server), **(sections or {})})
        aggregator = Aggregator(config) if clock is None else Aggregator(config, clock=clock)
        aggregator.start()
        self._started.append(aggregator)
        return aggregator

    def stop_all(self) -> None:
        for aggregator in self._started:
            aggregator.stop(grace=0)


def collector(endpoint: str) -> veil_pb2_grpc.CollectorStub:
    return veil_pb2_grpc.CollectorStub(grpc.insecure_channel(endpoint))


def estimates(endpoint: str, metric: str = "", window: str = "") -> veil_pb2.EstimatesResponse:
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(endpoint))
    return stub.Get(veil_pb2.EstimatesRequest(metric=metric, window=window), timeout=10)


def finish_reporters(threads, reporters) -> list:
    """Join the load threads, flush and shut down every Reporter; their final counters, after
    checking that none dropped or failed a report."""
    for thread in threads:
        thread.join()
    for reporter in reporters:
        assert reporter.force_flush(60), reporter.counters()
    counters = [r.counters() for r in reporters]
    for reporter in reporters:
        reporter.shutdown(5)
    assert all(c.dropped == 0 and c.failed == 0 for c in counters), counters
    return counters


SPEC_NAMES = tuple(m["name"] for m in METRICS)


# -- TLS and tokens (test_auth.py, test_tls.py, test_ratelimit.py) ---------------------------------

UPLOAD_TOKEN = "upload-token-app-a-0123456789abcdef"  # may report browser and os
OTHER_UPLOAD_TOKEN = "upload-token-app-b-fedcba9876543210"  # may report crash_screen only
READ_TOKEN = "read-token-dashboard-00112233445566"
TOKENS = (UPLOAD_TOKEN, OTHER_UPLOAD_TOKEN, READ_TOKEN)


def auth_section(**options: object) -> dict:
    """An [auth] table with two apps' upload tokens and a dashboard's read token."""
    return {
        "upload_tokens": [
            {"name": "app-a", "token": UPLOAD_TOKEN, "metrics": ["browser", "os"]},
            {"name": "app-b", "token": OTHER_UPLOAD_TOKEN, "metrics": ["crash_screen"]},
        ],
        "read_tokens": [{"name": "dashboard", "token": READ_TOKEN}],
        **options,
    }


def specs_of(metrics: list[dict]) -> dict[str, MetricSpec]:
    """The MetricSpecs an aggregator serves for these [[metrics]] tables, through its own config
    parser (so period, reports_per_period and budgets are read as it reads them)."""
    config = parse_config({"metrics": metrics})
    return {m.name: m.spec for m in config.metrics}


def make_upload(metric: str, n: int, *, batch_id: bytes | None = None, seed: int = 1) -> veil_pb2.UploadRequest:
    """A valid batch of n randomized reports of `metric` (one of METRICS), as the SDK encodes it."""
    import random

    from veil.client import encode_batch
    from veil.mechanism import SeededRandomSource

    spec = specs_of(METRICS)[metric]
    source = SeededRandomSource(seed)
    reports = [spec.mechanism.randomize(i % spec.k, source) for i in range(n)]
    return veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, batch_id or random.randbytes(16)))


def counted(aggregator, metric: str) -> int:
    """Reports counted in the metric's total window, read from the aggregator's store directly
    (past any access checks)."""
    return next(e.n for e in aggregator.live.current(metric, "total"))


def bearer(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None
