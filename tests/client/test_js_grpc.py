"""The TypeScript SDK over gRPC against the loopback collector at revision 2 (its HTTP side has
client/js/test/revision2.test.ts): several batches per UploadBatches call, each result handled
alone, too late, the UNIMPLEMENTED fallback, made_unix and the conditional specs check."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from loopback_collector import CollectorServer, CollectorState
from veil_testing.node import NodeReporter

FOUR = (("browser", "edge"), ("country", "c1"), ("theme", "dark"), ("opt_in", "no"))


@pytest.fixture
def node(collector: CollectorServer) -> Iterator[Callable[..., NodeReporter]]:
    started: list[NodeReporter] = []

    def start(**options: object) -> NodeReporter:
        options = {"scheduleDelayMs": 60_000, "retryInitialBackoffMs": 5, "retryMaxBackoffMs": 50, **options}
        started.append(NodeReporter(grpc=collector.endpoint, **options))
        return started[-1]

    yield start
    for reporter in started:
        reporter.close()


def report_four(reporter: NodeReporter) -> dict:
    for metric, value in FOUR:
        reporter.report(metric, value)
    return reporter.ask(do="flush", timeoutMs=10_000)


def test_due_batches_go_in_one_upload_batches_call_and_say_their_slot(node, state: CollectorState):
    state.resolutions["browser"] = 3600
    before = time.time()
    answer = report_four(node())
    assert answer["ok"] and answer["counters"]["sent"] == 4
    assert [len(ids) for ids in state.batch_calls] == [4]
    with state.lock:
        made = {state.calls[i][0]: state.made[state.calls[i][0]] for i in range(4)}
    browser = state.batch_calls[0][0]
    assert made[browser] in (before // 3600 * 3600, time.time() // 3600 * 3600)
    assert all(m % 86400 == 0 for batch_id, m in made.items() if batch_id != browser)


def test_each_result_is_handled_as_its_status_alone(node, state: CollectorState):
    reporter = node()
    assert reporter.ask(do="flush", timeoutMs=10_000)["ok"]  # the specs are known
    codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)
    for code in codes:
        state.fail_next(1, code)
    answer = report_four(reporter)
    assert answer["ok"] is False
    counters = answer["counters"]
    assert (counters["sent"], counters["failed"], counters["tooLate"], counters["retried"]) == (2, 1, 1, 1)
    # The first three batches of the call refused (retried, final, too late), the fourth counted,
    # then the first again, alone.
    assert [outcome for _, outcome in state.calls] == [code.name for code in codes] + ["counted"] * 2
    assert state.calls[-1][0] == state.batch_calls[0][0], "the retry is the same batch id"


def test_upload_batches_unimplemented_falls_back_for_the_channels_life(node, state: CollectorState):
    state.upload_batches = False
    reporter = node()
    for _ in range(2):
        answer = report_four(reporter)
        assert answer["ok"]
    assert len(state.batch_calls) == 1
    assert [outcome for _, outcome in state.calls] == ["counted"] * 8
    assert answer["counters"]["retried"] == 0


def test_a_revision_1_collector_is_never_asked_for_upload_batches(node, state: CollectorState):
    state.revision = 1
    answer = report_four(node())
    assert answer["ok"] and state.batch_calls == []
    assert [outcome for _, outcome in state.calls] == ["counted"] * 4


def test_the_specs_are_checked_with_the_version_held(node, state: CollectorState):
    node(specTtlMs=20)
    assert state.wait_for(lambda: state.unchanged_answers >= 2)
    with state.lock:
        assert set(state.if_versions[1:]) == {state.specs_version}
