"""RedisStore against real redis-servers: key layout, failures, retries, durability, WAIT."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import redis
from redis.crc import key_slot
from store_cases import AWKWARD_METRICS, batch, batches_added, doubled, key, random_counts
from veil_testing.waiting import wait_until

from veil.aggregator.counts import PERIOD_NOT_SAID, Counts
from veil.aggregator.errors import StoreError, StoreUnavailable
from veil.aggregator.store import RedisStore, open_store
from veil.aggregator.store._redis import counts_key, dedupe_key
from veil.aggregator.store._redis.replies import counts_of, integers

FAST = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}


@pytest.fixture
def make_store() -> Iterator[Callable[..., RedisStore]]:
    """RedisStore(url, **FAST, **options), closed after the test."""
    made: list[RedisStore] = []

    def make(url: str, **options: object) -> RedisStore:
        made.append(RedisStore(url, **{**FAST, **options}))
        return made[-1]

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(redis_server, make_store) -> RedisStore:
    return make_store(redis_server.url)


@pytest.fixture
def raw(redis_server) -> Iterator[redis.Redis]:
    """A plain redis-py client, to look at what the store wrote."""
    with redis.Redis.from_url(redis_server.url) as client:
        yield client


def test_every_key_of_a_metric_is_in_its_slot_and_names_never_collide(make_redis_server):
    cluster_node = make_redis_server(args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
    seen = set()
    for metric in AWKWARD_METRICS:
        keys = [counts_key(key(metric, w, b, fp)) for w, b in [("total", 0), ("1h", 3600)] for fp in ("fp1", "a:b}")]
        keys.append(dedupe_key(metric, b"\xff" * 16))
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, metric
        assert cluster_node.command("CLUSTER", "KEYSLOT", keys[0]) == b":%d\r\n" % slots.pop()  # Redis agrees
        tag = keys[0][keys[0].index("{") + 1 : keys[0].index("}")]
        assert tag and not set(tag) & set("{}: "), tag  # what a cluster hashes is the escaped metric
        assert seen.isdisjoint(keys)
        seen.update(keys)
    with pytest.raises(ValueError, match="empty"):
        counts_key(key(""))


def test_layout_integer_fields_for_non_zero_counts_only(store, raw):
    counts = Counts((0, 2), [0, 5], [[0, 0, 0], [3, 0, 5]])
    assert store.add(batch(counts, key("m:x"), batch_id=b"\xab" * 16, ttl=120, period=20000))
    fields = raw.hgetall("veil:{m%3Ax}:c:fp1:total:0")
    version = fields.pop(b"version")
    assert fields == {b"n:2": b"5", b"v:2:0": b"3", b"v:2:2": b"5", b"batches": b"1", b"periods": b",20000,"}
    assert store.versions([key("m:x")]) == [int(version)] and int(version) > 0
    assert raw.get("veil:{m%3Ax}:b:" + "ab" * 16) == b"1"
    assert 118 <= raw.ttl("veil:{m%3Ax}:b:" + "ab" * 16) <= 120
    assert raw.ttl("veil:{m%3Ax}:c:fp1:total:0") == -1  # a total window never expires


def test_a_bucket_keeps_its_latest_expiry_and_a_total_none(store, raw, rng):
    counts, hour, now = random_counts((1,), 2, rng), key(window="1h", bucket=3600), int(time.time())
    assert store.add(batch(counts, key(), (hour, now + 600)))
    assert (raw.ttl(counts_key(key())), raw.expiretime(counts_key(hour))) == (-1, now + 600)
    assert store.add(batch(counts, (key(), now + 300), (hour, now + 300)))  # never shortens, nor ends a total
    assert (raw.ttl(counts_key(key())), raw.expiretime(counts_key(hour))) == (-1, now + 600)
    assert store.add(batch(counts, (hour, now + 900)))
    assert raw.expiretime(counts_key(hour)) == now + 900


def test_the_script_is_reloaded_after_script_flush(store, raw, rng):
    counts = random_counts((1,), 3, rng)
    assert store.add(batch(counts, key()))
    raw.script_flush()
    assert store.add(batch(counts, key()))
    assert store.read(key(), (1,), 3) == doubled(counts)


def test_a_stalled_redis_then_the_sdk_retry_counts_the_batch_once(redis_server, rng, make_store):
    store = make_store(redis_server.url, socket_timeout=0.25, socket_connect_timeout=0.25, retries=1)
    assert store.add(batch(random_counts((1,), 4, rng), key(window="warm-up")))  # the script is loaded
    write = batch(random_counts((1,), 4, rng), key())
    stall = threading.Thread(target=redis_server.command, args=("DEBUG", "SLEEP", "2"), kwargs={"timeout": 10})
    stall.start()
    while True:  # until DEBUG SLEEP has the server: the EVALSHA below then waits behind it
        try:
            redis_server.command("PING", timeout=0.05)
            time.sleep(0.01)
        except TimeoutError:
            break
    outcomes: list[object] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # what the SDK does: the same batch id until an answer
        try:
            outcomes.append(store.add(write))
            break
        except StoreUnavailable as error:
            assert "\n" not in str(error)
            outcomes.append(error)
    stall.join()
    # The first attempts time out (and may still be applied once Redis wakes up); the last
    # answers True, or False when a timed-out attempt had applied it: counted once either way.
    assert isinstance(outcomes[0], StoreUnavailable)
    assert outcomes[-1] in (True, False)
    assert store.read(key(), (1,), 4) == write.counts
    assert batches_added(store, [key()]) == [1]


def test_redis_down_is_unavailable_quickly_then_up_again(redis_server, store, rng):
    write = batch(random_counts((1,), 4, rng), key())
    assert store.add(write)
    redis_server.stop()
    calls = (lambda: store.add(write), lambda: store.read(key(), (1,), 4), lambda: store.versions([key()]), store.ping)
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{redis_server.port}"):
            call()
        assert time.monotonic() - started < 3  # a few refused connects and short backoffs
    redis_server.start()  # same port, no persistence: empty again
    store.ping()
    assert store.add(write)
    assert store.read(key(), (1,), 4) == write.counts


def test_acknowledged_batches_survive_sigkill_with_appendfsync_always(make_redis_server, rng, make_store):
    # SIGKILL is a crash of Redis, not of the host: fsync=always is what also covers the latter.
    server = make_redis_server(appendonly=True, appendfsync="always")
    store = make_store(server.url)
    weights, hour = tuple(range(6)), (key(window="1h", bucket=3600), int(time.time()) + 3600)
    writes = [batch(random_counts(weights, 5, rng), key(), hour) for _ in range(20)]
    assert all(store.add(write) for write in writes)
    server.kill()
    server.start()  # same directory: Redis replays its append-only file
    total = Counts(weights, sum(w.counts.n for w in writes), sum(w.counts.v for w in writes))
    assert store.read(key(), weights, 5) == total
    assert store.read(hour[0], weights, 5) == total
    assert batches_added(store, [key(), hour[0]]) == [20, 20]
    assert store.add(writes[7]) is False  # the batch ids survived too


def test_without_persistence_sigkill_loses_everything(redis_server, store, rng):
    """The control of the test above: there, the append-only file is what kept the counts."""
    assert store.add(batch(random_counts((1,), 3, rng), key()))
    redis_server.kill()
    redis_server.start()
    assert batches_added(store, [key()]) == [0]


def test_wait_without_enough_replicas_is_unavailable_but_counts_once(redis_server, rng, make_store):
    store = make_store(redis_server.url, wait_replicas=1, wait_timeout_ms=50)
    write = batch(random_counts((1,), 3, rng), key())
    for _ in range(2):  # the SDK retries: still no replica, still applied once
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas.*may have been applied"):
            store.add(write)
    assert store.read(key(), (1,), 3) == write.counts


def test_wait_with_a_replica_acknowledges_the_batch(make_redis_server, rng, make_store):
    # A replica synced through a disk RDB gets the command stream at once; after a diskless sync
    # Redis holds it back until the replica's first ACK (up to a second), and WAIT would time out.
    primary = make_redis_server(args=("--repl-diskless-sync", "no"))
    replica = make_redis_server(replicaof=primary)
    with redis.Redis.from_url(primary.url) as client:  # until the first sync is over: WAIT counts online replicas
        online = wait_until(lambda: client.info("replication").get("slave0", {}).get("state") == "online", 10, 0.02)
        assert online, "the replica did not come online"
    store = make_store(primary.url, wait_replicas=1, wait_timeout_ms=400)
    write = batch(random_counts(range(4), 3, rng), key())
    assert store.add(write) is True
    assert store.add(write) is False
    follower = make_store(replica.url)
    assert follower.read(key(), range(4), 3) == write.counts  # WAIT returned: the replica has it


def test_a_refused_password_is_a_store_error_not_unavailability(make_redis_server, make_store):
    server = make_redis_server(args=("--requirepass", "s3cret"))
    with pytest.raises(StoreError) as caught:
        make_store(server.url).ping()
    assert not isinstance(caught.value, StoreUnavailable)
    make_store(server.url.replace("redis://", "redis://:s3cret@")).ping()


def test_a_foreign_value_is_a_store_error(store, raw):
    raw.set(counts_key(key()), "not a hash")
    with pytest.raises(StoreError, match="WRONGTYPE") as caught:
        store.read(key(), (1,), 3)
    assert not isinstance(caught.value, StoreUnavailable)


def test_reads_by_field_are_the_counts_of_every_field(store, raw, rng):
    """HMGET's values, parsed in one numpy call, are exactly the counts HGETALL's fields give
    (the general parser), zeros and counters past 2**53 included."""
    k = 1024
    for scale in (1, 10**6, 2**40):
        counts = random_counts((275,), k, rng)
        counts = Counts(counts.weights, counts.n * scale, counts.v * scale)
        place = key(window=f"w{scale}")
        assert store.add(batch(counts, place))
        assert store.add(batch(counts, place))
        (fields,) = [raw.hgetall(counts_key(place))]
        assert store.read(place, (275,), k) == counts_of(fields, (275,), k) == doubled(counts)
    raw.hset(counts_key(key(window="big")), mapping={"n:1": 2**63 - 1, "v:1:0": 2**62 + 1, "v:1:2": 1, "batches": 1})
    assert store.read(key(window="big"), (1,), 3) == Counts((1,), [2**63 - 1], [[2**62 + 1, 0, 1]])


def _strict(values):
    return np.array([b"0" if value is None else value for value in values]).astype(np.int64)


@pytest.mark.parametrize(
    "values",
    [
        [b"1", b"2", None, b"3"],
        [None, None],
        [b"-5", b"0", b"-0", b"007"],
        [b"9223372036854775807", b"1"],
        [b"-9223372036854775808", b"1"],
        [b"9223372036854775808"],
        [b"99999999999999999999999", b"1"],
        [b"1 2", b""],
        [b"", b"1"],
        [b"1", b""],
        [b"", b""],
        [b""],
        [b"", b"", b"5"],
        [b"-", b"1"],
        [b"1-2"],
        [b"--1"],
        [b"1", b"-"],
        [b"- 1"],
        [b"+5"],
        [b" 5"],
        [b"5 "],
        [b"\t1"],
        [b"1\n"],
        [b"1.5"],
        [b"1e3"],
        [b"abc"],
        [b"0x10"],
        [],
    ],
)
def test_the_fast_integer_parser_is_the_strict_one_or_fails_as_it_does(values):
    """integers gives what the array-of-bytes cast gives, or raises what it raises, and never
    leaves numpy's warning about a malformed string behind."""
    import warnings

    try:
        expected = _strict(values)
    except (ValueError, OverflowError) as error:
        with pytest.raises(type(error)):
            integers(values)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, present = integers(values)
    assert got.dtype == np.int64 and got.tobytes() == expected.tobytes()
    assert present == sum(value is not None for value in values)


def test_a_counter_int64_cannot_hold_is_a_store_error(store, raw):
    raw.hset(counts_key(key()), mapping={"n:1": 2**64, "v:1:0": 1, "batches": 1})
    with pytest.raises(StoreError, match="does not hold counts of this design"):
        store.read(key(), (1,), 1)


def test_open_store_over_tcp_and_unix_socket(redis_server, rng):
    write = batch(random_counts((1,), 3, rng), key())
    with_tcp, with_unix = open_store(redis_server.url, **FAST), open_store(redis_server.unix_url, **FAST)
    assert isinstance(with_unix, RedisStore)
    assert with_tcp.add(write)
    assert with_unix.add(write) is False
    assert with_unix.read(key(), (1,), 3) == write.counts
    with_tcp.close()
    with_unix.close()


def test_settings_that_cannot_work_are_refused():
    for bad in (
        {"retries": -1},
        {"wait_replicas": 1, "wait_timeout_ms": 0},
        {"wait_replicas": 1, "wait_timeout_ms": 2000},
    ):
        with pytest.raises(ValueError):
            RedisStore("redis://127.0.0.1:1/0", socket_timeout=2.0, **bad)


def test_settled_read_keeps_a_packed_copy_in_the_slot_until_the_bucket_expires(store, raw):
    hour, expires_at = key("m:x", "1h", 3600), int(time.time()) + 600
    counts = Counts((2,), [7], [[1, 0, 6]])
    assert store.add(batch(counts, (hour, expires_at)))
    name = counts_key(hour)
    copy = name.replace("}:c:", "}:q:")
    assert raw.exists(copy) == 0
    version = int(raw.hget(name, "version"))
    assert store.settled_read([(hour, (2,), 3, expires_at)]) == [(version, counts)]
    assert key_slot(copy.encode()) == key_slot(name.encode())
    assert raw.expiretime(copy) == expires_at
    packed = np.frombuffer(raw.get(copy), "<i8").tolist()
    # version, k, rows, periods; the rows' weights, n, V; the periods
    assert packed == [version, 3, 1, 1, 2, 7, 1, 0, 6, PERIOD_NOT_SAID]
    # Served from the copy while the hash is at its version: a counter changed behind the
    # store's back (never done by Veil) shows that, and a copy of another version is passed over.
    raw.hset(name, "v:2:1", 4)
    assert store.settled_read([(hour, (2,), 3, expires_at)]) == [(version, counts)]
    raw.set(copy, np.array([version + 1, 3, 1, 1, 2, 7, 1, 0, 6, -1], "<i8").tobytes())
    assert store.settled_read([(hour, (2,), 3, expires_at)]) == [(version, Counts((2,), [7], [[1, 4, 6]]))]
    assert np.frombuffer(raw.get(copy), "<i8").tolist()[:4] == [version, 3, 1, 1]  # written again


def test_a_settled_read_whose_copy_cannot_be_written_still_answers(store, raw):
    hour = key("m", "1h", 3600)
    counts = Counts((2,), [7], [[1, 0, 6]])
    assert store.add(batch(counts, hour))
    raw.config_set("maxmemory", 1)  # noeviction: every write refused with OOM, reads served
    try:
        assert store.settled_read([(hour, (2,), 3, None)])[0][1] == counts
    finally:
        raw.config_set("maxmemory", 0)
    assert raw.exists(counts_key(hour).replace("}:c:", "}:q:")) == 0
