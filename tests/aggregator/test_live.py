"""LiveEstimates: every estimate it serves is, bit for bit, estimate() of the counts the store holds
for the bucket and version it names, however the counts were read (versions first, or read along
with the versions when they were changing), on both stores; unchanged buckets are not recomputed;
a changing bucket on Redis costs one round trip."""

from __future__ import annotations

import os

import numpy as np
import pytest

from veil.aggregator.config import parse_config
from veil.aggregator.estimate import estimate
from veil.aggregator.live import LiveEstimates
from veil.aggregator.simulate import simulate_counts
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore, RedisStore

METRICS = [
    {"name": "big", "labels": [f"c{j}" for j in range(1024)], "mechanism": "subset", "epsilon": 1.0,
     "windows": ["total", "1h", "1d"]},
    {"name": "flags", "labels": [f"f{j}" for j in range(12)], "mechanism": "rappor", "epsilon": 2.0,
     "windows": ["total", "1h"]},
    {"name": "os", "labels": ["a", "b", "c", "d"], "mechanism": "krr", "epsilon": 1.0},
]
START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        made = MemoryStore(clock=lambda: START)  # nothing expires during a test
    else:
        made = RedisStore(request.getfixturevalue("redis_server").url)
    yield made
    made.close()


def setup(store, clock, min_n=50):
    config = parse_config({"server": {"min_n": min_n}, "store": {"url": "memory"}, "metrics": METRICS})
    return config, LiveEstimates(config, store, clock=clock)


def add(store, metric, reports, now, seed):
    """A batch of `reports` randomized reports of `metric` into every window's current bucket."""
    spec = metric.spec.mechanism
    values = np.random.default_rng(seed).integers(0, spec.k, reports)
    targets = tuple((CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), None)
                    for w in metric.windows)
    assert store.add(BatchWrite(metric.name, os.urandom(16), simulate_counts(spec, values), targets, 3600))


def assert_exact(store, config, served, min_n=50):
    """Each WindowEstimate is estimate() of what the store holds now for its bucket: the same
    float64 bits in every array (NaN where undefined included), the same n and version."""
    for e in served:
        metric = e.metric
        spec = metric.spec.mechanism
        key = CountsKey(metric.name, metric.spec.fingerprint, e.window.name, e.start)
        counts = store.read(key, spec.weight_law().weights, spec.k)
        assert (e.version, e.n) == (store.versions([key])[0], counts.total)
        if counts.total < max(min_n, 2):
            assert e.withheld
            continue
        reference = estimate(spec, counts, project=True)
        for name in ("estimate", "stderr", "lower", "upper", "projection"):
            assert getattr(e.estimate, name).tobytes() == getattr(reference, name).tobytes(), (e.window.name, name)


def test_served_estimates_are_exactly_those_of_the_stored_counts(store):
    clock = Clock()
    config, live = setup(store, clock)
    big, flags, os_metric = config.metrics
    assert all(e.withheld and e.n == 0 for e in live.current())
    steps = [
        [(big, 1000), (flags, 300), (os_metric, 80)],
        [(big, 10)],                      # big was changing: read along with the versions
        [],                               # nothing changed: all cached
        [(flags, 40), (os_metric, 5)],    # changed unexpectedly: read after the versions
        [(big, 10), (flags, 10)],
        [(big, 7)],
    ]
    for step, adds in enumerate(steps):
        for metric, reports in adds:
            add(store, metric, reports, clock.now, seed=step * 10 + reports)
        before = {(e.metric.name, e.window.name): e for e in live.current()}
        for request in [(None, None), ("big", None), ("flags", "1h"), (None, "total"), ("os", "total")]:
            served = live.current(*request)
            assert_exact(store, config, served)
            # What did not change since the call above is the very same object.
            assert all(e is before[e.metric.name, e.window.name] for e in served)
    clock.now += 3600  # a new hour: the 1h windows start afresh, the others go on
    add(store, big, 20, clock.now, seed=99)
    served = live.current()
    assert_exact(store, config, served)
    hour = [e for e in served if e.window.name == "1h"]
    assert [e.start for e in hour] == [int(clock.now // 3600) * 3600] * 2 and all(e.withheld for e in hour)


class Spy:
    """Records the store calls LiveEstimates makes, by name, and counts a RedisStore's round
    trips (pipeline executions)."""

    def __init__(self, store) -> None:
        self.calls: list[str] = []
        self.round_trips = 0
        self.depth = 0
        for name in ("versions", "read", "read_many", "versions_and_read"):
            method = getattr(store, name)
            setattr(store, name, self._wrap(name, method))
        if isinstance(store, RedisStore):
            pipeline = store._redis.pipeline

            def counted(*args, **kwargs):
                pipe = pipeline(*args, **kwargs)
                execute = pipe.execute

                def run(*a, **kw):
                    self.round_trips += 1
                    return execute(*a, **kw)

                pipe.execute = run
                return pipe

            store._redis.pipeline = counted

    def _wrap(self, name, method):
        def call(*args, **kwargs):
            if self.depth == 0:  # LiveEstimates' calls, not those the store makes of itself
                self.calls.append(name)
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1

        return call

    def take(self):
        calls, round_trips = self.calls, self.round_trips
        self.calls, self.round_trips = [], 0
        return calls, round_trips


def test_changing_counts_are_read_with_the_versions(store):
    clock = Clock()
    config, live = setup(store, clock)
    big = config.metrics[0]
    add(store, big, 1000, clock.now, seed=1)
    spy = Spy(store)
    live.current("big")
    assert spy.take()[0] == ["versions", "read_many"]  # first sight: versions, then the stale counts
    for seed in range(2, 5):
        add(store, big, 10, clock.now, seed=seed)
        spy.take()
        served = live.current("big")
        calls, round_trips = spy.take()
        assert calls == ["versions_and_read"]
        if isinstance(store, RedisStore):
            assert round_trips == 1
        assert_exact(store, config, served)
    spy.take()
    before = live.current("big")
    # Unchanged after all: the counts read along are dropped, nothing is recomputed...
    assert spy.take()[0] == ["versions_and_read"] and live.current("big") == before
    # ...and from then on only the versions are read.
    assert spy.take()[0] == ["versions"]
