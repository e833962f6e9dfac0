"""Wire revision 2 from the Python SDK, against the loopback collector: when reports were made
(made_unix, batches per slot, kept on disk), several batches per UploadBatches call with a
revision-1 fallback, specs_version and the conditional check, the aggregator's clock, too_late,
and report() calls made before the first specs."""

from __future__ import annotations

import time

import grpc
import pytest
from loopback_collector import FAST, CollectorState
from veil_testing.waiting import wait_until

from veil.client import Counters, Reporter
from veil.wire.v1 import veil_pb2

T = 1_700_000_123.4  # a device clock: 2023-11-14T22:15:23.4Z
DAY = 86400


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each test runs over both transports (the collector's and the Reporter's)."""
    return request.param


class Clock:
    """A device clock the test sets (Unix seconds)."""

    def __init__(self, now: float = T) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def made(state: CollectorState) -> list[int]:
    with state.lock:
        return sorted(state.made.values())


def test_a_batch_says_the_start_of_the_slot_its_reports_were_made_in(ready_reporter, state):
    state.resolutions["browser"] = 3600  # a 1h window: finer than the day's period
    state.clock = clock = Clock()
    reporter = ready_reporter(clock=clock)
    reporter.report("browser", "edge")
    reporter.report("country", "c1")  # no resolution served: its period
    assert reporter.force_flush(10)
    assert made(state) == [int(T // DAY * DAY), int(T // 3600 * 3600)]


def test_reports_of_two_slots_travel_in_two_batches(ready_reporter, state):
    state.resolutions["browser"] = 3600
    state.clock = clock = Clock(1_700_002_700.0)  # 100 s before an hour's end
    reporter = ready_reporter(clock=clock, schedule_delay_ms=60_000)
    reporter.report("browser", "edge")
    clock.now += 200  # the next hour (within the aggregator's time and its allowance)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    assert made(state) == [1_699_999_200, 1_700_002_800]
    assert state.total("browser") == 2


def test_a_spooled_batch_keeps_when_its_reports_were_made(state, collector, tmp_path):
    state.resolutions["country"] = 3600
    state.clock = clock = Clock()
    with Reporter(collector.endpoint, queue_dir=tmp_path, clock=clock, **FAST) as first:
        assert first.wait_for_specs(10)
        collector.stop()
        first.report("country", "c2")
        assert not first.force_flush(0.3)
    clock.now += 3600  # the next start is an hour later, in the next slot
    collector.start()
    with Reporter(collector.endpoint, queue_dir=tmp_path, clock=clock, **FAST) as second:
        assert second.force_flush(10)
    assert made(state) == [int(T // 3600 * 3600)]


def test_due_batches_of_several_metrics_go_in_one_call(ready_reporter, state):
    reporter = ready_reporter(schedule_delay_ms=60_000)
    for metric, value in (("browser", "edge"), ("country", "c1"), ("theme", "dark"), ("opt_in", "no")):
        reporter.report(metric, value)
    assert reporter.force_flush(10)
    assert len(state.batch_calls) == 1 and len(state.batch_calls[0]) == 4
    assert reporter.counters() == Counters(accepted=4, sent=4)
    assert [state.total(m) for m in ("browser", "country", "theme", "opt_in")] == [1, 1, 1, 1]


def test_a_call_carries_at_most_max_batch_reports(ready_reporter, state):
    state.max_batch = 3
    reporter = ready_reporter(schedule_delay_ms=60_000)
    for metric in ("browser", "browser", "country", "country", "theme"):
        reporter.report(metric, 0)
    assert reporter.force_flush(10)
    # browser's 2 reports alone (an Upload: with country's they would be 4), then country's 2 and theme's 1
    assert [len(ids) for ids in state.batch_calls] == [2]
    with state.lock:
        for ids in state.batch_calls:
            assert sum(state.counted[i] for i in ids) <= 3
    assert state.total() == 5


def test_each_batch_result_is_handled_as_its_status_alone(ready_reporter, state):
    reporter = ready_reporter(schedule_delay_ms=60_000)
    state.fail_next(1, grpc.StatusCode.UNAVAILABLE)  # the first batch of the call: retried
    state.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)  # the second: final
    state.fail_next(1, grpc.StatusCode.OUT_OF_RANGE)  # the third: final, too late
    for metric, value in (("browser", "edge"), ("country", "c1"), ("theme", "dark"), ("opt_in", "no")):
        reporter.report(metric, value)
    assert not reporter.force_flush(10), "reports failed"
    first = state.batch_calls[0]
    assert len(first) == 4
    assert [outcome for _, outcome in state.calls] == [
        "UNAVAILABLE",
        "INVALID_ARGUMENT",
        "OUT_OF_RANGE",
        "counted",
        "counted",
    ]
    assert state.calls[-1][0] == first[0], "the retry is the same batch id"
    assert reporter.counters() == Counters(accepted=4, sent=2, failed=1, too_late=1, retried=1)


def test_a_call_refused_whole_is_retried_with_the_same_batches(ready_reporter, state):
    reporter = ready_reporter(schedule_delay_ms=60_000)
    state.call_faults.append(grpc.StatusCode.RESOURCE_EXHAUSTED)
    for metric, value in (("browser", "edge"), ("country", "c1")):
        reporter.report(metric, value)
    assert reporter.force_flush(10)
    assert len(state.batch_calls) == 2 and state.batch_calls[0] == state.batch_calls[1]
    assert reporter.counters() == Counters(accepted=2, sent=2, retried=2)
    assert state.total() == 2


def test_a_revision_1_aggregator_gets_one_upload_per_batch(ready_reporter, state):
    # Its specs answer says no specs_version: UploadBatches is never tried (with tokens such an
    # aggregator answers it PERMISSION_DENIED, not UNIMPLEMENTED: no token grants an unknown method).
    state.revision = 1
    reporter = ready_reporter(schedule_delay_ms=60_000)
    for metric, value in (("browser", "edge"), ("country", "c1"), ("theme", "dark")):
        reporter.report(metric, value)
    assert reporter.force_flush(10)
    assert state.batch_calls == []
    assert [outcome for _, outcome in state.calls] == ["counted"] * 3
    assert reporter.counters() == Counters(accepted=3, sent=3)
    assert 0 not in made(state), "the SDK says made_unix all the same (a revision-1 aggregator ignores it)"


def test_upload_batches_unimplemented_falls_back_to_upload_for_the_channels_life(ready_reporter, state):
    state.upload_batches = False
    reporter = ready_reporter(schedule_delay_ms=60_000)
    for _ in range(2):
        for metric, value in (("browser", "edge"), ("country", "c1"), ("theme", "dark")):
            reporter.report(metric, value)
        assert reporter.force_flush(10)
    assert len(state.batch_calls) == 1, "UploadBatches is asked once, then never again"
    assert [outcome for _, outcome in state.calls] == ["counted"] * 6
    assert reporter.counters() == Counters(accepted=6, sent=6)


def test_reports_older_than_the_aggregators_lateness_are_counted_as_too_late(ready_reporter, state):
    clock = Clock()
    state.clock = lambda: T + 3 * DAY  # the aggregator is three days on: beyond its 25 h lateness
    state.max_lateness = 25 * 3600
    reporter = ready_reporter(clock=clock)
    reporter.report("browser", "edge")
    assert not reporter.force_flush(10), "a report was refused for good"
    assert reporter.counters() == Counters(accepted=1, too_late=1)
    assert [outcome for _, outcome in state.calls] == ["OUT_OF_RANGE"]


def test_an_upload_answer_naming_another_specs_version_fetches_the_specs(ready_reporter, state):
    reporter = ready_reporter(spec_ttl_ms=3_600_000)
    calls = state.spec_calls
    with state.lock:
        state.specs = [s for s in state.specs if s.name != "country"]
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    assert wait_until(lambda: "country" not in reporter.metrics)
    assert state.spec_calls == calls + 1


def test_the_periodic_spec_check_is_conditional_and_keeps_the_specs(ready_reporter, state):
    reporter = ready_reporter(spec_ttl_ms=20)
    assert state.wait_for(lambda: state.unchanged_answers >= 3)
    with state.lock:
        versions = state.if_versions[1:]
    assert set(versions) == {state.specs_version}, "every check after the first names the version held"
    assert set(reporter.metrics) == {s.name for s in state.specs}
    reporter.report("browser", "edge")
    assert reporter.force_flush(10) and state.total("browser") == 1


def test_the_aggregators_clock_is_held_for_the_ledger(ready_reporter, state):
    state.clock = lambda: 2_000_000_000.0
    state.max_lateness = 25 * 3600
    reporter = ready_reporter()
    said = reporter._specs.server_now()  # the accessor the ledger bounds the device's clock by
    assert said is not None and said >= 2_000_000_000.0  # the aggregator's (2033), not this machine's clock
    assert reporter._specs.max_lateness == 25 * 3600


def test_a_revision_1_aggregator_says_no_time(ready_reporter, state):
    state.revision = 1
    reporter = ready_reporter()
    assert reporter._specs.server_now() is None and reporter._specs.version == ""


def test_calls_before_the_first_specs_wait_and_are_randomized_as_made(state, collector):
    collector.stop()  # a first start offline
    state.resolutions["browser"] = 3600
    state.clock = clock = Clock()
    with Reporter(collector.endpoint, clock=clock, max_queue_size=3, **FAST) as reporter:
        for value in ("edge", "safari", "chrome", "firefox"):
            reporter.report("browser", value)
        reporter.report("nope", "x")
        assert reporter.counters() == Counters(queued=3, dropped=2), "bounded: the queue holds 3"
        clock.now += 3600  # the specs arrive an hour later, in the next slot
        collector.start()
        assert reporter.wait_for_specs(10)
        assert reporter.force_flush(10) is False, "calls were dropped since the start"
        assert reporter.counters() == Counters(accepted=3, sent=3, dropped=2)
    assert made(state) == [int(T // 3600 * 3600)]  # one batch, of the slot the calls were made in
    assert state.total("browser") == 3


def test_a_call_before_the_first_specs_is_checked_for_misuse_at_once(state, collector):
    collector.stop()
    with Reporter(collector.endpoint, **FAST) as reporter:
        with pytest.raises(ValueError):
            reporter.report("browser", object())  # type: ignore[arg-type]
        assert reporter.counters() == Counters()


def test_a_batch_spooled_by_the_previous_sdk_is_still_sent(state, collector, tmp_path):
    # The outbox's files did not change: an UploadRequest without made_unix, named as before.
    spec = state.by_name("country")
    batch_id = bytes(range(16))
    request = veil_pb2.UploadRequest(batch_id=batch_id, metric=spec.name, spec_fingerprint=spec.fingerprint, count=1)
    request.index_sets.set_size = 1
    request.index_sets.indices = (3).to_bytes(4, "little")
    outbox = tmp_path / "outbox"
    outbox.mkdir(mode=0o700, parents=True)
    (outbox / f"{int(time.time() * 1000):013d}-1-{batch_id.hex()}.batch").write_bytes(request.SerializeToString())
    with Reporter(collector.endpoint, queue_dir=tmp_path, **FAST) as reporter:
        assert reporter.force_flush(10)
        assert reporter.counters() == Counters(sent=1)
    assert state.made[batch_id] == 0 and state.total("country") == 1


def test_a_call_held_before_the_first_specs_is_reported_by_the_device_that_made_it(state, collector):
    collector.stop()
    with Reporter(collector.endpoint, **FAST) as reporter:
        device = reporter.simulated_device()  # its own ledger and memo, the Reporter's queue
        device.report("browser", "edge")
        device.report("country", "c1")
        reporter.report("browser", "safari")
        collector.start()
        assert reporter.wait_for_specs(10) and reporter.force_flush(10)
        assert {m: s.reports for m, s in device.privacy_spent().items() if s.reports} == {"browser": 1, "country": 1}
        assert {m: s.reports for m, s in reporter.privacy_spent().items() if s.reports} == {"browser": 1}
    assert state.total() == 3
