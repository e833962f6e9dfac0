"""The aggregator over real gRPC and HTTP: SDK -> aggregator -> store -> estimates."""

from __future__ import annotations

import json
import math
import platform
import random
import urllib.error
import urllib.request
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from veil_testing.config_toml import LOAD
from veil_testing.running import METRICS, collector, estimates, specs_of
from veil_testing.waiting import wait_until

from veil.client import Reporter
from veil.client._encoding import encode_batch
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

SPECS = specs_of(METRICS)


def truth_of(k: int) -> list[float]:
    weights = [1.0 / (i + 1) ** 0.9 for i in range(k)]
    return [w / sum(weights) for w in weights]


def upload(endpoint: str, name: str, values: list[int], *, seed: int = 1, batch_id: bytes | None = None):
    """One batch of randomized reports of `values`, encoded by the SDK, uploaded directly."""
    spec = SPECS[name]
    source = SeededRandomSource(seed)
    reports = [spec.mechanism.randomize(v, source) for v in values]
    request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, batch_id or random.randbytes(16)))
    return collector(endpoint).Upload(request, timeout=10)


def total_n(endpoint: str, metric: str) -> int:
    return next(e.n for e in estimates(endpoint, metric).estimates if e.window == "total")


@pytest.fixture(params=["memory", "redis"])
def store_url(request):
    if request.param == "memory":
        return "memory"
    return request.getfixturevalue("redis_server").url


@pytest.mark.parametrize("metric", [m["name"] for m in METRICS])
def test_sdk_reports_become_estimates_within_four_standard_errors(start_aggregator, redis_server, metric):
    aggregator = start_aggregator(redis_server.url)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    spec = SPECS[metric]
    truth = truth_of(spec.k)
    n = 200_000
    rng = random.Random(7)
    values = rng.choices(range(spec.k), weights=truth, k=n)
    # 2*10^5 simulated devices: memoization off, so each report is a fresh device's response.
    with Reporter(
        endpoint,
        tls=False,
        memoize=False,
        random_source=SeededRandomSource(11),
        max_queue_size=n + 1,
        max_batch_size=2000,
    ) as reporter:
        assert reporter.wait_for_specs(10)
        for value in values:
            reporter.report(metric, value)
        assert reporter.force_flush(120), reporter.counters()
        assert reporter.counters().sent == n

    response = estimates(endpoint, metric, "total")
    (window,) = response.estimates
    assert window.n == n and not window.withheld and len(window.categories) == spec.k
    # The reports are independent here, so the estimates lie within 4 true standard errors; the
    # served ones allow for reports_per_device alike reports of one device (the metric allows
    # LOAD a day), so they are sqrt(reports_per_device) times wider.
    assert window.reports_per_device == LOAD
    theory = [math.sqrt(v / n) for v in spec.mechanism.variances(truth)]
    for category, pi, se in zip(window.categories, truth, theory):
        assert abs(category.estimate - pi) < 4 * se, (category.label, category.estimate, pi)
        assert category.stderr == pytest.approx(se * math.sqrt(LOAD), rel=0.10)
        assert category.lower < category.estimate < category.upper
    assert sum(c.projected for c in window.categories) == pytest.approx(1.0)

    body = json.load(
        urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/v1/estimates/{metric}?window=total")
    )
    (as_json,) = body["estimates"]
    assert as_json["n"] == n and [c["estimate"] for c in as_json["categories"]] == pytest.approx(
        [c.estimate for c in window.categories], rel=1e-12
    )
    assert "biased" in body["projection"]


def test_specs_are_served_with_their_fingerprints(start_aggregator):
    aggregator = start_aggregator()
    response = collector(f"127.0.0.1:{aggregator.grpc_port}").GetMetricSpecs(veil_pb2.GetMetricSpecsRequest())
    assert {s.name: s.fingerprint for s in response.specs} == {n: s.fingerprint for n, s in SPECS.items()}
    one = collector(f"127.0.0.1:{aggregator.grpc_port}").GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(metrics=["os"]))
    assert [s.name for s in one.specs] == ["os"] and one.specs[0].q == 1


def test_the_same_batch_counts_once_sequentially_and_concurrently(start_aggregator, store_url):
    endpoint = f"127.0.0.1:{start_aggregator(store_url).grpc_port}"
    batch_id = bytes(range(16))
    values = list(range(8)) * 25
    replies = [upload(endpoint, "browser", values, batch_id=batch_id) for _ in range(10)]
    assert [r.duplicate for r in replies] == [False] + [True] * 9 and all(r.accepted == 200 for r in replies)
    other = bytes(range(1, 17))
    with futures.ThreadPoolExecutor(10) as pool:
        replies = list(pool.map(lambda _: upload(endpoint, "browser", values, batch_id=other), range(10)))
    assert sorted(r.duplicate for r in replies) == [False] + [True] * 9
    assert total_n(endpoint, "browser") == 400


def _bad_uploads() -> list[tuple[str, veil_pb2.UploadRequest, grpc.StatusCode, str]]:
    spec = SPECS["browser"]
    reports = [spec.mechanism.randomize(i % 8, SeededRandomSource(i)) for i in range(20)]
    # Index sets (the SDK would send this small k as bitmaps; the aggregator takes both).
    good = veil_pb2.UploadRequest(
        batch_id=bytes(16),
        metric="browser",
        spec_fingerprint=spec.fingerprint,
        count=len(reports),
        index_sets=veil_pb2.IndexSets(
            set_size=spec.mechanism.q, indices=b"".join(j.to_bytes(4, "little") for r in reports for j in r)
        ),
    )

    def changed(**fields) -> veil_pb2.UploadRequest:
        request = veil_pb2.UploadRequest()
        request.CopyFrom(good)
        for name, value in fields.items():
            if name == "indices":
                request.index_sets.indices = value
            elif name == "set_size":
                request.index_sets.set_size = value
            else:
                setattr(request, name, value)
        return request

    q = spec.mechanism.q
    raw = bytearray(good.index_sets.indices)
    raw[4 * q * 3 : 4 * q * 3 + 4] = (99).to_bytes(4, "little")  # report 3: index 99 >= k
    dup = bytearray(good.index_sets.indices)
    dup[4 * q * 5 + 4 : 4 * q * 5 + 8] = dup[4 * q * 5 : 4 * q * 5 + 4]  # report 5: a repeated index
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    return [
        ("unknown metric", changed(metric="nope"), grpc.StatusCode.FAILED_PRECONDITION, "not declared"),
        ("stale spec", changed(spec_fingerprint="0" * 32), grpc.StatusCode.FAILED_PRECONDITION, "another spec"),
        ("index out of range", changed(indices=bytes(raw)), invalid, "report 3: category index 99 is out of range"),
        ("duplicate indices", changed(indices=bytes(dup)), invalid, "report 5: indices are not strictly increasing"),
        ("wrong set size", changed(set_size=q + 1), invalid, f"set_size {q + 1} is not q = {q}"),
        ("truncated", changed(indices=bytes(raw[:-4])), invalid, "bytes, expected"),
        ("empty batch", changed(count=0), invalid, "empty batch"),
        ("oversize batch", changed(count=10_001), invalid, "oversize batch"),
        ("short batch id", changed(batch_id=b"\x01" * 15), invalid, "batch_id must be 16 bytes"),
        (
            "no payload",
            veil_pb2.UploadRequest(batch_id=bytes(16), metric="browser", spec_fingerprint=spec.fingerprint, count=1),
            invalid,
            "no reports",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_bad_uploads())), ids=[c[0] for c in _bad_uploads()])
def test_bad_uploads_get_their_status_and_count_nothing(start_aggregator, store_url, case):
    aggregator = start_aggregator(store_url)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    upload(endpoint, "browser", list(range(8)) * 20)
    before = {(e.metric, e.window): (e.n, [c.estimate for c in e.categories]) for e in estimates(endpoint).estimates}
    _, request, code, message = _bad_uploads()[case]
    with pytest.raises(grpc.RpcError) as err:
        collector(endpoint).Upload(request, timeout=10)
    assert err.value.code() == code and message in err.value.details()
    after = {(e.metric, e.window): (e.n, [c.estimate for c in e.categories]) for e in estimates(endpoint).estimates}
    assert after == before


def test_http_estimates_are_the_json_of_the_live_estimates_byte_for_byte(start_aggregator, store_url):
    """GET /v1/estimates joins each window's cached JSON text: the very bytes json.dumps writes
    for the whole body, for every request shape, before and after new counts."""
    from veil.mechanism import PROJECTION_NOTE

    aggregator = start_aggregator(store_url, min_n=10)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    shapes = [
        ("/v1/estimates", None, None),
        ("/v1/estimates/browser", "browser", None),
        ("/v1/estimates/browser?window=1h", "browser", "1h"),
        ("/v1/estimates/os?window=total", "os", "total"),
    ]
    for seed in (1, 2):
        upload(endpoint, "browser", list(range(8)) * 10, seed=seed)
        for path, metric, window in shapes:
            body = urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}{path}").read()
            generated_at = json.loads(body)["generated_at"]
            current = aggregator.live.current(metric, window)
            assert (
                body
                == json.dumps(
                    {
                        "generated_at": generated_at,
                        "projection": PROJECTION_NOTE,
                        "estimates": [e.to_json() for e in current],
                    },
                    allow_nan=False,
                ).encode()
            )


def test_estimates_are_withheld_below_the_minimum(start_aggregator):
    aggregator = start_aggregator(min_n=300)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    upload(endpoint, "os", [0, 1, 2] * 50)
    (window,) = estimates(endpoint, "os").estimates
    assert window.withheld and window.n == 150 and not window.categories and "from 300 reports" in window.reason
    upload(endpoint, "os", [0, 1, 2] * 50, seed=2)
    (window,) = estimates(endpoint, "os").estimates
    assert not window.withheld and window.n == 300 and len(window.categories) == 6
    with pytest.raises(grpc.RpcError) as err:
        estimates(endpoint, "nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/v1/estimates/nope")
    assert http_err.value.code == 404


def test_watch_streams_when_counts_change(start_aggregator):
    aggregator = start_aggregator(min_n=0)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    channel = grpc.insecure_channel(endpoint)
    stream = veil_pb2_grpc.EstimatesStub(channel).Watch(veil_pb2.WatchRequest(metric="os", window="total"), timeout=20)
    first = next(stream)
    assert first.estimates[0].n == 0
    upload(endpoint, "os", [1] * 40)
    second = next(stream)
    assert second.estimates[0].n == 40
    stream.cancel()
    channel.close()


def test_metrics_parse_with_prometheus_own_parser(start_aggregator):
    aggregator = start_aggregator(min_n=10)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    upload(endpoint, "browser", list(range(8)) * 10)
    with pytest.raises(grpc.RpcError):
        upload(endpoint, "browser", [], batch_id=bytes(16))
    text = urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/metrics").read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    uploads = {
        (s.labels["metric"], s.labels["outcome"]): s.value
        for s in families["veil_uploads"].samples
        if s.name == "veil_uploads_total"
    }
    assert uploads[("browser", "accepted")] == 1 and uploads[("browser", "invalid")] == 1
    assert {
        s.labels["category"]
        for s in families["veil_estimate"].samples
        if s.labels["metric"] == "browser" and s.labels["window"] == "total"
    } == set(SPECS["browser"].labels)
    reports = {(s.labels["metric"], s.labels["window"]): s.value for s in families["veil_window_reports"].samples}
    assert reports[("browser", "total")] == 80 and reports[("browser", "1h")] == 80
    assert "veil_upload_seconds" in families


def health_status(endpoint: str, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(endpoint))
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_redis_down_means_unavailable_and_not_serving_then_exact_counts(start_aggregator, make_redis_server):
    redis = make_redis_server(appendonly=True, appendfsync="always")
    aggregator = start_aggregator(redis.url)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    healthz = f"http://127.0.0.1:{aggregator.http_port}/healthz"
    assert health_status(endpoint) == health_pb2.HealthCheckResponse.SERVING
    upload(endpoint, "os", [0, 1] * 100)
    redis.kill()
    with pytest.raises(grpc.RpcError) as err:
        upload(endpoint, "os", [2] * 50, batch_id=b"r" * 16)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "same batch id" in err.value.details()
    assert wait_until(lambda: health_status(endpoint) == health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(healthz)
    assert http_err.value.code == 503
    redis.start()
    assert wait_until(lambda: health_status(endpoint) == health_pb2.HealthCheckResponse.SERVING)
    assert urllib.request.urlopen(healthz).status == 200
    reply = upload(endpoint, "os", [2] * 50, batch_id=b"r" * 16)  # the SDK's retry: same id
    assert not reply.duplicate
    assert total_n(endpoint, "os") == 250


def test_a_store_check_failing_unexpectedly_means_not_serving_and_the_watch_goes_on(
    start_aggregator, monkeypatch, caplog
):
    """The store's ping raising something no store error covers (a client library's own fault)
    is the store unavailable, logged with its traceback; the health watch is not ended by it, so
    the aggregator is SERVING again once the ping answers."""
    aggregator = start_aggregator()
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    assert health_status(endpoint) == health_pb2.HealthCheckResponse.SERVING
    answers = aggregator.store.ping

    def broken() -> None:
        raise AttributeError("'list' object has no attribute 'splitlines'")

    monkeypatch.setattr(aggregator.store, "ping", broken)
    assert wait_until(lambda: health_status(endpoint) == health_pb2.HealthCheckResponse.NOT_SERVING)
    monkeypatch.setattr(aggregator.store, "ping", answers)
    assert wait_until(lambda: health_status(endpoint) == health_pb2.HealthCheckResponse.SERVING)
    failed = [r for r in caplog.records if "check failed unexpectedly" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # once per outage, with the traceback


def test_server_reflection_lists_the_services(start_aggregator):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    aggregator = start_aggregator()
    with grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}") as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {"veil.wire.v1.Collector", "veil.wire.v1.Estimates", "grpc.health.v1.Health"} <= services


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_daemon_keeps_freed_memory_with_glibc():
    from veil.aggregator.tuning import keep_freed_memory

    assert keep_freed_memory() is True
