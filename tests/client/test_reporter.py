"""Reporter end to end against the loopback collector: valid batches, misuse, counters."""

from __future__ import annotations

import logging

import grpc
import pytest
from loopback_collector import MANY
from veil_testing.waiting import wait_until

from veil.client import Counters, Reporter, ReporterError, UnknownCategoryError, UnknownMetricError
from veil.mechanism import MetricSpec


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each test runs over both transports (the collector's and the Reporter's)."""
    return request.param


def test_reports_arrive_as_valid_batches_of_every_design(ready_reporter, state):
    reporter = ready_reporter(max_batch_size=7)
    for name in ("browser", "screen", "theme", "country", "opt_in", "page"):
        spec = state.by_name(name)
        for i in range(20):
            reporter.report(name, spec.labels[i % spec.k] if i % 2 else i % spec.k)
    assert reporter.force_flush(10)
    for name in ("browser", "screen", "theme", "country", "opt_in", "page"):
        assert state.total(name) == 20
    # 20 reports of a metric in batches of at most 7 (how many depends on when the worker woke).
    assert len(state.counted) >= 6 * 3 and max(state.counted.values()) <= 7
    assert all(outcome == "counted" for _, outcome in state.calls)
    assert reporter.counters() == Counters(accepted=120, sent=120)


def test_every_batch_has_a_fresh_16_byte_id_and_one_metric(ready_reporter, state):
    reporter = ready_reporter()
    for _ in range(3):
        reporter.report("browser", "edge")
        reporter.report("country", "c1")
        assert reporter.force_flush(10)
    ids = [batch_id for batch_id, _ in state.calls]
    assert len(ids) == 6 and len(set(ids)) == 6 and all(len(i) == 16 for i in ids)


def test_misuse_whatever_the_specs_raises_value_errors_without_the_value(ready_reporter):
    reporter = ready_reporter()
    with pytest.raises(UnknownMetricError) as error:
        reporter.report(["browser"], "edge")
    assert isinstance(error.value, ReporterError) and isinstance(error.value, ValueError)
    for metric in ("browser", "nope"):
        # (A number that is no index, -1 or 2.5, is a number a numeric metric could take: test_numeric.)
        for bad in (True, None, object(), float("nan")):
            with pytest.raises(UnknownCategoryError) as error:
                reporter.report(metric, bad)
            assert str(error.value).count(".") == 1  # one plain sentence
    assert reporter.counters() == Counters()


def test_a_metric_or_category_the_specs_lack_is_dropped_counted_and_logged_once(ready_reporter, caplog):
    # A misspelt name and a metric an operator removed look the same to a running app: the
    # host must not break because of what the aggregator declares.
    reporter = ready_reporter()
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        for _ in range(3):
            reporter.report("nope", "x")
            reporter.report("browser", "opera-secret")
            reporter.report("browser", 4)
    assert reporter.counters() == Counters(dropped=9)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("no Veil metric named 'nope'" in m for m in messages) == 1
    assert sum("not a category of Veil metric 'browser'" in m for m in messages) == 1
    assert not any("opera-secret" in m for m in messages)


def test_a_metric_removed_while_the_app_runs_is_dropped_not_raised(ready_reporter, state, caplog):
    reporter = ready_reporter(spec_ttl_ms=1)  # fetch the specs again at every turn
    reporter.report("country", "c1")
    assert reporter.force_flush(10)
    with state.lock:
        state.specs = [s for s in state.specs if s.name != "country"]
    assert wait_until(lambda: "country" not in reporter.metrics)
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        reporter.report("country", "c1")
    assert reporter.counters() == Counters(accepted=1, sent=1, dropped=1)
    assert not reporter.force_flush(10), "a dropped report makes the flush answer False"
    assert any("no Veil metric named 'country'" in r.getMessage() for r in caplog.records)


def test_numpy_style_integer_indices_are_accepted(ready_reporter, state):
    class Index:
        def __index__(self) -> int:
            return 2

    reporter = ready_reporter()
    reporter.report("browser", Index())
    assert reporter.force_flush(10) and state.total("browser") == 1


def test_without_any_spec_calls_wait_within_the_queue_bound_and_are_dropped_at_shutdown(caplog):
    # Nothing listens on port 1: the aggregator has been unreachable since start.
    with Reporter("127.0.0.1:1", tls=False, retry_initial_backoff_ms=5, max_queue_size=150) as reporter:
        with caplog.at_level(logging.WARNING, logger="veil.client"):
            for _ in range(100):
                reporter.report("browser", "firefox")
                reporter.report("anything", "x")
        assert reporter.counters() == Counters(queued=150, dropped=50)
        assert sum("queue is full" in r.getMessage() for r in caplog.records) == 1
        assert not reporter.shutdown(0.5)
        assert reporter.counters() == Counters(dropped=200)


def test_a_full_queue_drops_the_newest_reports_and_counts_them(ready_reporter, state):
    state.fail_next(1000, grpc.StatusCode.UNAVAILABLE)
    reporter = ready_reporter(max_queue_size=10, max_batch_size=5)
    for _ in range(25):
        reporter.report("browser", "chrome")
    counters = reporter.counters()
    assert counters.accepted == 10 and counters.dropped == 15 and counters.queued == 10
    state.faults.clear()
    assert not reporter.force_flush(10), "reports were dropped"
    after = reporter.counters()
    assert (after.accepted, after.dropped, after.sent, after.failed, after.queued) == (10, 15, 10, 0, 0)
    assert state.total("browser") == 10


def test_counters_snapshot_is_read_only_and_a_dict(ready_reporter):
    counters = ready_reporter().counters()
    with pytest.raises(AttributeError):
        counters.sent = 3  # type: ignore[misc]
    names = "accepted dropped sent retried failed queued limited over_budget too_late ledger_unavailable clipped"
    assert counters.as_dict() == dict.fromkeys(names.split(), 0)


def test_reports_after_shutdown_are_dropped(ready_reporter, state):
    reporter = ready_reporter()
    reporter.report("browser", "safari")
    assert reporter.shutdown(5)
    reporter.report("browser", "safari")
    assert reporter.counters() == Counters(accepted=1, dropped=1, sent=1)
    assert reporter.shutdown(5) and not reporter.force_flush(1)
    assert state.total("browser") == 1


def test_shutdown_without_queue_dir_drops_and_counts_what_is_left(make_reporter, collector):
    reporter = make_reporter()
    assert reporter.wait_for_specs(10)
    collector.stop()
    for _ in range(5):
        reporter.report("browser", "safari")
    assert not reporter.shutdown(0.5)
    # The worker drops what is left when its last call ends, at the deadline shutdown returned at.
    assert wait_until(lambda: reporter.counters().queued == 0)
    counters = reporter.counters()
    assert (counters.accepted, counters.dropped, counters.sent, counters.queued) == (5, 5, 0, 0)


def test_the_metrics_property_lists_verified_specs(ready_reporter, state):
    reporter = ready_reporter()
    assert {name: spec.fingerprint for name, spec in reporter.metrics.items()} == {
        s.name: s.fingerprint for s in state.specs
    }


def test_a_spec_whose_fingerprint_does_not_match_is_refused(state, make_reporter, caplog):
    good = state.by_name("browser")
    forged = MetricSpec.create("forged", ["a", "b", "c"], "subset", epsilon=1.0)
    object.__setattr__(forged, "fingerprint", "0" * 32)  # what the aggregator claims
    state.specs.append(forged)
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        reporter = make_reporter()
        assert reporter.wait_for_specs(10)
        assert "forged" not in reporter.metrics and good.name in reporter.metrics
        reporter.report("forged", "a")  # dropped and counted, not raised: the aggregator is at fault
    assert reporter.counters().dropped == 1
    assert any("forged" in r.getMessage() and "fingerprint" in r.getMessage() for r in caplog.records)


def test_stale_fingerprint_fails_the_batch_and_refetches_specs(ready_reporter, state):
    reporter = ready_reporter()
    calls_before = state.spec_calls
    # The aggregator changes the metric's epsilon: the device's batch under the old spec is stale.
    index = next(i for i, s in enumerate(state.specs) if s.name == "browser")
    with state.lock:
        state.specs[index] = MetricSpec.create(
            "browser", ["chrome", "safari", "edge", "firefox"], "subset", 2.0, reports_per_period=MANY
        )
    reporter.report("browser", "edge")
    assert not reporter.force_flush(10)
    assert reporter.counters() == Counters(accepted=1, failed=1)
    assert state.wait_for(lambda: state.spec_calls > calls_before)
    assert wait_until(lambda: reporter.metrics["browser"].mechanism.epsilon == 2.0)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10) and state.total("browser") == 1


@pytest.mark.parametrize(
    ("code", "counted_as"), [(grpc.StatusCode.INVALID_ARGUMENT, "failed"), (grpc.StatusCode.OUT_OF_RANGE, "too_late")]
)
def test_what_can_never_succeed_fails_the_batch_without_retry(ready_reporter, state, code, counted_as):
    reporter = ready_reporter()
    state.fail_next(1, code)
    reporter.report("country", "c3")
    assert not reporter.force_flush(10), "the flush is done, but a report failed"
    assert reporter.counters() == Counters(accepted=1, **{counted_as: 1})
    assert [outcome for _, outcome in state.calls] == [code.name]


def test_bearer_token_travels_in_call_metadata(state, make_reporter):
    state.token = "s3cret-token"
    good = make_reporter(token="s3cret-token")
    assert good.wait_for_specs(10)
    good.report("browser", "edge")
    assert good.force_flush(10) and state.total("browser") == 1
    bad = make_reporter(token="wrong")
    assert not bad.wait_for_specs(0.5)


def test_no_log_record_carries_values_or_tokens(state, make_reporter, collector, caplog):
    state.token = "tok-abc"
    with caplog.at_level(logging.DEBUG, logger="veil.client"):
        reporter = make_reporter(token="tok-abc")
        assert reporter.wait_for_specs(10)
        state.fail_next(3, grpc.StatusCode.UNAVAILABLE)
        state.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
        for label in ("safari", "firefox"):
            reporter.report("browser", label)
        reporter.force_flush(10)
        collector.stop()
        reporter.report("browser", "safari")
        reporter.shutdown(0.5)
    text = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    assert caplog.records
    for secret in ("tok-abc", "safari", "firefox"):
        assert secret not in text


def test_a_refused_token_keeps_the_batches_and_says_so_not_outage(ready_reporter, state, caplog):
    state.token = "the-first-token"
    reporter = ready_reporter(token="the-first-token")
    state.token = "the-rotated-token"  # an operator rotated it and the app was not updated yet
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        for _ in range(5):
            reporter.report("browser", "edge")
        assert not reporter.force_flush(0.5)
    assert reporter.counters().queued == 5 and reporter.counters().failed == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("refused the Veil token (UNAUTHENTICATED)" in m for m in messages)
    # Never told as an outage (a call that times out under load may be, as what it is).
    assert not any(m.startswith("Veil upload failed (UNAUTHENTICATED") for m in messages)
    state.token = "the-first-token"  # the operator puts it back: the kept batches go
    assert reporter.force_flush(10) and state.total("browser") == 5


def test_a_fetch_with_a_wrong_token_is_logged_as_a_token_problem(make_reporter, state, caplog):
    state.token = "the-right-token"
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        reporter = make_reporter(token="a-wrong-token")
        assert not reporter.wait_for_specs(0.5)
        reporter.report("browser", "edge")
        assert not reporter.force_flush(1)
    messages = [r.getMessage() for r in caplog.records]
    assert any("refused the Veil token (UNAUTHENTICATED) when fetching" in m for m in messages)
    assert reporter.counters() == Counters(queued=1)  # the call waits for specs


def test_shutdown_says_all_delivered_only_when_true(ready_reporter, state, caplog):
    state.fail_next(1000, grpc.StatusCode.UNAVAILABLE)
    reporter = ready_reporter(max_queue_size=5, max_batch_size=5)
    for _ in range(8):
        reporter.report("browser", "chrome")
    state.faults.clear()
    with caplog.at_level(logging.INFO, logger="veil.client"):
        assert not reporter.shutdown(5)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("all reports delivered" in m for m in messages)
    assert any(
        "Veil Reporter shut down: 5 report(s) sent, 3 dropped, 0 failed, 0 too late, 0 unsent." in m for m in messages
    )
