"""/metrics: bounded estimate series (top-N and the rest as a group), one info series per metric
spec, a store-up gauge, process and platform collectors, and promtool's lint clean."""

from __future__ import annotations

import gzip
import time
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from veil_testing.promtool import promtool_lint
from veil_testing.running import make_upload

from veil.aggregator.config import parse_config
from veil.aggregator.estimate import rest_estimate
from veil.aggregator.instruments import EstimatesCollector
from veil.aggregator.live import LiveEstimates
from veil.aggregator.simulate import FastKeystream, simulate_counts
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore, RedisStore
from veil.wire.v1 import veil_pb2_grpc

METRICS = [
    {
        "name": "big",
        "labels": [f"c{j}" for j in range(1024)],
        "mechanism": "subset",
        "epsilon": 1.0,
        "windows": ["total", "1h", "1d"],
    },
    {"name": "small", "labels": ["a", "b", "c"], "mechanism": "krr", "epsilon": 2.0},
]


def scrape(store, top: int = 50) -> tuple[str, dict]:
    config = parse_config({"server": {"min_n": 10, "metrics_top": top}, "store": {"url": "memory"}, "metrics": METRICS})
    live = LiveEstimates(config, store)
    registry = CollectorRegistry()
    registry.register(EstimatesCollector(live, config.metrics_top))
    text = generate_latest(registry).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def fill(store) -> LiveEstimates:
    config = parse_config({"store": {"url": "memory"}, "metrics": METRICS})
    metric = config.metrics[0]
    spec = metric.spec.mechanism
    values = np.random.default_rng(3).zipf(1.3, 20_000) % spec.k
    now = time.time()
    targets = tuple(
        (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), None) for w in metric.windows
    )
    assert store.add(
        BatchWrite(metric.name, b"x" * 16, simulate_counts(spec, values, keystream=FastKeystream(3)), targets, 3600)
    )
    return LiveEstimates(config, store)


def test_estimates_are_bounded_to_the_top_n_and_the_rest_as_a_group():
    store = MemoryStore()
    live = fill(store)
    text, families = scrape(store, top=50)
    estimates = [s for s in families["veil_estimate"].samples if s.labels["metric"] == "big"]
    assert len(estimates) == 3 * 50 and len(families["veil_estimate_stderr"].samples) == 3 * 50
    (total,) = [e for e in live.current("big", "total")]
    top = set(np.argsort(-total.estimate.estimate, kind="stable")[:50].tolist())  # ties: by index, as exported
    shown = {int(s.labels["category"][1:]) for s in estimates if s.labels["window"] == "total"}
    assert shown == top
    # Each category's interval as served: its lower and upper ends, not estimate +- 1.96 stderr.
    for end in ("lower", "upper"):
        got = {
            int(s.labels["category"][1:]): s.value
            for s in families[f"veil_estimate_{end}"].samples
            if s.labels["metric"] == "big" and s.labels["window"] == "total"
        }
        assert got == {j: getattr(total.estimate, end)[j] for j in top}
    # The rest: the group outside the top, with the interval that allows for its being chosen.
    want = rest_estimate(total.metric.spec.mechanism, total.estimate, 50)
    assert want.labels == () and want.upper > want.estimate + 1.96 * want.stderr
    for name, value in [("", want.estimate), ("_stderr", want.stderr), ("_lower", want.lower), ("_upper", want.upper)]:
        rest = {s.labels["window"]: s.value for s in families[f"veil_estimate_rest{name}"].samples}
        assert rest["total"] == pytest.approx(value, rel=1e-12), name
    # k = 3 is below the bound: every category, no rest. (Withheld: n = 0.)
    assert not [s for s in families["veil_estimate_rest"].samples if s.labels["metric"] == "small"]
    info = {s.labels["metric"]: s.labels for s in families["veil_metric_info"].samples}
    assert info["big"]["mechanism"] == "subset" and info["big"]["k"] == "1024" and info["small"]["epsilon"] == "2.0"
    assert info["big"]["fingerprint"] == total.metric.spec.fingerprint and info["big"]["period_seconds"] == "86400"
    assert families["veil_store_up"].samples[0].value == 1
    # The count docs/operating.md states: 3 windows x (50 x (estimate, stderr, lower, upper) + the rest's 4).
    series = [line for line in text.splitlines() if line.startswith("veil_estimate")]
    assert len(series) == 3 * (4 * 50 + 4)
    assert promtool_lint(text) == ""


def test_every_category_when_top_covers_k():
    store = MemoryStore()
    fill(store)
    _, families = scrape(store, top=2000)
    assert len([s for s in families["veil_estimate"].samples if s.labels["metric"] == "big"]) == 3 * 1024
    assert "veil_estimate_rest" not in families or not families["veil_estimate_rest"].samples


def test_store_up_is_0_when_the_store_is_down(make_redis_server):
    redis = make_redis_server()
    store = RedisStore(redis.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        redis.kill()
        text, families = scrape(store)
        assert families["veil_store_up"].samples[0].value == 0
        assert "veil_estimate" not in families or not families["veil_estimate"].samples
        assert promtool_lint(text) == ""
    finally:
        store.close()


def test_metrics_of_a_running_aggregator_have_process_and_platform_and_lint_clean(start_aggregator):
    aggregator = start_aggregator(min_n=10)
    stub = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    stub.Upload(make_upload("browser", 300), timeout=10)
    text = urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/metrics").read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "process_resident_memory_bytes" in families and "python_info" in families
    assert {s.labels["metric"] for s in families["veil_metric_info"].samples} >= {"browser", "os"}
    assert promtool_lint(text) == ""
    # Prometheus asks for gzip (Accept-Encoding): the same exposition, compressed.
    request = urllib.request.Request(
        f"http://127.0.0.1:{aggregator.http_port}/metrics", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        unzipped = gzip.decompress(response.read()).decode()
    assert {f.name for f in text_string_to_metric_families(unzipped)} == set(families)
