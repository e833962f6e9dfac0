"""A metric whose estimate cannot be computed is served withheld, with the reason, and logged
once; every other metric is served as usual: by LiveEstimates, gRPC Get and Watch, and HTTP."""

from __future__ import annotations

import dataclasses
import json
import logging
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from veil_testing.running import config_dict, estimates

from veil.aggregator.config import MetricConfig, parse_config
from veil.aggregator.daemon import Aggregator
from veil.aggregator.live import LiveEstimates
from veil.aggregator.simulate import simulate_counts
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore
from veil.client._encoding import encode_batch
from veil.mechanism import RapporSpec, SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

BROKEN = "crash_screen"  # a RAPPOR metric of running.METRICS


class BrokenEstimatorRappor(RapporSpec):
    """RAPPOR whose estimators cannot be built: any bug of the estimate path, made certain."""

    def _build_estimators(self):
        raise ZeroDivisionError("float division by zero")


def unchecked_rappor(k: int, epsilon: float) -> RapporSpec:
    """A RAPPOR spec that skipped the checks (as one made before epsilon had a range would
    have): at epsilon = 1e-9 even its weight law cannot be computed."""
    spec = object.__new__(RapporSpec)
    object.__setattr__(spec, "k", k)
    object.__setattr__(spec, "epsilon", epsilon)
    return spec


def config_with(mechanism, **server: object):
    """running.config_dict()'s config, with the BROKEN metric randomized by `mechanism`."""
    config = parse_config(config_dict(**server))
    metrics = tuple(
        MetricConfig(dataclasses.replace(m.spec, mechanism=mechanism), m.windows) if m.name == BROKEN else m
        for m in config.metrics
    )
    return dataclasses.replace(config, metrics=metrics)


@pytest.fixture
def failures() -> Iterator[list[logging.LogRecord]]:
    """The error records of veil.aggregator while the test runs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logger = logging.getLogger("veil.aggregator")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def add(store: MemoryStore, metric: MetricConfig, reports: int, now: float) -> None:
    """`reports` randomized reports of the metric, counted into every window's current bucket."""
    spec = metric.spec.mechanism
    targets = tuple(
        (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), None) for w in metric.windows
    )
    counts = simulate_counts(spec, np.arange(reports) % spec.k)
    assert store.add(BatchWrite(metric.name, metric.name.encode().ljust(16, b"."), counts, targets, 3600))


@pytest.mark.parametrize(
    "mechanism",
    [BrokenEstimatorRappor(8, 2.0), unchecked_rappor(8, 1e-9)],
    ids=["estimator-raises", "weight-law-raises"],
)
def test_live_estimates_withhold_the_failed_metric_alone(mechanism, failures):
    config = config_with(mechanism, min_n=10)
    now = 1_700_000_000.0
    store = MemoryStore(clock=lambda: now)
    for metric in config.metrics:
        # The broken metric gets counts too where its spec can make them (estimator-raises).
        if metric.name != BROKEN or isinstance(mechanism, BrokenEstimatorRappor):
            add(store, metric, 50, now)
    live = LiveEstimates(config, store, clock=lambda: now)
    for _ in range(3):
        current = live.current()
        assert [(e.metric.name, e.window.name) for e in current] == [
            (m.name, w.name) for m in config.metrics for w in m.windows
        ]
        for e in current:
            if e.metric.name == BROKEN:
                assert e.withheld and "could not be computed" in e.reason
            else:
                assert not e.withheld and e.n == 50
        assert [e.metric.name for e in live.current(BROKEN)] == [BROKEN] * len(config.metric(BROKEN).windows)
    assert len(failures) == 1 and failures[0].metric == BROKEN  # once, however often it is asked for


def test_grpc_get_watch_and_http_serve_every_other_metric(failures):
    config = config_with(BrokenEstimatorRappor(8, 2.0), min_n=10)
    aggregator = Aggregator(config)
    aggregator.start()
    try:
        endpoint = f"127.0.0.1:{aggregator.grpc_port}"
        stub = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(endpoint))
        for metric in config.metrics:  # every metric has counts to estimate, the broken one too
            spec = metric.spec
            reports = [spec.mechanism.randomize(j % spec.k, SeededRandomSource(j)) for j in range(40)]
            batch = metric.name.encode().ljust(16, b".")
            stub.Upload(veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, batch)), timeout=10)

        def check(windows) -> None:
            names = {e.metric for e in windows}
            assert names == {m.name for m in config.metrics}
            for e in windows:
                if e.metric == BROKEN:
                    assert e.withheld and "ZeroDivisionError" in e.reason and not e.categories
                else:
                    assert not e.withheld and e.n == 40 and len(e.categories) > 0

        check(estimates(endpoint).estimates)
        check(estimates(endpoint).estimates)
        only = estimates(endpoint, BROKEN).estimates
        assert only and all(e.withheld for e in only)

        channel = grpc.insecure_channel(endpoint)
        stream = veil_pb2_grpc.EstimatesStub(channel).Watch(veil_pb2.WatchRequest(), timeout=20)
        check(next(stream).estimates)
        stream.cancel()
        channel.close()

        body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/v1/estimates").read())
        for e in body["estimates"]:
            assert e["withheld"] == (e["metric"] == BROKEN)
            assert ("could not be computed" in e["reason"]) == (e["metric"] == BROKEN)
        assert urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/metrics").status == 200
    finally:
        aggregator.stop(grace=0)
    assert len(failures) == 1
