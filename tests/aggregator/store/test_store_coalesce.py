"""Group commit: the Coalescer on its own, and RedisStore writing groups of batches in one
script call, exactly once per batch id (repeated ids inside a group, ids applied before,
concurrent duplicates, Redis failing or stalling under a group)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

import pytest
import redis
from store_cases import PATIENT, batch, batches_added, doubled, key, random_counts
from veil_testing.waiting import wait_until

from veil.aggregator.counts import Counts
from veil.aggregator.errors import StoreError, StoreUnavailable
from veil.aggregator.store import RedisStore
from veil.aggregator.store._coalesce import Coalescer
from veil.aggregator.store._redis import counts_key, dedupe_key
from veil.aggregator.store._redis.store import _ADD_BATCH

WAIT = 10  # seconds any thread of a test may take


def run_threads(targets: Sequence[Callable[[], object]]) -> list[object]:
    """Run each callable in its own thread; its result, or the exception it raised."""
    results: list[object] = [None] * len(targets)

    def run(i: int) -> None:
        try:
            results[i] = targets[i]()
        except BaseException as error:  # noqa: BLE001
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    return results


class Gate:
    """A flush function that records its groups and, while closed, holds the first call until
    opened (so that the callers arriving meanwhile queue up behind it)."""

    def __init__(self, answer: Callable[[Sequence[object]], Sequence[object]] = lambda ws: [w for w in ws]) -> None:
        self.groups: list[list[object]] = []
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.answer = answer
        self._lock = threading.Lock()

    def __call__(self, writes: Sequence[object]) -> Sequence[object]:
        with self._lock:
            self.groups.append(list(writes))
        self.entered.set()
        assert self.opened.wait(WAIT)
        return self.answer(writes)


# --- the Coalescer on its own -------------------------------------------------------------


def test_a_lone_write_is_flushed_at_once_by_its_own_caller():
    gate = Gate()
    gate.opened.set()
    coalescer = Coalescer(gate)
    seen: list[tuple[int, float, bool]] = []
    coalescer.observe(lambda *args: seen.append(args))
    assert coalescer.submit("g", "w1") == "w1"
    assert coalescer.submit("g", "w2") == "w2"
    assert gate.groups == [["w1"], ["w2"]]
    assert [(batches, failed) for batches, _, failed in seen] == [(1, False), (1, False)]


def test_writes_arriving_during_a_flush_go_out_together_in_order():
    gate = Gate()
    coalescer = Coalescer(gate, max_batches=64)
    first = threading.Thread(target=coalescer.submit, args=("g", "first"))
    first.start()
    assert gate.entered.wait(WAIT)
    queued = [f"w{i}" for i in range(20)]

    def submit(write: str) -> Callable[[], object]:
        return lambda: coalescer.submit("g", write)

    threads = [threading.Thread(target=submit(w)) for w in queued]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: len(coalescer._queues["g"]) == len(queued), WAIT, 0.005)  # noqa: SLF001 (the first was taken)
    gate.opened.set()
    first.join(WAIT)
    for thread in threads:
        thread.join(WAIT)
    assert gate.groups[0] == ["first"]
    assert len(gate.groups) == 2 and sorted(gate.groups[1]) == sorted(queued)
    assert not coalescer._queues  # noqa: SLF001 (the group retired)


def test_every_caller_gets_its_own_result_and_groups_are_capped():
    gate = Gate(answer=lambda ws: [f"done {w}" for w in ws])
    coalescer = Coalescer(gate, max_batches=4)
    holder = threading.Thread(target=coalescer.submit, args=("g", "hold"))
    holder.start()
    assert gate.entered.wait(WAIT)
    writes = [f"w{i}" for i in range(10)]
    results: dict[str, object] = {}

    def submit(write: str) -> None:
        results[write] = coalescer.submit("g", write)

    threads = [threading.Thread(target=submit, args=(w,)) for w in writes]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: len(coalescer._queues["g"]) == 10, WAIT, 0.005)  # noqa: SLF001
    gate.opened.set()
    for thread in [holder, *threads]:
        thread.join(WAIT)
    assert results == {w: f"done {w}" for w in writes}
    assert [len(g) for g in gate.groups] == [1, 4, 4, 2]


def test_a_failed_flush_fails_every_caller_of_its_group_and_the_next_group_still_goes():
    class Down(StoreUnavailable):
        pass

    calls = []
    opened = threading.Event()

    def flush(writes):
        calls.append(list(writes))
        if len(calls) == 2:
            raise Down("redis went away")
        if len(calls) == 1:
            assert opened.wait(WAIT)  # held until the three below have queued behind it
        return list(writes)

    coalescer = Coalescer(flush)
    seen: list[bool] = []
    coalescer.observe(lambda batches, seconds, failed: seen.append(failed))
    holder = threading.Thread(target=coalescer.submit, args=("g", "hold"))
    holder.start()
    assert wait_until(lambda: calls, WAIT, 0.005)
    results: dict[str, object] = {}

    def submit(write: str) -> None:
        try:
            results[write] = coalescer.submit("g", write)
        except Down as error:
            results[write] = error

    threads = [threading.Thread(target=submit, args=(w,)) for w in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: len(coalescer._queues["g"]) == 3, WAIT, 0.005)  # noqa: SLF001 (the first was taken)
    opened.set()
    for thread in [holder, *threads]:
        thread.join(WAIT)
        assert not thread.is_alive()
    failures = list(results.values())
    # The three arrived during the first flush, so all three were the failed second group.
    assert len(calls) == 2 and sorted(calls[1]) == ["a", "b", "c"]
    assert len(failures) == 3 and all(isinstance(f, Down) and str(f) == "redis went away" for f in failures)
    assert len({id(f) for f in failures}) == 3  # each caller raises its own copy
    assert seen == [False, True]
    assert coalescer.submit("g", "later") == "later"  # the group is usable again


def test_groups_do_not_wait_for_each_other():
    gate = Gate()
    other = []
    coalescer = Coalescer(lambda ws: gate(ws) if ws[0] == "slow" else other.extend(ws) or list(ws))
    slow = threading.Thread(target=coalescer.submit, args=("a", "slow"))
    slow.start()
    assert gate.entered.wait(WAIT)
    assert coalescer.submit("b", "fast") == "fast"  # while group "a" is still held
    gate.opened.set()
    slow.join(WAIT)
    assert other == ["fast"]


def test_a_set_goes_out_whole_with_what_else_fits_and_gets_its_results_in_order():
    gate = Gate(answer=lambda ws: [f"done {w}" for w in ws])
    coalescer = Coalescer(gate, max_batches=4)
    holder = threading.Thread(target=coalescer.submit, args=("g", "hold"))
    holder.start()
    assert gate.entered.wait(WAIT)
    results: dict[str, object] = {}
    sets = {"s": ["s1", "s2", "s3"], "big": [f"b{i}" for i in range(6)], "one": ["o1"], "two": ["t1", "t2"]}

    def submit_set(name: str) -> None:
        results[name] = coalescer.submit_many("g", sets[name])

    for queued, name in enumerate(sets, 1):  # queued in this order
        threading.Thread(target=submit_set, args=(name,)).start()
        assert wait_until(lambda q=queued: len(coalescer._queues["g"]) == q, WAIT, 0.005)  # noqa: SLF001
    gate.opened.set()
    holder.join(WAIT)
    assert wait_until(lambda: len(results) == len(sets), WAIT, 0.005)
    assert results == {name: [f"done {w}" for w in writes] for name, writes in sets.items()}
    # Whole sets, up to 4 writes a call, none split; a set larger than that goes alone.
    assert gate.groups == [["hold"], ["s1", "s2", "s3"], [f"b{i}" for i in range(6)], ["o1", "t1", "t2"]]
    assert coalescer.submit_many("g", []) == ()


def test_a_failed_flush_fails_a_whole_set():
    def flush(writes):
        raise StoreUnavailable("redis went away")

    with pytest.raises(StoreUnavailable, match="went away"):
        Coalescer(flush).submit_many("g", ["a", "b"])


def test_max_batches_must_be_positive():
    with pytest.raises(ValueError):
        Coalescer(lambda ws: ws, max_batches=0)


# --- RedisStore: groups in one script call -------------------------------------------------


@pytest.fixture
def stores(redis_server):
    made: list[RedisStore] = []

    def make(**options: object) -> RedisStore:
        made.append(RedisStore(redis_server.url, **{**PATIENT, **options}))
        return made[-1]

    yield make
    for store in made:
        store.close()


@pytest.fixture
def raw(redis_server):
    with redis.Redis.from_url(redis_server.url) as client:
        yield client


def dedupe_keys(args) -> list[bytes]:
    """The dedupe keys among a script call's arguments (one Resp when pre-encoded)."""
    if len(args) == 1 and hasattr(args[0], "data"):
        return [a for a in args[0].data.split(b"\r\n") if b":b:" in a]
    return [a.encode() for a in args if isinstance(a, str) and ":b:" in a]


def hold_first_script_call(store: RedisStore) -> tuple[threading.Event, threading.Event, list[int]]:
    """Make the store's first script call wait until `release` is set (`entered` says it is
    waiting); records how many batch ids every call carries."""
    entered, release, sizes = threading.Event(), threading.Event(), []
    script = store._add_batch  # noqa: SLF001

    def held(keys, args, client=None):
        sizes.append(len(dedupe_keys(args)))
        if len(sizes) == 1:
            entered.set()
            assert release.wait(WAIT)
        return script(keys, args, client=client) if client is not None else script(keys, args)

    store._add_batch = held  # noqa: SLF001
    return entered, release, sizes


def add_concurrently(
    store: RedisStore, writes, *, before_release: Callable[[], object] = lambda: None
) -> tuple[list[object], list[int]]:
    """One write goes first and is held in its script call until all the others are queued
    behind it; then before_release() runs, and they go. Returns each write's outcome (its result
    or the exception it raised) and the ids per script call."""
    entered, release, sizes = hold_first_script_call(store)
    outcomes: list[object] = [None] * len(writes)

    def add(i: int) -> None:
        try:
            outcomes[i] = store.add(writes[i])
        except BaseException as error:  # noqa: BLE001
            outcomes[i] = error

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(writes))]
    threads[0].start()
    assert entered.wait(WAIT)
    for thread in threads[1:]:
        thread.start()
    coalescer = store._coalescer  # noqa: SLF001
    assert wait_until(
        lambda: sum(len(q) for q in coalescer._queues.values()) == len(writes) - 1,  # noqa: SLF001
        WAIT,
        0.005,
    )
    before_release()
    release.set()
    for thread in threads:
        thread.join(WAIT)
    return outcomes, sizes


def test_concurrent_batches_go_in_one_script_call_and_count_exactly(stores, rng):
    store = stores()
    hour = (key(window="1h", bucket=3600), int(time.time()) + 3600)
    writes = [batch(random_counts((2,), 40, rng), key(), hour) for _ in range(30)]
    flushes: list[tuple[int, bool]] = []
    store.observe_flushes(lambda batches, seconds, failed: flushes.append((batches, failed)))
    outcomes, sizes = add_concurrently(store, writes)
    assert outcomes == [True] * 30
    assert sizes == [1, 29]  # the held one, then everyone who queued behind it
    assert flushes == [(1, False), (29, False)]
    total = Counts((2,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), (2,), 40) == total
    assert store.read(hour[0], (2,), 40) == total
    assert batches_added(store, [key(), hour[0]]) == [30, 30]
    assert all(store.add(w) is False for w in writes)  # every id was remembered


def test_a_repeated_id_in_a_group_and_an_id_applied_before_count_once(stores, rng, raw):
    store = stores()
    done_before = batch(random_counts((1,), 8, rng), key())
    assert store.add(done_before)
    fresh = [batch(random_counts((1,), 8, rng), key()) for _ in range(4)]
    repeat = batch(doubled(fresh[1].counts, 3), key(), batch_id=fresh[1].batch_id)  # same id, other counts
    again = batch(doubled(done_before.counts), key(), batch_id=done_before.batch_id)
    writes = [batch(random_counts((1,), 8, rng), key()), fresh[0], fresh[1], repeat, again, fresh[2], fresh[3]]
    outcomes, sizes = add_concurrently(store, writes)
    assert outcomes == [True, True, True, False, False, True, True]
    # The group: its first call named the id applied before and added nothing; the second call
    # added the rest. The repeated id was sent once.
    assert sizes == [1, 5, 4]
    counted = [done_before, writes[0], *fresh]
    total = Counts((1,), sum(w.counts.n for w in counted), sum(w.counts.v for w in counted))
    assert store.read(key(), (1,), 8) == total
    assert batches_added(store, [key()]) == [len(counted)]
    assert raw.exists(dedupe_key("m", done_before.batch_id)) == 1


def test_the_same_batch_from_many_callers_at_once_counts_once(stores, rng):
    store = stores()
    write = batch(random_counts((3,), 16, rng), key(), key(window="1h", bucket=3600))
    results = run_threads([lambda: store.add(write)] * 16)
    assert sorted(results) == [False] * 15 + [True]
    assert store.read(key(), (3,), 16) == write.counts
    assert batches_added(store, [key(), key(window="1h", bucket=3600)]) == [1, 1]


def test_many_callers_many_batches_count_exactly(stores, rng):
    store = stores()
    flushes: list[int] = []
    store.observe_flushes(lambda batches, seconds, failed: flushes.append(batches))
    writes = [batch(random_counts((5,), 64, rng), key()) for _ in range(200)]
    # Every batch sent twice, by different threads, some at the same time.
    order = writes + writes[::-1]
    results = run_threads([lambda w=w: store.add(w) for w in order])
    assert sum(r is True for r in results) == 200 and sum(r is False for r in results) == 200
    total = Counts((5,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), (5,), 64) == total
    assert batches_added(store, [key()]) == [200]
    assert sum(flushes) >= 200  # every script call that added batches was observed


def test_redis_down_under_a_group_fails_every_caller_and_retries_count_once(redis_server, stores, rng):
    store = stores()
    writes = [batch(random_counts((1,), 6, rng), key()) for _ in range(8)]
    # writes[0] is held in its script call, the other seven queue behind it; then Redis stops.
    outcomes, sizes = add_concurrently(store, writes, before_release=redis_server.stop)
    assert sizes == [1, 7]  # one call for the seven, and it failed
    assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
    assert "\n" not in str(outcomes[1])
    redis_server.start()  # no persistence: nothing was kept (nothing was applied anyway)
    assert run_threads([lambda w=w: store.add(w) for w in writes]) == [True] * 8
    assert run_threads([lambda w=w: store.add(w) for w in writes]) == [False] * 8
    total = Counts((1,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), (1,), 6) == total
    assert batches_added(store, [key()]) == [8]


def test_a_group_applied_but_not_acknowledged_counts_once_on_retry(redis_server, stores, rng):
    """Redis stalls under a group's script call: every caller times out (UNAVAILABLE), Redis
    then runs the call; each caller's retry finds its id applied and answers duplicate."""
    store = stores(socket_timeout=0.25, socket_connect_timeout=0.25, retries=0)
    assert store.add(batch(random_counts((1,), 4, rng), key(window="warm-up")))  # the script is loaded
    writes = [batch(random_counts((1,), 4, rng), key()) for _ in range(6)]
    entered, release, sizes = hold_first_script_call(store)
    stall = threading.Thread(target=redis_server.command, args=("DEBUG", "SLEEP", "1.5"), kwargs={"timeout": 10})
    holder = threading.Thread(target=lambda: pytest.raises(StoreUnavailable, store.add, writes[0]))
    holder.start()
    assert entered.wait(WAIT)
    outcomes: list[object] = [None] * 6

    def add(i: int) -> None:
        try:
            outcomes[i] = store.add(writes[i])
        except BaseException as error:  # noqa: BLE001
            outcomes[i] = error

    threads = [threading.Thread(target=add, args=(i,)) for i in range(1, 6)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: sum(len(q) for q in store._coalescer._queues.values()) == 5, WAIT, 0.005)  # noqa: SLF001
    stall.start()
    while True:  # until DEBUG SLEEP has the server
        try:
            redis_server.command("PING", timeout=0.05)
            time.sleep(0.01)
        except TimeoutError:
            break
    release.set()  # the held call (writes[0]) and then the group of the other five time out
    holder.join(WAIT)
    for thread in threads:
        thread.join(WAIT)
    stall.join()
    assert all(isinstance(o, StoreUnavailable) for o in outcomes[1:]), outcomes
    # Redis woke up and ran what had reached it before the clients gave up (the group, unless
    # its connection was already closed): each client retries until it hears an answer, as
    # the SDK does, and every batch ends up counted exactly once.

    def until_answered(write) -> bool:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                return store.add(write)
            except StoreUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    answers = run_threads([lambda w=w: until_answered(w) for w in writes])
    assert all(a in (True, False) for a in answers), answers
    total = Counts((1,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), (1,), 4) == total
    assert batches_added(store, [key()]) == [6]
    assert run_threads([lambda w=w: store.add(w) for w in writes]) == [False] * 6


def test_wait_without_replicas_fails_a_group_that_counts_once(stores, rng):
    store = stores(wait_replicas=1, wait_timeout_ms=50)
    writes = [batch(random_counts((1,), 3, rng), key()) for _ in range(5)]
    for _ in range(2):
        outcomes = run_threads([lambda w=w: store.add(w) for w in writes])
        assert all(isinstance(o, StoreUnavailable) and "replicas acknowledged" in str(o) for o in outcomes)
    total = Counts((1,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), (1,), 3) == total
    assert batches_added(store, [key()]) == [5]


def test_a_set_of_many_metrics_goes_in_one_call_and_a_failing_group_fails_alone(stores, raw, rng):
    """add_many of a device's batches, one per metric: one script call; a metric whose hash
    holds data that is not Veil's fails its own batch only, and the others count once."""
    store = stores()
    calls: list[int] = []
    store.observe_flushes(lambda batches, seconds, failed: calls.append(batches))
    writes = [
        batch(random_counts((1,), 4, rng), key(metric=f"m{i}"), key(metric=f"m{i}", window="1h")) for i in range(10)
    ]
    raw.set(counts_key(key(metric="m3", window="1h")), "not a hash")
    results = store.add_many(writes)
    assert calls == [10]
    assert isinstance(results[3], StoreError) and not isinstance(results[3], StoreUnavailable)
    assert results[:3] + results[4:] == [True] * 9
    assert store.add_many(writes[:3] + writes[4:]) == [False] * 9
    for write in writes[:3] + writes[4:]:
        assert store.read(write.targets[0][0], (1,), 4) == write.counts
        assert batches_added(store, [t for t, _ in write.targets]) == [1, 1]


def test_batches_for_other_buckets_or_designs_are_groups_of_their_own(stores, rng):
    store = stores()
    hour = key(window="1h", bucket=3600)
    writes = [
        batch(random_counts((1,), 4, rng), key()),
        batch(random_counts((1,), 4, rng), hour),
        batch(random_counts((1,), 4, rng), key(), hour),
        batch(random_counts((2,), 4, rng), key(window="1d")),
        batch(random_counts((1,), 4, rng), key(), ttl=60),
    ]
    assert run_threads([lambda w=w: store.add(w) for w in writes]) == [True] * 5
    assert batches_added(store, [key(), hour, key(window="1d")]) == [3, 2, 1]
    assert store.read(key(window="1d"), (2,), 4) == writes[3].counts


def test_coalesce_1_sends_every_batch_alone(stores, rng):
    store = stores(coalesce=1)
    sizes: list[int] = []
    store.observe_flushes(lambda batches, seconds, failed: sizes.append(batches))
    writes = [batch(random_counts((1,), 4, rng), key()) for _ in range(12)]
    assert run_threads([lambda w=w: store.add(w) for w in writes]) == [True] * 12
    assert sizes == [1] * 12
    with pytest.raises(ValueError):
        stores(coalesce=0)


def call(*groups: tuple[list[str], list[str], int, int, list[object], list[object]]) -> tuple[list, list]:
    """add_batch.lua's keys and arguments for groups of (ids, targets, version, period,
    expiries, field/increment pairs), each id remembered for 60 s."""
    args: list[object] = []
    for ids, targets, version, period, expiries, pairs in groups:
        args += [len(ids), len(targets), 60, version, period, *ids, *targets, *expiries, len(pairs), *pairs]
    return [groups[0][0][0]], args


def test_the_script_adds_nothing_of_a_group_when_any_of_its_ids_was_applied(raw, rng):
    """add_batch.lua itself: ids checked first, all or nothing per group, the applied ones
    named; each target records the group's period once."""
    script = raw.register_script(_ADD_BATCH)
    target = counts_key(key())
    ids = [dedupe_key("m", os.urandom(16)) for _ in range(3)]
    first = 2**63 - 1  # versions go through as strings: a Lua number (a double) would round this one
    # Applied: the versions before.
    assert script(*call(([ids[1]], [target], first, 20000, [""], ["n:1", 4, "v:1:0", 3]))) == [[0, 0]]
    before = raw.hgetall(target)
    assert script(*call((ids, [target], 5, 20001, [""], ["n:1", 9, "v:1:0", 9]))) == [[2]]
    assert (
        raw.hgetall(target)
        == before
        == {b"n:1": b"4", b"v:1:0": b"3", b"batches": b"1", b"version": str(first).encode(), b"periods": b",20000,"}
    )
    assert raw.exists(ids[0], ids[2]) == 0
    answer = script(*call(([ids[0], ids[2]], [target], 77, 20001, [""], ["n:1", 9, "v:1:0", 9])))
    assert answer == [[0, str(first).encode()]]
    assert raw.hgetall(target) == {
        b"n:1": b"13",
        b"v:1:0": b"12",
        b"batches": b"3",
        b"version": b"77",
        b"periods": b",20000,20001,",
    }
    assert all(55 <= raw.ttl(i) <= 60 for i in ids)
    # Several targets: each one's version before the group; -1 for one whose expiry has passed (gone).
    hour, old = counts_key(key(window="1h", bucket=3600)), counts_key(key(window="1h", bucket=0))
    more = [dedupe_key("m", os.urandom(16)) for _ in range(2)]
    answer = script(*call((more, [target, hour, old], 78, 20000, ["", 4102444800, 1], ["n:1", 1])))
    assert answer == [[0, b"77", 0, -1]]
    assert raw.exists(old) == 0 and raw.hmget(hour, "batches", "version") == [b"2", b"78"]
    assert raw.hget(target, "periods") == b",20000,20001,"  # already there: recorded once
    # A hash kept from before periods were recorded may hold any period: it records -1 as well.
    raw.hdel(hour, "periods")
    assert script(*call(([dedupe_key("m", os.urandom(16))], [hour], 79, 20002, [4102444800], ["n:1", 1])))[0][0] == 0
    assert raw.hget(hour, "periods") == b",-1,20002,"


def test_the_groups_of_one_call_are_each_all_or_nothing(raw):
    """Several groups in one call: each answered on its own, in order; an id in two groups
    counts in the first; a group failing on data that is not Veil's fails alone."""
    script = raw.register_script(_ADD_BATCH)
    a, b, foreign = counts_key(key()), counts_key(key(metric="b")), counts_key(key(metric="c"))
    done = dedupe_key("m", os.urandom(16))
    assert script(*call(([done], [a], 5, 1, [""], ["n:1", 1])))[0][0] == 0
    shared, fresh, other = (dedupe_key(m, os.urandom(16)) for m in ("m", "m", "b"))
    raw.set(foreign, "not a hash")
    answers = script(
        *call(
            ([fresh, done], [a], 6, 1, [""], ["n:1", 2]),  # an id applied before: nothing of it
            ([shared], [a], 7, 2, [""], ["n:1", 3]),  # applied
            ([other], [b], 8, 1, [""], ["n:1", 4]),  # applied, another metric
            ([shared], [a], 9, 3, [""], ["n:1", 5]),  # the id the second group applied
            ([dedupe_key("c", os.urandom(16))], [foreign], 10, 1, [""], ["n:1", 6]),
        )
    )
    assert answers[:4] == [[2], [0, b"5"], [0, 0], [1]]
    assert answers[4][0] == -2 and b"WRONGTYPE" in answers[4][1]
    assert raw.hmget(a, "n:1", "batches", "version", "periods") == [b"4", b"2", b"7", b",1,2,"]
    assert raw.hmget(b, "n:1", "batches") == [b"4", b"1"]
    assert raw.exists(fresh) == 0 and raw.exists(shared, other) == 2


def test_a_foreign_value_fails_the_group_with_a_store_error(stores, raw, rng):
    store = stores()
    raw.set(counts_key(key()), "not a hash")
    outcomes = run_threads([lambda: store.add(batch(random_counts((1,), 3, rng), key())) for _ in range(4)])
    assert all(isinstance(o, StoreError) and not isinstance(o, StoreUnavailable) for o in outcomes)


# --- the increments, pre-encoded --------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "k", "rows", "scale"),
    [
        ((3,), 16, None, 1),
        ((275,), 1024, None, 1),
        ((275,), 1024, None, 10**6),
        (range(65), 64, 5, 1),
        (range(1025), 1024, 3, 7),
    ],
)
def test_pre_encoded_increments_are_the_bytes_redis_py_sends(rng, weights, k, rows, scale):
    from redis.connection import PythonRespSerializer

    from veil.aggregator.store._redis.fields import increments
    from veil.aggregator.store._redis.resp import command_packer, increments_resp

    counts = random_counts(weights, k, rng, rows)
    counts = Counts(counts.weights, counts.n * scale, counts.v * scale)  # values past the cached ones too
    head = ("EVALSHA", "ab" * 20, 4, "veil:{m}:b:00", b"veil:{m}:c:x", 3, 60, "", 1712345678)
    plain = PythonRespSerializer(6000, lambda x: x if isinstance(x, bytes) else str(x).encode()).pack(
        *head, *increments(counts)
    )
    packer = command_packer()
    assert packer is not None
    assert b"".join(packer.pack(*head, increments_resp(counts))) == b"".join(plain)
    assert b"".join(packer.pack("PING")) == b"*1\r\n$4\r\nPING\r\n"  # other commands: redis-py's own


def test_reads_by_field_notice_fields_of_another_design(stores, raw, rng):
    """Reads of a q-subset design ask for its own fields only (HMGET); a field besides them, or
    a hash without its "batches" count and "version", is still noticed and named."""
    store = stores()
    counts = random_counts((3,), 8, rng)
    assert store.add(batch(counts, key()))
    assert store.read(key(), (3,), 8) == counts
    raw.hset(counts_key(key()), "v:4:1", 7)
    with pytest.raises(StoreError, match="does not hold counts of this design"):
        store.read(key(), (3,), 8)
    with pytest.raises(StoreError, match="does not hold counts of this design"):
        store.read_many([(key(window="1h"), (3,), 8), (key(), (3,), 8)])
    raw.hdel(counts_key(key()), "v:4:1")
    raw.hset(counts_key(key(window="x")), mapping={"v:3:1": 2, "batches": 7, "version": 9})  # no n: HGETALL
    assert store.versioned_read([], [(key(), (3,), 8), (key(window="x"), (3,), 8)])[1] == [
        (store.versions([key()])[0], counts),
        (9, Counts((3,), [0], [[0, 2, 0, 0, 0, 0, 0, 0]])),
    ]
    raw.hdel(counts_key(key()), "batches", "version")  # written by something else than add_batch.lua
    assert store.read(key(), (3,), 8) == counts
    assert store.versioned_read([], [(key(), (3,), 8)])[1] == [(0, counts)]
    raw.hset(counts_key(key(window="x")), "version", "x")
    with pytest.raises(StoreError, match="does not hold counts of this design"):
        store.versioned_read([], [(key(window="x"), (3,), 8)])
    raw.hset(counts_key(key()), "v:3:2", "x")
    with pytest.raises(StoreError, match="does not hold counts of this design"):
        store.read(key(), (3,), 8)


def test_a_refused_write_is_freed_at_once_without_the_cycle_collector():
    """Nothing of a failed group lingers in reference cycles (entries, the error, its traceback
    and the frames in it): with the garbage collector off, the writes go as soon as every
    caller has heard the error."""
    import gc
    import weakref

    class Write:
        pass

    def flush(writes):
        time.sleep(0.02)
        raise StoreUnavailable("down")

    coalescer = Coalescer(flush)
    heard = [None] * 6

    def submit(i: int, write: Write) -> None:
        try:
            coalescer.submit("g", write)
        except StoreUnavailable:  # no name bound: this frame keeps nothing of it
            heard[i] = "unavailable"

    writes = [Write() for _ in range(6)]
    refs = [weakref.ref(w) for w in writes]
    gc.collect()
    gc.disable()
    try:
        threads = [threading.Thread(target=submit, args=(i, w)) for i, w in enumerate(writes)]
        del writes
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        del threads
        assert heard == ["unavailable"] * 6
        assert [r() for r in refs] == [None] * 6
    finally:
        gc.enable()


def test_applied_groups_are_observed_with_each_targets_versions(stores, raw, rng):
    """observe_applied: every applied group, per target, with the versions it took the target
    from and to and the counts it added; nothing for duplicates; "forget" (None) for a call
    that failed, WAIT included, and for a target already expired."""
    store = stores()
    seen: list[tuple] = []
    store.observe_applied(lambda target, before, after, counts: seen.append((target, before, after, counts)))
    hour = key(window="1h", bucket=3600)
    first = batch(random_counts((1,), 4, rng), key(), hour)
    assert store.add(first)
    version = store.versions([key()])[0]
    assert version != 0 and store.versions([hour]) == [version]  # one version per call, for every target
    assert seen == [(key(), 0, version, first.counts), (hour, 0, version, first.counts)]
    seen.clear()
    assert store.add(first) is False and seen == []
    writes = [batch(random_counts((1,), 4, rng), key(), hour) for _ in range(6)]
    assert run_threads([lambda w=w: store.add(w) for w in [*writes, first]]) == [True] * 6 + [False]
    for target in (key(), hour):  # the groups chain from the first version to the stored one
        steps = [(before, after, counts) for t, before, after, counts in seen if t == target]
        assert [before for before, _, _ in steps] == [version] + [after for _, after, _ in steps[:-1]]
        assert steps[-1][1] == store.versions([target])[0]
        assert len({after for _, after, _ in steps} | {version}) == len(steps) + 1  # never a version twice
        assert Counts((1,), sum(c.n for _, _, c in steps), sum(c.v for _, _, c in steps)) == Counts(
            (1,), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes)
        )
    version = store.versions([key()])[0]
    seen.clear()
    assert store.add(batch(random_counts((1,), 4, rng), key(), (key(window="1h", bucket=0), 1)))  # expired
    assert seen[0][1:3] == (version, store.versions([key()])[0])
    assert seen[1] == (key(window="1h", bucket=0), None, None, None)
    waiting = stores(wait_replicas=1, wait_timeout_ms=20)
    waiting.observe_applied(lambda target, before, after, counts: seen.append((target, before, after, counts)))
    seen.clear()
    with pytest.raises(StoreUnavailable):
        waiting.add(batch(random_counts((1,), 4, rng), key()))
    assert seen == [(key(), None, None, None)] and batches_added(store, [key()]) == [9]
