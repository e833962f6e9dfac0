"""RedisStore on a real Redis Cluster: shards over the masters, the shard count recorded once,
a batch's shard fixed by its id (exactly once under retries), reads summed over the shards.
The store contract itself runs on the cluster too (test_store_contract.py)."""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest
from redis.crc import key_slot
from store_cases import PATIENT, batch, batches_added, key, random_counts
from veil_testing.processes import free_port

from veil.aggregator.counts import Counts
from veil.aggregator.errors import StoreError, StoreUnavailable
from veil.aggregator.store import RedisStore, open_store
from veil.aggregator.store._redis import shard_of, shard_tags

FAST = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}  # nobody answers: fail quickly


@pytest.fixture
def stores(redis_cluster):
    made: list[RedisStore] = []

    def make(**options) -> RedisStore:
        made.append(RedisStore(redis_cluster.url, **PATIENT, **options))
        return made[-1]

    yield make
    for store in made:
        store.close()


def masters_of(cluster, store: RedisStore, metric: str) -> Counter:
    """How many of the metric's shards each master serves."""
    return Counter(cluster.owner(key_slot(tag.encode())).port for tag in shard_tags(metric, store.shard_count()))


@pytest.mark.parametrize("shards", [None, 12])
def test_a_metric_s_shards_spread_evenly_over_every_master(redis_cluster, stores, shards):
    store = stores(shards=shards)
    assert store.shard_count() == (shards or 3)  # default: one per master
    for metric in ("m", "browser", "ünïcødé 📈"):
        spread = masters_of(redis_cluster, store, metric)
        assert sorted(spread.values()) == [store.shard_count() // 3] * 3, (metric, spread)


def test_the_shard_count_is_recorded_once_and_a_different_one_is_refused(stores):
    first = stores(shards=6)
    first.ping()  # records 6
    assert stores().shard_count() == 6  # not configured: the recorded number, whatever the masters
    assert stores(shards=6).shard_count() == 6
    with pytest.raises(StoreError, match="splits counters over 6 shards") as refused:
        stores(shards=12).ping()
    assert not isinstance(refused.value, StoreUnavailable)  # a configuration mistake: not worth retrying


def test_batches_retried_from_many_handles_count_once_on_every_shard(stores, rng):
    """Each of 120 batches is added by 4 handles at once (as retries of an unacknowledged batch
    reach several aggregators): each lands on its id's shard, whichever handle sends it, and
    counts once; the bucket's counts are the sum over its shards."""
    writes = [batch(random_counts((2, 3), 16, rng), key(), key(window="1h", bucket=3600)) for _ in range(120)]
    handles = [stores() for _ in range(4)]
    results: list[list[bool]] = [[] for _ in handles]
    start = threading.Barrier(len(handles))

    def send(i: int) -> None:
        start.wait()
        results[i] = [handles[i].add(write) for write in (writes if i % 2 else writes[::-1])]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(sum(r) for r in results) == len(writes)  # each applied by exactly one handle
    expected = Counts((2, 3), sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    for target in (key(), key(window="1h", bucket=3600)):
        assert handles[0].read(target, (2, 3), 16) == expected
        assert batches_added(handles[0], [target]) == [len(writes)]
    shards = handles[0].shard_count()
    used = Counter(shard_of(w.batch_id, shards) for w in writes)
    assert set(used) == set(range(shards))  # every shard took some
    per_shard = [int(handles[0]._redis.hget(name, "batches") or 0) for name in handles[0].bucket_hashes(key())]
    assert per_shard == [used[s] for s in range(shards)]


def test_versions_are_per_shard_and_a_write_changes_only_its_shard_s(stores, rng):
    store = stores()
    seen = []
    store.observe_applied(lambda target, before, after, counts: seen.append((before, after)))
    assert store.versions([key()]) == [0]
    write = batch(random_counts((1,), 4, rng), key())
    assert store.add(write)
    (version,) = store.versions([key()])
    shard = shard_of(write.batch_id, store.shard_count())
    assert len(version) == 3 and [bool(v) for v in version] == [s == shard for s in range(3)]
    ((before, after),) = seen
    assert before == tuple(0 if s == shard else None for s in range(3))
    assert after == tuple(version[s] if s == shard else None for s in range(3))


def test_open_store_takes_cluster_urls_and_names_a_bad_one(redis_cluster):
    store = open_store(redis_cluster.url)
    try:
        store.ping()
    finally:
        store.close()
    with pytest.raises(ValueError, match="host:port"):
        open_store("redis+cluster://127.0.0.1:1,nohost")
    with pytest.raises(ValueError, match="cluster"):
        RedisStore("redis://127.0.0.1:6379/0", shards=3)


def test_a_cluster_nobody_answers_is_unavailable():
    store = RedisStore(f"redis+cluster://127.0.0.1:{free_port()}", **FAST)  # made at once: asked on first use
    try:
        with pytest.raises(StoreUnavailable):
            store.ping()
        with pytest.raises(StoreUnavailable):
            store.add(batch(Counts((1,), [1], [[1, 0]]), key(), batch_id=os.urandom(16)))
    finally:
        store.close()


def test_each_shard_records_the_periods_of_its_own_batches_and_reads_join_them(stores, rng):
    """A bucket's periods live in each shard's hash (the batch's slot: one atomic script), so a
    period reaches only the shard its batch went to; a read is the union over the shards."""
    store = stores()
    writes = [batch(random_counts((1,), 4, rng), key(), period=30_000 + i) for i in range(12)]
    assert store.add_many(writes) == [True] * 12
    by_shard: dict[int, set[int]] = {}
    for write in writes:
        by_shard.setdefault(shard_of(write.batch_id, store.shard_count()), set()).add(write.period)
    assert len(by_shard) > 1  # 12 random ids over 3 shards
    for shard, name in enumerate(store.bucket_hashes(key())):
        held = store._redis.hget(name, "periods")
        recorded = {int(p) for p in held.decode().split(",") if p} if held else set()
        assert recorded == by_shard.get(shard, set()), shard
    assert store.read(key(), (1,), 4).periods == {30_000 + i for i in range(12)}


def test_a_set_of_many_metrics_takes_one_call_per_master_across_their_slots(redis_cluster, stores, rng):
    """add_many of 30 batches of 10 metrics: one script call per master, side by side, each
    spanning the slots of every metric's shard there (allow-cross-slot-keys), none sent again
    slot by slot; each batch counts once, and again answers duplicate."""
    store = stores()
    calls: list[int] = []
    store.observe_flushes(lambda batches, seconds, failed: calls.append(batches))
    per_slot: list[object] = []
    run_on_master = store._run_on_master
    store._run_on_master = lambda *args: per_slot.append(args) or run_on_master(*args)  # the fallback
    writes = [batch(random_counts((1,), 4, rng), key(metric=f"m{i % 10}")) for i in range(30)]
    assert store.add_many(writes) == [True] * 30
    masters = {redis_cluster.owner(key_slot(tag.encode())).port for tag in map(tag_of, writes)}
    assert len(masters) == 3  # 30 batches' shards: on every master
    assert calls == [30] and per_slot == []  # one write of the set: a call per master, side by side
    assert store.add_many(writes) == [False] * 30
    for master in redis_cluster.masters():
        master.command("SCRIPT", "FLUSH")  # a restart's loss: each call loads the script again
    more = [batch(random_counts((1,), 4, rng), key(metric=f"m{i % 10}")) for i in range(30)]
    assert store.add_many(more) == [True] * 30 and per_slot == []
    writes += more
    for i in range(10):
        counted = [w for w in writes if w.metric == f"m{i}"]
        total = Counts((1,), sum(w.counts.n for w in counted), sum(w.counts.v for w in counted))
        assert store.read(key(metric=f"m{i}"), (1,), 4) == total
        assert batches_added(store, [key(metric=f"m{i}")]) == [len(counted)]


def test_a_master_whose_replicas_fall_short_fails_its_own_batches_and_every_connection_stays_in_step(
    redis_cluster, stores, rng
):
    """WAIT 2 where every master has one replica: each master's call is applied and falls short.
    Every master's answer is still read, so no connection goes back to its pool with a reply
    waiting for its next command (which would take another call's answer for its own: an
    INFO answered by a script's list, a batch acknowledged by another group's reply)."""
    store = stores(wait_replicas=2, wait_timeout_ms=20)
    writes = [batch(random_counts((1,), 4, rng), key(metric=f"m{i % 10}")) for i in range(30)]
    assert len({redis_cluster.owner(key_slot(tag_of(w).encode())).port for w in writes}) == 3  # a call per master
    for _ in range(2):  # the second time: found applied, and unacknowledged all the same
        results = store.add_many(writes)
        assert all(isinstance(r, StoreUnavailable) and "of 2 replicas acknowledged" in str(r) for r in results)
        for _ in range(3):  # every master's pooled connection answers its own command
            with pytest.raises(StoreUnavailable, match="a master with 1 of the 2 replicas"):
                store.ping()
    for i in range(10):
        counted = [w for w in writes if w.metric == f"m{i}"]
        total = Counts((1,), sum(w.counts.n for w in counted), sum(w.counts.v for w in counted))
        assert store.read(key(metric=f"m{i}"), (1,), 4) == total  # applied once, as "may have been" says
        assert batches_added(store, [key(metric=f"m{i}")]) == [len(counted)]


def tag_of(write) -> str:
    """The hash tag of a write's shard (of 3)."""
    return shard_tags(write.metric, 3)[shard_of(write.batch_id, 3)]


def test_groups_sent_to_a_master_that_does_not_serve_their_slot_go_again_per_slot(redis_cluster, stores, rng):
    """A map of the slots out of date (as after a resharding): the groups of slots the master
    does not serve fail there before any write of theirs and go again slot by slot, to the
    right masters; the others count in the first call. Each batch counts once."""
    store = stores()
    writes = [batch(random_counts((1,), 4, rng), key(metric=f"m{i}")) for i in range(12)]
    tags = [tag_of(w) for w in writes]
    wrong = store._master_of(tags[0])
    for tag in tags:
        store._masters[tag] = wrong  # every group sent to the first one's master
    owners = [redis_cluster.owner(key_slot(tag.encode())).port for tag in tags]
    elsewhere = {tag for tag, port in zip(tags, owners) if port != owners[0]}
    assert elsewhere  # 12 groups over 3 masters: some are not the first one's
    per_slot: list[object] = []
    run_on_master = store._run_on_master
    store._run_on_master = lambda script, sections: per_slot.append(sections[0].tag) or run_on_master(script, sections)
    assert store.add_many(writes) == [True] * 12
    assert set(per_slot) == elsewhere and len(per_slot) == len(elsewhere)
    assert store.add_many(writes) == [False] * 12
    for write in writes:
        assert store.read(key(metric=write.metric), (1,), 4) == write.counts
        assert batches_added(store, [key(metric=write.metric)]) == [1]
