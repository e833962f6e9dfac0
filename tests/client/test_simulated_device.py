"""Reporter.simulated_device: many devices in one process (veil demo's), each with its own
device secret, memo and privacy ledger, sending through one Reporter's queue and connection."""

from __future__ import annotations

import threading

from veil.mechanism import MetricSpec


def test_simulated_devices_keep_their_own_ledgers_and_memos_and_share_one_connection(ready_reporter, state):
    # One report of the metric per device and period, the SDK's default rule.
    state.specs = [MetricSpec.create("browser", ["chrome", "safari", "edge", "firefox"], "subset", epsilon=1.0)]
    uplink = ready_reporter(max_queue_size=1000)
    threads = threading.active_count()
    devices = [uplink.simulated_device() for _ in range(40)]
    assert threading.active_count() == threads  # no worker thread, no channel of their own
    for device in devices:
        for _ in range(5):  # the app calls again and again; each device's ledger lets one out
            device.report("browser", "safari")
    assert uplink.force_flush(10)
    assert state.total("browser") == 40
    counters = uplink.counters()  # the shared queue's
    assert (counters.sent, counters.limited) == (40, 40 * 4)
    for device in devices:
        spent = device.privacy_spent()["browser"]
        assert (spent.reports, spent.period_epsilon) == (1, 1.0)
    assert uplink.privacy_spent()["browser"].reports == 0  # the Reporter's own ledger is its own too


def test_each_simulated_device_memoizes_with_its_own_secret(ready_reporter, state):
    uplink = ready_reporter(max_queue_size=5000)
    devices = [uplink.simulated_device() for _ in range(30)]
    for device in devices:
        for _ in range(20):
            device.report("page", "p5")
    assert uplink.force_flush(10)
    # Each device repeats its own response (its memo); C(64, q) makes a coincidence all but impossible.
    assert sorted(state.distinct("page").values()) == [20] * 30
