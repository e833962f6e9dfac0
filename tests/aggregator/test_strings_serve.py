"""Strings metrics end to end (issue 28, docs/protocol.md 10): devices of the real SDK report
strings to a real aggregator, which runs the seven rounds period by period and finds the values
many devices hold, and nothing else. In process on a simulated clock (eight periods in seconds), and,
in the slow suite, 20,000 devices against `veil serve` on the wall clock."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from veil_testing.running import InProcessAggregators, SimulatedTime, estimates

from veil.client import Reporter
from veil.mechanism import ROUNDS, SeededRandomSource, code_text, round_name, string_code

FAST = dict(tls=False, schedule_delay_ms=20, retry_initial_backoff_ms=5, retry_max_backoff_ms=50, spec_ttl_ms=100)
PERIOD = 3600
START = 1_900_000_000 // PERIOD * PERIOD  # in the future: the memory store's retention goes by the wall clock


def population(planted: dict[str, float], n: int, seed: int) -> list[str]:
    """n devices' values: each planted one with its share, the rest each a value of its own."""
    rng = random.Random(seed)
    values = []
    for _ in range(n):
        x = rng.random()
        for text, share in planted.items():
            if x < share:
                values.append(text)
                break
            x -= share
        else:
            values.append(f"crash at 0x{rng.getrandbits(48):012x}")
    return values


def found(endpoint: str, metric: str) -> tuple[dict[str, tuple[float, float, float]], float]:
    """What the aggregator found: {shown text: (estimate, lower, upper)}, and the floor."""
    (window,) = estimates(endpoint, metric).estimates
    assert not window.withheld, window.reason
    values = {v.text: (v.estimate, v.lower, v.upper) for v in window.strings.values}
    return values, window.strings.floor


@pytest.fixture
def clock() -> SimulatedTime:
    return SimulatedTime(START)


@pytest.fixture
def aggregators() -> Iterator[InProcessAggregators]:
    made = InProcessAggregators()
    yield made
    made.stop_all()


PLANTED = {"SIGBUS": 0.3, "OOM": 0.2, "NullPointerException at Foo.bar": 0.15}


def test_devices_reporting_strings_through_every_round_find_the_common_values_and_nothing_else(clock, aggregators):
    strings = {"name": "crash", "type": "strings", "epsilon": 8.0, "period": f"{PERIOD}s"}
    aggregator = aggregators.start(sections={"metrics": [strings]}, clock=clock, min_n=1, http="")
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    reporter = Reporter(
        endpoint, clock=clock, elapsed_clock=clock, random_source=SeededRandomSource(3), max_queue_size=10_000, **FAST
    )
    try:
        values = population(PLANTED, 3000, seed=1)
        devices = [reporter] + [reporter.simulated_device() for _ in values[1:]]
        for period in range(ROUNDS + 1):
            clock.now = START + period * PERIOD + PERIOD // 2  # past the period's settling
            # Until the device holds the period's rounds, as the aggregator serves them (the
            # simulated clock stands still: the device's next check would never come).
            serving = {m.name: m.spec.fingerprint for m in aggregator.rounds.current(clock.now)}
            assert set(serving) == {round_name("crash", r) for r in range(min(period, ROUNDS - 1) + 1)}
            deadline = time.monotonic() + 30
            while (reporter._specs.answered_at() or 0) < START + period * PERIOD or {
                name: spec.fingerprint for name, spec in reporter.metrics.items()
            } != serving:
                assert time.monotonic() < deadline, "the device never held the period's rounds"
                time.sleep(0.01)
            for device, value in zip(devices, values):
                device.report("crash", value)
            # False while rounds open: the values of rounds not served yet waited, and were
            # dropped as their period ended (counted: honest); once every round is served, none.
            flushed = reporter.force_flush(30)
        assert flushed and reporter.counters().failed == 0  # none came too late for its period
    finally:
        reporter.shutdown(5)
    shown, floor = found(endpoint, "crash")
    # The truth: the shares among the devices of the verification round (a seventh of them, drawn
    # by their secrets), whose answers the estimates are made of.
    verifying = [v for d, v in zip(devices, values) if d._memo.round("crash") == ROUNDS - 1]
    truth = {code_text(string_code(text)): verifying.count(text) / len(verifying) for text in PLANTED}
    assert set(shown) == set(truth), (shown, floor)  # the hashed long one as "#..."
    for text, (estimate, lower, upper) in shown.items():
        assert lower <= truth[text] <= upper and estimate >= floor


@pytest.mark.slow
def test_twenty_thousand_devices_through_veil_serve_find_five_planted_values_and_nothing_else(serve_process, tmp_path):
    """The issue's end-to-end scale: 20,000 devices of the SDK, epsilon 8, five planted strings,
    against `veil serve` (SQLite) on the wall clock, 4-second periods, for ROUNDS + 2 (nine) periods."""
    planted = {
        "SIGBUS": 0.15,
        "ANR": 0.1,
        "OOM": 0.07,
        "NullPointerException in FeedAdapter.bind": 0.05,
        "E_TIMEOUT": 0.04,
    }
    period = 4
    strings = {"name": "crash", "type": "strings", "epsilon": 8.0, "period": f"{period}s"}
    server = serve_process(f"sqlite:///{tmp_path}/veil.db", sections={"metrics": [strings]}, server={"min_n": 1})
    server.start()
    endpoint = f"127.0.0.1:{server.grpc_port}"
    reporter = Reporter(endpoint, random_source=SeededRandomSource(5), max_queue_size=50_000, **FAST)
    try:
        assert reporter.wait_for_specs(30)
        values = population(planted, 20_000, seed=2)
        devices = [reporter] + [reporter.simulated_device() for _ in values[1:]]
        end = (int(time.time() // period) + ROUNDS + 2) * period
        turn = -1
        while time.time() < end:
            now = int(time.time() // period)
            if now != turn and time.time() - now * period > 1:  # a second in: the rounds are fixed
                turn = now
                for device, value in zip(devices, values):
                    device.report("crash", value)
                reporter.force_flush(30)  # False while rounds open: waiting values expire, counted
            time.sleep(0.05)
    finally:
        reporter.shutdown(5)
    shown, floor = found(endpoint, "crash")
    verifying = [v for d, v in zip(devices, values) if d._memo.round("crash") == ROUNDS - 1]
    truth = {code_text(string_code(text)): verifying.count(text) / len(verifying) for text in planted}
    assert set(shown) == set(truth), (shown, floor)
    for text, (estimate, lower, upper) in shown.items():
        assert lower <= truth[text] <= upper and estimate >= floor
