"""Abuse limits over real gRPC: per-token rate limits with a retry hint, the message size limit
at the largest valid batch, bounded streams and calls, and deadlines (a call given up on
writes nothing, or its retry counts once)."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from veil_testing.running import (
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    UPLOAD_TOKEN,
    auth_section,
    bearer,
    config_dict,
    counted,
    make_upload,
)

from veil.aggregator._ratelimit import RateLimiter
from veil.aggregator.config import parse_config
from veil.aggregator.daemon import max_message_bytes
from veil.aggregator.ingest import MAX_BATCHES, Ingest
from veil.client import Reporter
from veil.mechanism import MetricSpec, SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc


def collector(aggregator) -> veil_pb2_grpc.CollectorStub:
    return veil_pb2_grpc.CollectorStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))


def retry_after_ms(error: grpc.RpcError) -> int:
    return int(dict(error.trailing_metadata())["retry-after-ms"])


def test_the_token_bucket():
    now = [0.0]
    limiter = RateLimiter({"a": (100.0, 1000.0), "off": (0.0, 0.0)}, clock=lambda: now[0])
    assert limiter.take("a", 600) == 0 and limiter.take("a", 400) == 0
    assert limiter.take("a", 100) == pytest.approx(1.0)  # empty: 100 reports take 1 s at 100/s
    now[0] = 0.5
    assert limiter.take("a", 100) == pytest.approx(0.5)  # a refusal takes nothing
    now[0] = 1.0
    assert limiter.take("a", 100) == 0
    now[0] = 100.0
    assert limiter.take("a", 1000) == 0  # refilled up to the burst, no further
    assert limiter.take("a", 1) == pytest.approx(0.01)
    assert limiter.take("a", 10**9) == pytest.approx(10.0)  # more than a burst: as much as a burst
    assert limiter.take("off", 10**9) == 0 and limiter.take("unknown", 10**9) == 0
    assert limiter.limit("a") == (100.0, 1000.0) and limiter.limit("off") is None


def test_a_burst_over_the_limit_is_refused_with_a_retry_hint_and_counts_what_was_accepted(start_aggregator):
    aggregator = start_aggregator(max_batch=500, sections={"auth": auth_section(rate_limit=200, rate_burst=1000)})
    stub = collector(aggregator)
    first, second, third = (make_upload("browser", 500, seed=s) for s in (1, 2, 3))
    assert stub.Upload(first, metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 500
    assert stub.Upload(second, metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 500
    with pytest.raises(grpc.RpcError) as err:
        stub.Upload(third, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    error = err.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    wait = retry_after_ms(error)
    assert 0 < wait <= 2500  # 500 reports at 200/s, less what refilled meanwhile (2.5 s on a fast machine)
    assert f"retry after {wait} ms with the same batch id" in error.details()
    assert "Rate limit of token 'app-a': 200 reports per second" in error.details()
    assert UPLOAD_TOKEN not in error.details()
    assert counted(aggregator, "browser") == 1000
    # Another token has its own bucket.
    assert stub.Upload(make_upload("crash_screen", 500), metadata=bearer(OTHER_UPLOAD_TOKEN), timeout=10).accepted
    # After the hint, the same batch passes and counts once.
    time.sleep(wait / 1000)
    reply = stub.Upload(third, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert (reply.accepted, reply.duplicate) == (500, False) and counted(aggregator, "browser") == 1500


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_the_sdk_backs_off_and_delivers_everything_through_a_rate_limit(start_aggregator, transport):
    aggregator = start_aggregator(max_batch=500, sections={"auth": auth_section(rate_limit=2000, rate_burst=1000)})
    n = 5000
    with Reporter(
        f"127.0.0.1:{aggregator.http_port}" if transport == "http" else f"127.0.0.1:{aggregator.grpc_port}",
        transport=transport,
        tls=False,
        token=UPLOAD_TOKEN,
        memoize=False,
        random_source=SeededRandomSource(5),
        max_queue_size=n + 1,
        max_batch_size=500,
        retry_initial_backoff_ms=100,
        retry_max_backoff_ms=500,
    ) as reporter:
        assert reporter.wait_for_specs(10)
        for i in range(n):
            reporter.report("os", i % 6)
        assert reporter.force_flush(60), reporter.counters()
        counters = reporter.counters()
    assert counters.sent == n and counters.retried > 0 and counters.failed == 0
    assert counted(aggregator, "os") == n


def test_without_tokens_an_explicit_rate_limit_applies_to_all_uploads_together(start_aggregator):
    aggregator = start_aggregator(max_batch=500, sections={"auth": {"rate_limit": 10, "rate_burst": 600}})
    stub = collector(aggregator)
    assert stub.Upload(make_upload("browser", 500), timeout=10).accepted == 500
    with pytest.raises(grpc.RpcError) as err:
        stub.Upload(make_upload("os", 500), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "token 'anonymous'" in err.value.details()
    assert counted(aggregator, "os") == 0
    # And without [auth] at all there is no limit.
    unlimited = collector(start_aggregator(max_batch=500))
    for seed in range(6):
        assert unlimited.Upload(make_upload("browser", 500, seed=seed), timeout=10).accepted == 500


def widest_batch(config, metric: str) -> veil_pb2.UploadRequest:
    """max_batch valid reports of `metric` in its wider encoding (index sets for a subset design)."""
    m = config.metric(metric)
    spec: MetricSpec = m.spec
    q = spec.mechanism.q
    source = SeededRandomSource(9)
    reports = [sorted(spec.mechanism.randomize(i % spec.k, source)) for i in range(config.max_batch)]
    return veil_pb2.UploadRequest(
        batch_id=os.urandom(16),
        metric=metric,
        spec_fingerprint=spec.fingerprint,
        count=len(reports),
        index_sets=veil_pb2.IndexSets(
            set_size=q, indices=b"".join(j.to_bytes(4, "little") for r in reports for j in r)
        ),
    )


def test_the_message_limit_is_the_largest_valid_batch(start_aggregator):
    aggregator = start_aggregator(max_batch=2000)
    limit = max_message_bytes(aggregator.config)
    largest = widest_batch(aggregator.config, "browser")  # 4 q bytes a report: the widest of these metrics
    size = largest.ByteSize()
    # The limit leaves room for the fields of UploadBatches' 64 batches, and little more.
    assert size <= limit < size + MAX_BATCHES * 512
    assert collector(aggregator).Upload(largest, timeout=10).accepted == 2000
    raw = grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}").unary_unary(
        "/veil.wire.v1.Collector/Upload",
        request_serializer=None,
        response_deserializer=veil_pb2.UploadResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(largest.SerializeToString() + b"\x00" * (limit - size + 1), timeout=10)  # one byte over, unread
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert counted(aggregator, "browser") == 2000


def test_the_message_limit_follows_the_config():
    def limit(**server) -> int:
        return max_message_bytes(parse_config(config_dict("memory", **server)))

    # max_batch reports, and the fields of as many as 64 batches whatever max_batch is.
    fields = 2 * limit(max_batch=5_000) - limit(max_batch=10_000)
    assert MAX_BATCHES * 64 < fields < MAX_BATCHES * 512
    assert limit(max_batch=10_000) < 1 << 20  # far below gRPC's 4 MiB default for these metrics


def test_streams_are_bounded_and_their_slots_come_back(start_aggregator):
    aggregator = start_aggregator(max_streams=1, sections={"auth": auth_section()})
    estimates = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    first = estimates.Watch(veil_pb2.WatchRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=30)
    assert next(first).estimates
    second = estimates.Watch(veil_pb2.WatchRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=30)
    with pytest.raises(grpc.RpcError) as err:
        next(second)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "server.max_streams" in err.value.details()
    # Unary calls are not streams.
    assert estimates.Get(veil_pb2.EstimatesRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=10).estimates
    first.cancel()
    deadline = time.monotonic() + 10
    while True:  # the cancelled stream's handler notices within a watch interval
        third = estimates.Watch(veil_pb2.WatchRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=30)
        try:
            assert next(third).estimates
            break
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
            time.sleep(0.1)
    third.cancel()


def test_calls_beyond_max_concurrent_rpcs_are_refused_at_once(start_aggregator, redis_server):
    aggregator = start_aggregator(
        redis_server.url,
        workers=1,
        max_streams=1,
        max_health_streams=1,
        max_concurrent_rpcs=3,
        sections={"store": {"url": redis_server.url, "timeout": 10.0}},
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}")
    estimates = veil_pb2_grpc.EstimatesStub(channel)
    stream = estimates.Watch(veil_pb2.WatchRequest(metric="os"), timeout=30)
    assert next(stream).estimates
    health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next(health).status == health_pb2.HealthCheckResponse.SERVING
    sleeper = stall(redis_server.url, 1.5)
    pending = veil_pb2_grpc.CollectorStub(channel).Upload.future(make_upload("os", 10), timeout=10)  # the third
    time.sleep(0.3)
    with pytest.raises(grpc.RpcError) as err:
        estimates.Get(veil_pb2.EstimatesRequest(metric="os"), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    sleeper.join()
    assert pending.result().accepted == 10
    stream.cancel()
    health.cancel()
    assert counted(aggregator, "os") == 10


def stall(redis_url: str, seconds: float) -> threading.Thread:
    """Make Redis sleep (DEBUG SLEEP) for `seconds`, from a connection of its own; returns once
    the sleep has begun."""
    client = redis.Redis.from_url(redis_url, socket_timeout=seconds + 10)
    client.ping()
    thread = threading.Thread(target=lambda: (client.execute_command("DEBUG", "SLEEP", seconds), client.close()))
    thread.start()
    time.sleep(0.2)
    return thread


def retried(stub, batch: veil_pb2.UploadRequest) -> veil_pb2.UploadResponse:
    """Upload as the SDK retries: UNAVAILABLE again, with the same batch, within 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return stub.Upload(batch, timeout=10)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_write_that_outlives_its_deadline_counts_once_with_its_retry(start_aggregator, redis_server):
    aggregator = start_aggregator(redis_server.url, sections={"store": {"url": redis_server.url, "timeout": 10.0}})
    stub = collector(aggregator)
    batch = make_upload("browser", 300)
    # The handler is inside store.add when the deadline passes: 2 s is ample to get there on a
    # loaded machine (with 0.5 s a busy machine sometimes had it not yet writing, and it wrote
    # nothing), and Redis answers only after 4.
    sleeper = stall(redis_server.url, 4.0)
    with pytest.raises(grpc.RpcError) as err:
        stub.Upload(batch, timeout=2.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    sleeper.join()
    # The SDK's retries: the same batch id, again after UNAVAILABLE (a Redis asleep for 4 s also
    # failed the aggregator's store check, and uploads are refused until the next one passes).
    replies = [retried(stub, batch) for _ in range(3)]
    assert [r.duplicate for r in replies] == [True] * 3  # the first attempt's write had landed
    assert counted(aggregator, "browser") == 300


def test_a_call_that_expires_while_queued_writes_nothing_and_its_retry_counts_once(start_aggregator, redis_server):
    aggregator = start_aggregator(
        redis_server.url, workers=1, sections={"store": {"url": redis_server.url, "timeout": 10.0}}
    )
    stub = collector(aggregator)
    first, late = make_upload("browser", 300, seed=1), make_upload("browser", 200, seed=2)
    sleeper = stall(redis_server.url, 1.5)
    outcome = {}
    blocker = threading.Thread(target=lambda: outcome.update(first=stub.Upload(first, timeout=20)))
    blocker.start()  # holds the only worker, inside the stalled store
    time.sleep(0.2)
    with pytest.raises(grpc.RpcError) as err:
        stub.Upload(late, timeout=0.5)  # queued behind it; its deadline passes before a worker is free
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    blocker.join()
    sleeper.join()
    assert outcome["first"].accepted == 300
    time.sleep(0.5)  # whatever the late call was going to do, it has done
    registry = aggregator.instruments.registry
    assert registry.get_sample_value("veil_uploads_total", {"metric": "browser", "outcome": "accepted"}) == 1
    assert counted(aggregator, "browser") == 300
    reply = stub.Upload(late, timeout=10)  # its retry: counted now, once
    assert (reply.accepted, reply.duplicate) == (200, False) and counted(aggregator, "browser") == 500


class _Aborted(Exception):
    pass


class _EndedCall:
    """The ServicerContext of a call whose caller has gone (deadline passed or cancelled) by the
    time its handler runs; gRPC's own ends the same way (abort raises)."""

    def __init__(self) -> None:
        self.code = None

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 10.0

    def abort(self, code, details):
        self.code = code
        raise _Aborted(details)

    def set_trailing_metadata(self, metadata) -> None:
        pass

    def cancel(self) -> None:  # what the read deadline would do; the message is there at once
        raise AssertionError("the read deadline cancelled a call whose message was there")


def test_an_upload_whose_caller_is_gone_when_its_handler_runs_writes_nothing(start_aggregator):
    from collections import namedtuple

    from veil.aggregator.service import CollectorService

    aggregator = start_aggregator(sections={"auth": auth_section()})
    service = CollectorService(Ingest(aggregator.config, aggregator.store, aggregator.instruments))
    handler = grpc.unary_unary_rpc_method_handler(service.Upload)
    Details = namedtuple("Details", "method invocation_metadata")
    Metadatum = namedtuple("Metadatum", "key value")
    details = Details("/veil.wire.v1.Collector/Upload", (Metadatum("authorization", f"Bearer {UPLOAD_TOKEN}"),))
    wrapped = aggregator.interceptor.intercept_service(lambda _: handler, details)
    context = _EndedCall()
    with pytest.raises(_Aborted):
        wrapped.stream_unary(iter([make_upload("browser", 100)]), context)  # reads its request when it asks
    assert context.code == grpc.StatusCode.CANCELLED and counted(aggregator, "browser") == 0
    registry = aggregator.instruments.registry
    assert (
        registry.get_sample_value(
            "veil_calls_refused_total", {"method": "/veil.wire.v1.Collector/Upload", "code": "CANCELLED"}
        )
        == 1
    )
    assert registry.get_sample_value("veil_token_reports_rate_limited_total", {"token": "app-a"}) is None
