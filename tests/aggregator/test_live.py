"""LiveEstimates: every estimate it serves is, bit for bit, estimate() of the counts the store holds
for the bucket and version it names, however the counts were read (versions first, or read along
with the versions when they were changing), on both stores; unchanged buckets are not recomputed;
a changing bucket on Redis costs one round trip; a bucket only this process wrote to since it
was last read (observe_applied) is not read at all, however other processes write to the same
Redis around it."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from veil.aggregator.config import parse_config
from veil.aggregator.errors import StoreUnavailable
from veil.aggregator.estimate import estimate
from veil.aggregator.live import LiveEstimates
from veil.aggregator.simulate import simulate_counts
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore, RedisStore
from veil.aggregator.store._redis import counts_key

METRICS = [
    {
        "name": "big",
        "labels": [f"c{j}" for j in range(1024)],
        "mechanism": "subset",
        "epsilon": 1.0,
        "windows": ["total", "1h", "1d"],
    },
    {
        "name": "flags",
        "labels": [f"f{j}" for j in range(12)],
        "mechanism": "rappor",
        "epsilon": 2.0,
        "windows": ["total", "1h"],
    },
    {"name": "os", "labels": ["a", "b", "c", "d"], "mechanism": "krr", "epsilon": 1.0},
]
START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis", "cluster"])
def store(request):
    if request.param == "memory":
        made = MemoryStore(clock=lambda: START)  # nothing expires during a test
    else:  # a cluster splits each bucket over shards: versions are tuples, counts summed
        made = RedisStore(request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster").url)
    yield made
    made.close()


def setup(store, clock, min_n=50):
    config = parse_config({"server": {"min_n": min_n}, "store": {"url": "memory"}, "metrics": METRICS})
    return config, LiveEstimates(config, store, clock=clock)


def batch(metric, reports, now, seed, batch_id=None):
    """A batch of `reports` randomized reports of `metric` into every window's current bucket."""
    spec = metric.spec.mechanism
    values = np.random.default_rng(seed).integers(0, spec.k, reports)
    targets = tuple(
        (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), None) for w in metric.windows
    )
    return BatchWrite(metric.name, batch_id or os.urandom(16), simulate_counts(spec, values), targets, 3600)


def add(store, metric, reports, now, seed):
    assert store.add(batch(metric, reports, now, seed))


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
        [(big, 10)],  # big was changing: read along with the versions
        [],  # nothing changed: all cached
        [(flags, 40), (os_metric, 5)],  # changed unexpectedly: read after the versions
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
        self.requests = 0  # buckets whose counts LiveEstimates asked for
        self.round_trips = 0
        self.depth = 0
        for name in ("versions", "read", "read_many", "versioned_read"):
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
                if name in ("read_many", "versioned_read"):
                    self.requests += len(args[-1])
                elif name == "read":
                    self.requests += 1
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1

        return call

    def take(self):
        calls, round_trips = self.calls, self.round_trips
        self.calls, self.round_trips, self.requests = [], 0, 0
        return calls, round_trips


def test_changing_counts_are_read_with_the_versions(store):
    clock = Clock()
    config, live = setup(store, clock)
    big = config.metrics[0]
    add(store, big, 1000, clock.now, seed=1)
    spy = Spy(store)
    live.current("big")
    # First sight: versions, then the stale counts (with the versions they are at).
    assert spy.requests == 3 and spy.take()[0] == ["versioned_read", "versioned_read"]
    for seed in range(2, 5):
        add(store, big, 10, clock.now, seed=seed)  # not observed by live: as if another process wrote
        spy.take()
        served = live.current("big")
        assert spy.requests == 3
        calls, round_trips = spy.take()
        assert calls == ["versioned_read"]
        if isinstance(store, RedisStore):
            assert round_trips == 1
        assert_exact(store, config, served)
    spy.take()
    before = live.current("big")
    # Unchanged after all: the counts read along are dropped, nothing is recomputed...
    assert spy.requests == 3 and spy.take()[0] == ["versioned_read"] and live.current("big") == before
    # ...and from then on only the versions are read.
    assert spy.requests == 0 and spy.take()[0] == ["versioned_read"]


def fresh_get_reads_nothing(spy, live, store, config, what=None):
    """live.current(what) costs one round trip, versions only, and serves exact estimates."""
    spy.take()
    served = live.current(what)
    requests, (calls, round_trips) = spy.requests, spy.take()
    assert_exact(store, config, served)
    assert (requests, calls, round_trips) == (0, ["versioned_read"], 1)
    return served


@pytest.mark.parametrize(("where", "coalesce"), [("redis_server", 64), ("redis_server", 1), ("redis_cluster", 64)])
def test_own_writes_are_followed_without_reading_the_counts(request, where, coalesce):
    """On a cluster each write changes one shard of each bucket (its version at that shard)."""
    store = RedisStore(request.getfixturevalue(where).url, coalesce=coalesce)
    clock = Clock()
    config, live = setup(store, clock)
    store.observe_applied(live.applied)
    big, flags, _ = config.metrics
    add(store, big, 1000, clock.now, seed=1)
    spy = Spy(store)
    live.current()
    assert spy.requests == 6  # every bucket read once, with its version
    live.current()  # first sight counts as a change: read along with the versions once more
    versions = {e.version for e in live.current("big")}
    for seed in range(2, 6):
        add(store, big, 10 * seed, clock.now, seed=seed)
        add(store, flags, 70, clock.now, seed=seed)
        served = fresh_get_reads_nothing(spy, live, store, config)
        versions.add(served[0].version)  # a new one: the windows of one write share its version
        assert [e.version for e in served if e.metric is big] == [served[0].version] * 3
    assert len(versions) == 5
    # A duplicate changes nothing; the estimates stay cached.
    write = batch(big, 30, clock.now, seed=9)
    assert store.add(write) and not store.add(write)
    before = fresh_get_reads_nothing(spy, live, store, config)
    assert [id(e) for e in live.current()] == [id(e) for e in before]
    # A new hour: the 1h bucket is new, read once; then followed again.
    clock.now += 3600
    add(store, big, 20, clock.now, seed=10)
    spy.take()
    assert_exact(store, config, live.current("big"))
    add(store, big, 20, clock.now, seed=11)
    fresh_get_reads_nothing(spy, live, store, config, "big")
    store.close()


def test_two_writers_on_one_redis_serve_exactly_the_stored_counts(make_redis_server):
    """Two aggregator processes (stores, each followed by its own LiveEstimates) write to one
    Redis, interleaved, with duplicates and a write whose WAIT fails: after every step each
    serves exactly the stored counts, and a fresh read after only its own writes reads none."""
    server = make_redis_server()
    clock = Clock()
    one, two = RedisStore(server.url), RedisStore(server.url)
    waiting = RedisStore(server.url, wait_replicas=1, wait_timeout_ms=20, coalesce=1)  # no replica: WAIT fails
    config, live_one = setup(one, clock)
    _, live_two = setup(two, clock)
    _, plain = setup(RedisStore(server.url), clock)  # follows no writes: always reads
    one.observe_applied(live_one.applied)
    waiting.observe_applied(live_one.applied)  # the same process, another connection
    two.observe_applied(live_two.applied)
    big, flags, os_metric = config.metrics
    spy_one, spy_two = Spy(one), Spy(two)
    written = []

    def check():
        for live in (live_one, live_two, plain):
            assert_exact(one, config, live.current())
        served = [
            [(e.version, e.n, None if e.withheld else e.estimate.estimate.tobytes()) for e in live.current()]
            for live in (live_one, live_two, plain)
        ]
        assert served[0] == served[1] == served[2]

    check()
    steps = [
        (one, big, 1000),
        (one, big, 10),
        (two, big, 20),
        (one, big, 30),
        (one, flags, 200),
        (two, flags, 5),
        (two, big, 7),
        (one, big, 8),
        ("dup", big, 0),
        (one, big, 9),
        ("wait", big, 40),
        (one, big, 11),
        ("wait", flags, 60),
        ("dup", flags, 0),
        (two, os_metric, 100),
        (one, os_metric, 3),
        (one, big, 12),
        (two, big, 13, "quiet"),
        (one, big, 14),
        ("wait", big, 15, "quiet"),
        (one, big, 16),
        (one, flags, 17, "quiet"),
        (two, flags, 18, "quiet"),
        (one, flags, 19),
        (two, big, 20, "quiet"),
        ("dup", big, 0, "quiet"),
        (one, big, 21),
    ]
    missed = set()  # metrics written since live_one last read them, unseen by it
    for step, (writer, metric, reports, *quiet) in enumerate(steps):
        if writer == "dup":  # a batch the other process applied, retried here: counted once
            assert one.add(written[-1]) is False and two.add(written[-1]) is False
        elif writer == "wait":
            write = batch(metric, reports, clock.now, seed=step)
            with pytest.raises(StoreUnavailable, match="replicas"):
                waiting.add(write)  # applied, but not acknowledged: no version followed
            written.append(write)
        else:
            write = batch(metric, reports, clock.now, seed=step)
            assert writer.add(write)
            written.append(write)
        if writer in (two, "wait"):
            missed.add(metric.name)
        if quiet:
            continue  # no reads until the next step's writes
        spy_one.take()
        spy_two.take()
        if writer is one and missed:  # also written elsewhere since: read again, exactly
            live_one.current()
            assert spy_one.requests > 0
            missed.clear()
        elif writer is one:
            fresh_get_reads_nothing(spy_one, live_one, one, config)
        elif writer is two:
            fresh_get_reads_nothing(spy_two, live_two, two, config)
        else:
            live_one.current()
            assert spy_one.requests > 0 or writer == "dup"
            missed.clear()
        if writer is two:
            missed.clear()  # check() reads through live_one too
        check()


def test_counts_rolled_back_and_grown_again_are_read_again(make_redis_server):
    """Redis loses writes (a failover to a replica that had not received them, or a restore of an
    older dump) and another process writes as many batches again, with other counts: the number
    of batches is back where it was, yet the estimates served are those of the counts stored now,
    also after this process's own next write, which follows what it knows."""
    server = make_redis_server()
    clock = Clock()
    one, two = RedisStore(server.url), RedisStore(server.url)
    config, live = setup(one, clock)
    one.observe_applied(live.applied)
    big = config.metrics[0]
    raw = one._redis
    add(one, big, 300, clock.now, seed=1)
    names = [counts_key(CountsKey(big.name, big.spec.fingerprint, w.name, w.bucket(clock.now)[0])) for w in big.windows]
    saved = [raw.dump(name) for name in names]  # what a replica had received
    add(one, big, 200, clock.now, seed=2)
    assert_exact(one, config, live.current())
    for name, dumped in zip(names, saved):  # failover: the second batch is lost
        raw.restore(name, 0, dumped, replace=True)
    add(two, big, 900, clock.now, seed=3)  # another process: two batches again, other counts
    assert [int(raw.hget(name, "batches")) for name in names] == [2] * 3
    assert_exact(one, config, live.current())
    add(one, big, 50, clock.now, seed=4)
    assert_exact(one, config, live.current())


def test_concurrent_writers_and_readers_serve_the_counts_of_the_version_they_name(make_redis_server):
    """Uploads through two processes' stores and reads of both, all at once: every estimate
    served names a version, and is the same as every other estimate served for that version
    (LiveEstimates that follow no writes read counts and versions atomically: the reference)."""
    server = make_redis_server()
    clock = Clock()
    one, two = RedisStore(server.url), RedisStore(server.url)
    config, live_one = setup(one, clock)
    _, live_two = setup(two, clock)
    _, plain = setup(RedisStore(server.url), clock)
    one.observe_applied(live_one.applied)
    two.observe_applied(live_two.applied)
    big = config.metrics[0]
    seen: dict[tuple[str, int], tuple] = {}
    clash = []
    stop = threading.Event()

    def write(store, seed):
        for i in range(40):
            assert store.add(batch(big, 10 + i, clock.now, seed=seed * 1000 + i))

    def read(live):
        while not stop.is_set():
            for e in live.current("big"):
                got = (e.n, None if e.withheld else e.estimate.estimate.tobytes())
                if seen.setdefault((e.window.name, e.version), got) != got:
                    clash.append((e.window.name, e.version))

    writers = [threading.Thread(target=write, args=(s, i)) for i, s in enumerate((one, one, two))]
    readers = [threading.Thread(target=read, args=(live,)) for live in (live_one, live_one, live_two, plain)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not clash
    for live in (live_one, live_two, plain):
        assert_exact(one, config, live.current())
    assert [e.n for e in live_one.current("big")] == [40 * 3 * 10 + 3 * sum(range(40))] * 3


def test_the_daemon_follows_its_own_writes(redis_server, start_aggregator):
    aggregator = start_aggregator(redis_server.url)
    metric = aggregator.config.metrics[0]
    live, store = aggregator.live, aggregator.store
    spy = Spy(store)
    add(store, metric, 500, time.time(), seed=1)
    live.current()
    add(store, metric, 500, time.time(), seed=2)
    spy.take()
    live.current(metric.name)
    assert spy.requests == 0
