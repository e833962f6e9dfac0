"""The periods an estimate pools: c (reports_per_device) is reports_per_period times the periods
with data that the store recorded for the bucket, not the periods the wall clock has passed; the
estimand says what was pooled; a device reporting in several pooled periods is allowed for (its
memoized response repeated in each); buckets are provisional within max_lateness of their end."""

from __future__ import annotations

import os

import numpy as np
import pytest

from veil.aggregator.config import parse_config
from veil.aggregator.estimate import estimate
from veil.aggregator.live import LiveEstimates
from veil.aggregator.simulate import FastKeystream, count_reports, simulate_reports
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore, RedisStore, SqliteStore

DAY = 86400
START = 20_000 * DAY  # the start of period 20000 of a 1-day period
METRIC = {"name": "os", "labels": ["a", "b", "c", "d"], "mechanism": "krr", "epsilon": 1.0, "windows": ["total", "1d"]}


class Clock:
    def __init__(self) -> None:
        self.now = float(START)

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "memory":
        made = MemoryStore(clock=lambda: START)
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "veil.db", clock=lambda: START)
    else:
        made = RedisStore(request.getfixturevalue("redis_server").url)
    yield made
    made.close()


def setup(store, clock, lateness="25h"):
    config = parse_config(
        {"server": {"min_n": 20, "max_lateness": lateness}, "store": {"url": "memory"}, "metrics": [METRIC]}
    )
    live = LiveEstimates(config, store, clock=clock)
    store.observe_applied(live.applied)
    return config.metrics[0], live


def write(store, metric, reports: np.ndarray, period: int | None, at: float, spec=None) -> None:
    """One batch of these report rows, made in `period` (None: not said), into the total and the
    1d bucket of `at`; Store.since recorded first, as the collector does."""
    spec = metric.spec.mechanism
    store.since(metric.name, metric.spec.fingerprint, START)
    targets = tuple(
        (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(at)[0]), None) for w in metric.windows
    )
    counts = count_reports(spec, reports)
    assert store.add(BatchWrite(metric.name, os.urandom(16), counts, targets, 3600, period))


def total(live):
    (e,) = live.current("os", "total")
    return e


def test_total_pools_the_periods_with_data_not_those_the_clock_passed(store):
    clock = Clock()
    metric, live = setup(store, clock)
    spec = metric.spec.mechanism
    rows = simulate_reports(spec, np.arange(100) % 4, keystream=FastKeystream(1))
    write(store, metric, rows, 20000, START)
    first = total(live)
    assert (first.reports_per_device, first.periods) == (1, 1)
    clock.now = START + 6 * DAY + 5  # seven periods since counting began, still one with data
    later = total(live)
    assert (later.reports_per_device, later.periods) == (1, 1)
    assert later.estimand.endswith(", from the one period with reports of the 7 since counting began")
    np.testing.assert_array_equal(later.estimate.upper, estimate(spec, count_reports(spec, rows)).upper)
    # Data in three of the seven: pooled over those three, and it says so.
    write(store, metric, rows[:50], 20003, START + 3 * DAY)
    write(store, metric, rows[50:], 20006, START + 6 * DAY)
    three = total(live)
    assert (three.n, three.reports_per_device, three.periods) == (200, 3, 3)
    assert "pooled over the 3 periods with reports of the 7 since counting began" in three.estimand
    assert three.to_json()["periods"] == 3 and three.to_json()["provisional"] is True


def test_a_batch_that_does_not_say_its_period_allows_for_every_period_spanned(store):
    clock = Clock()
    metric, live = setup(store, clock)
    rows = simulate_reports(metric.spec.mechanism, np.arange(100) % 4, keystream=FastKeystream(2))
    write(store, metric, rows, 20000, START)
    write(store, metric, rows, None, START)
    clock.now = START + 4 * DAY + 5
    e = total(live)
    assert (e.reports_per_device, e.periods) == (5, 5)
    assert "pooled over the 5 periods since counting began" in e.estimand
    clock.now = START + 5 * DAY + 5  # a period began: a device may have reported again
    assert total(live).periods == 6


def test_a_late_batch_of_a_period_before_counting_began_still_counts_its_period(store):
    """A report made before Store.since (it arrived late) is a period with data too: c is the
    periods with data, never fewer (min with the span since counting began would undercount)."""
    clock = Clock()
    metric, live = setup(store, clock)
    rows = simulate_reports(metric.spec.mechanism, np.arange(60) % 4, keystream=FastKeystream(3))
    write(store, metric, rows, 20000, START)
    write(store, metric, rows, 19999, START)
    assert total(live).periods == 2


def test_buckets_are_provisional_until_max_lateness_after_their_end(store):
    clock = Clock()
    metric, live = setup(store, clock, lateness="2h")
    rows = simulate_reports(metric.spec.mechanism, np.arange(60) % 4, keystream=FastKeystream(4))
    write(store, metric, rows, 20000, START)
    clock.now = START + DAY + 3600  # the first day ended an hour ago: still within 2 h
    series = live.series("os", "1d", START)
    assert [(e.start, e.provisional) for e in series] == [(START, True), (START + DAY, True)]
    clock.now = START + DAY + 2 * 3600  # now it is final; the current day is not, nor the total
    series = live.series("os", "1d", START)
    assert [(e.start, e.provisional) for e in series] == [(START, False), (START + DAY, True)]
    assert series[0].to_json()["provisional"] is False
    assert all(e.provisional for e in live.current())


def test_counts_carried_forward_by_this_process_s_writes_carry_their_periods(tmp_path):
    """LiveEstimates follows its own writes (observe_applied) without reading the counts again:
    the periods come along, so c grows with a write of a new period."""
    store = SqliteStore(tmp_path / "veil.db", clock=lambda: START)
    try:
        clock = Clock()
        metric, live = setup(store, clock)
        rows = simulate_reports(metric.spec.mechanism, np.arange(60) % 4, keystream=FastKeystream(5))
        write(store, metric, rows, 20000, START)
        clock.now = START + 2 * DAY
        assert total(live).periods == 1
        reads = []
        versioned_read = store.versioned_read
        store.versioned_read = lambda keys, requests: reads.append(len(requests)) or versioned_read(keys, requests)
        write(store, metric, rows, 20002, START + 2 * DAY)
        e = total(live)
        assert (e.n, e.periods) == (120, 2) and reads == [0]  # the versions read, not the counts
    finally:
        store.close()


def pooled_trial(spec, values, present, seed):
    """Total counts of a fleet whose devices each send their memoized response (randomized once)
    in every period they are present (present: periods x devices), and the periods with data."""
    rows = simulate_reports(spec, values, keystream=FastKeystream(seed))
    times = present.sum(axis=0)
    return count_reports(spec, np.repeat(rows, times, axis=0)), times


def coverage(trials, devices, periods, presence, seed):
    """Through LiveEstimates: each trial a fresh fleet's responses written period by period; the
    share of trials whose total interval covers each category's pooled share, and the ratio of
    the served standard error to the estimates' spread across trials."""
    rng = np.random.default_rng(seed)
    config = parse_config({"server": {"min_n": 20}, "store": {"url": "memory"}, "metrics": [METRIC]})
    metric = config.metrics[0]
    spec = metric.spec.mechanism
    values = rng.choice(4, devices, p=[0.55, 0.3, 0.15, 0.0])
    present = rng.random((periods, devices)) < presence
    present[:, rng.random(devices) < 0.5] = False  # half the fleet reports in no period at all
    quiet = rng.choice(periods, periods // 2, replace=False)
    present[quiet] = False  # and no device in these periods: c counts only those with data
    truth = np.bincount(np.repeat(values, present.sum(axis=0)), minlength=4) / present.sum()
    covered, estimates, stderrs = np.zeros(4), [], []
    for trial in range(trials):
        store = MemoryStore(clock=lambda: START)
        clock = Clock()
        live = LiveEstimates(config, store, clock=clock)
        rows = simulate_reports(spec, values, keystream=FastKeystream(seed * 100_000 + trial))
        for p in range(periods):
            if present[p].any():
                clock.now = START + p * DAY
                write(store, metric, rows[present[p]], 20000 + p, clock.now)
        clock.now = START + periods * DAY - 1
        e = total(live)
        assert e.periods == periods - len(quiet) and e.reports_per_device == e.periods
        covered += (e.estimate.lower <= truth) & (truth <= e.estimate.upper)
        estimates.append(e.estimate.estimate)
        stderrs.append(e.estimate.stderr)
    spread = np.std(estimates, axis=0, ddof=1)
    return covered / trials, np.mean(stderrs, axis=0) / spread


def test_devices_reporting_in_several_pooled_periods_are_allowed_for():
    """Every present device sends the same memoized response in each of the pooled periods: the
    worst case c allows for. The served standard error is never below the estimates' spread
    (c counting fewer periods, e.g. one, would be 2x too narrow here), and intervals cover."""
    covered, ratio = coverage(trials=150, devices=600, periods=8, presence=0.9, seed=7)
    assert (ratio[:3] > 0.9).all(), ratio
    assert (covered[:3] >= 0.9).all(), covered


@pytest.mark.slow
@pytest.mark.parametrize(("periods", "presence"), [(4, 1.0), (8, 0.5), (14, 0.3)])
def test_coverage_of_total_holds_when_devices_report_in_some_periods(periods, presence):
    covered, ratio = coverage(trials=600, devices=800, periods=periods, presence=presence, seed=periods)
    assert (covered[:3] >= 0.93).all(), covered
    assert (ratio[:3] > 0.95).all(), ratio
