"""Batching, retries and exactly-once delivery against a real server (gRPC and HTTP) that
fails, dies and comes back."""

from __future__ import annotations

import collections
import threading
import time

import grpc
import pytest
from veil_testing.waiting import wait_until

from veil.client import Counters


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each test runs over both transports (the collector's and the Reporter's)."""
    return request.param


# Everything a retry can turn into success: a store refusing writes (UNAVAILABLE), a server
# draining at SIGTERM (CANCELLED), a server bug or proxy (INTERNAL, UNKNOWN), a token an
# operator can fix (UNAUTHENTICATED, PERMISSION_DENIED).
@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    ],
)
def test_five_retryable_failures_then_ok_count_the_batch_once(ready_reporter, state, code):
    reporter = ready_reporter()
    state.fail_next(5, code)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    ids = [batch_id for batch_id, _ in state.calls]
    assert len(set(ids)) == 1, "every retry resends the same batch id"
    assert [outcome for _, outcome in state.calls] == [code.name] * 5 + ["counted"]
    assert state.total("browser") == 1
    assert reporter.counters() == Counters(accepted=1, sent=1, retried=5)


def test_a_rate_limited_upload_waits_as_long_as_the_aggregator_asks(ready_reporter, state):
    state.retry_after_ms = 400  # far beyond the backoff of these settings (at most 50 ms)
    state.fail_next(1, grpc.StatusCode.RESOURCE_EXHAUSTED)
    reporter = ready_reporter(schedule_delay_ms=1)
    reporter.report("browser", "edge")
    assert state.wait_for(lambda: len(state.calls) == 1)
    refused_at = time.monotonic()
    assert state.wait_for(lambda: len(state.calls) == 2)
    assert time.monotonic() - refused_at >= 0.35
    assert [outcome for _, outcome in state.calls] == ["RESOURCE_EXHAUSTED", "counted"]


def test_a_lost_acknowledgement_is_resent_with_the_same_id_and_counted_once(ready_reporter, state):
    reporter = ready_reporter(schedule_delay_ms=60_000)  # one batch, sent by the flush
    state.lost_acks = 1
    for _ in range(10):
        reporter.report("screen", "s3")
    assert reporter.force_flush(10)
    (batch_id,) = {b for b, _ in state.calls}
    assert [o for _, o in state.calls] == ["UNAVAILABLE", "duplicate"]
    assert state.counted == {batch_id: 10} and state.total("screen") == 10
    assert reporter.counters() == Counters(accepted=10, sent=10, retried=1)


def test_killing_the_server_mid_stream_loses_and_duplicates_nothing(ready_reporter, state, collector):
    reporter = ready_reporter(max_batch_size=50, max_queue_size=10_000)
    for i in range(500):
        reporter.report("page", i % 64)
    assert reporter.force_flush(10)
    # Hold the next upload inside the server, kill the server while it is in flight, and let
    # the held call reach the store afterwards: counted, but its acknowledgement is lost.
    in_flight, release = threading.Event(), threading.Event()
    state.gate = (in_flight, release)
    for i in range(500):
        reporter.report("page", (7 * i) % 64)
    assert in_flight.wait(10)
    collector.stop(meanwhile=release.set)
    for i in range(300):  # the app keeps reporting while the aggregator is down
        reporter.report("page", (3 * i) % 64)
    assert not reporter.force_flush(0.2)
    collector.start()
    assert reporter.force_flush(20)

    assert state.total("page") == 1300 == sum(state.counted.values())
    outcomes = collections.defaultdict(list)
    for batch_id, outcome in state.calls:
        outcomes[batch_id].append(outcome)
    # Every batch id was counted exactly once; the one in flight was resent under its own id.
    assert all(
        o.count("counted") + (batch_id in state.counted and "counted" not in o) == 1 for batch_id, o in outcomes.items()
    )
    assert any("duplicate" in o for o in outcomes.values())
    counters = reporter.counters()
    assert (counters.accepted, counters.sent, counters.failed, counters.dropped, counters.queued) == (
        1300,
        1300,
        0,
        0,
        0,
    )
    assert counters.retried >= 1


def test_report_never_waits_for_a_hung_upload(ready_reporter, state):
    reporter = ready_reporter(max_batch_size=5)
    in_flight, release = threading.Event(), threading.Event()
    state.gate = (in_flight, release)
    reporter.report("country", "c0")
    assert in_flight.wait(10)
    # The worker is stuck in the upload; report() still returns at once, every time.
    for _ in range(200):
        reporter.report("country", "c1")
    assert reporter.counters().accepted == 201
    release.set()
    assert reporter.force_flush(10) and state.total("country") == 201


def test_the_worker_never_raises_into_the_app(ready_reporter, state, monkeypatch):
    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args))
    reporter = ready_reporter()
    from veil.client import _worker

    transport_class = type(reporter._processor.transport)
    real_upload = transport_class.upload

    def broken_upload(self, payload, timeout):
        raise RuntimeError("a bug in the transport")

    monkeypatch.setattr(transport_class, "upload", broken_upload)
    reporter.report("browser", "chrome")
    assert not reporter.force_flush(0.3)  # an unknown error may pass: the batch is kept and retried
    assert reporter.counters().queued == 1 and reporter.counters().retried >= 1

    monkeypatch.setattr(transport_class, "upload", real_upload)
    assert reporter.force_flush(10) and state.total("browser") == 1
    monkeypatch.setattr(_worker, "encode_batch", lambda *a: 1 / 0)
    reporter.report("browser", "chrome")
    assert not reporter.force_flush(10)  # flushed, but a report failed
    assert reporter.counters().failed == 1

    monkeypatch.undo()
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args))
    reporter.report("browser", "chrome")
    assert reporter.force_flush(10)
    counters = reporter.counters()
    assert (counters.accepted, counters.sent, counters.failed, counters.queued) == (3, 2, 1, 0)
    assert state.total("browser") == 2 and not escaped


def test_batches_split_by_size_and_by_time(ready_reporter, state):
    reporter = ready_reporter(max_batch_size=10, schedule_delay_ms=60_000)
    for _ in range(30):  # full batches go without waiting for the schedule
        reporter.report("opt_in", "yes")
    # The worker takes the queue whenever it holds a full batch, with whatever came in meanwhile
    # (under load it may take 13, then 10): what is left waiting is less than a batch, never more.
    assert wait_until(lambda: (c := reporter.counters()).sent >= 21 and c.sent + c.queued == 30)
    waiting = reporter.counters().queued
    reporter.report("opt_in", "no")  # a lone report waits for the schedule, or a flush
    assert reporter.counters().queued == waiting + 1 and reporter.counters().sent == 30 - waiting
    assert reporter.force_flush(10) and state.total("opt_in") == 31


def test_batches_fit_the_largest_batch_the_aggregator_accepts(ready_reporter, state):
    state.max_batch = 7
    reporter = ready_reporter(max_batch_size=512, schedule_delay_ms=60_000)
    for i in range(50):
        reporter.report("page", i % 64)
    assert reporter.force_flush(10)
    assert [outcome for _, outcome in state.calls] == ["counted"] * 8  # 7 batches of 7, one of 1
    assert state.total("page") == 50 and reporter.counters() == Counters(accepted=50, sent=50)


def test_a_batch_made_before_the_aggregator_lowered_its_limit_fails_once(ready_reporter, state):
    reporter = ready_reporter(max_batch_size=20, schedule_delay_ms=60_000, spec_ttl_ms=20)
    state.fail_next(1000, grpc.StatusCode.UNAVAILABLE)  # keep the batch of 20 in the outbox
    for i in range(20):
        reporter.report("page", i)
    assert wait_until(lambda: reporter.counters().retried > 0)
    with state.lock:
        state.faults.clear()
        state.max_batch = 5
    # Refused by the new limit, it is failed at once rather than retried until the horizon.
    assert wait_until(lambda: reporter.counters().failed == 20)
    for i in range(10):
        reporter.report("page", i)
    assert not reporter.force_flush(10), "20 reports failed since the start"
    assert state.total("page") == 10


def test_specs_are_refetched_after_their_ttl_and_stale_ones_still_serve(ready_reporter, state, collector):
    reporter = ready_reporter(spec_ttl_ms=20)
    assert state.wait_for(lambda: state.spec_calls >= 3)
    collector.stop()
    before = state.spec_calls
    reporter.report("browser", "safari")  # past its TTL and unrefreshable: still used
    assert reporter.counters().accepted == 1
    collector.start()
    assert reporter.force_flush(10) and state.total("browser") == 1
    assert state.wait_for(lambda: state.spec_calls > before)


@pytest.mark.parametrize("transport", ["http"])
def test_http_calls_share_one_kept_alive_connection(ready_reporter, state, collector):
    reporter = ready_reporter(spec_ttl_ms=20)
    for i in range(5):
        reporter.report("browser", i % 4)
        assert reporter.force_flush(10)
    assert state.wait_for(lambda: state.spec_calls >= 3)  # conditional checks between the uploads
    assert len(state.calls) == 5 and collector.connections_accepted == 1
