"""SqliteStore beyond the contract: durability settings, group commit, restarts, expiry purged in
chunks, and files it refuses (corrupt, another program's, a newer schema, in use)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from store_cases import batch, batches_added, doubled, key, random_counts

from veil.aggregator.counts import PERIOD_NOT_SAID, Counts
from veil.aggregator.errors import StoreError
from veil.aggregator.store import SqliteStore
from veil.aggregator.store._sqlite import _MIGRATIONS, _PURGE_CHUNK, APPLICATION_ID, SCHEMA_VERSION


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path):
    return tmp_path / "veil.db"


@pytest.fixture
def opened():
    """opened(store) registers a store to close after the test, and returns it."""
    stores: list[SqliteStore] = []

    def register(store: SqliteStore) -> SqliteStore:
        stores.append(store)
        return store

    yield register
    for store in stores:
        store.close()


def sql(path, query: str, *args: object) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(query, args).fetchall()


def one_sentence(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.endswith(".") and len(text) < 400, text
    return text


def test_an_acknowledged_batch_is_in_an_fsynced_wal(path, opened, rng):
    store = opened(SqliteStore(path))
    assert store._writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store._writer.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL: the WAL is fsynced at each commit
    counts = random_counts((3,), 16, rng)
    assert store.add(batch(counts, key()))
    # Another process sees the batch at once: it is committed, not held in this one.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
            "print(db.execute('SELECT batches FROM buckets').fetchone()[0])",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"


def test_counts_batch_ids_versions_and_since_survive_a_reopen(path, rng):
    clock = Clock()
    store = SqliteStore(path, clock=clock)
    hour = (key("ünï:{x}", "1h", 3600), int(clock.now) + 600)
    rappor = random_counts(range(65), 64, rng, rows=8)
    big = random_counts((3,), 5, rng)
    big.v[0, 0] = 2**62  # beyond float64's exact integers
    writes = [batch(rappor, key("ünï:{x}"), hour), batch(big, key(fingerprint="fp2")), batch(rappor, key("ünï:{x}"))]
    assert all(store.add(w) for w in writes)
    versions = store.versions([key("ünï:{x}"), hour[0], key(fingerprint="fp2")])
    assert store.since("m", "fp1", 1000) == 1000 and store.since("m", "fp1", 2000) == 1000
    store.close()
    again = SqliteStore(path, clock=clock)
    try:
        assert again.read(key("ünï:{x}"), range(65), 64) == doubled(rappor)
        assert again.read(hour[0], range(65), 64) == rappor
        assert again.read(key(fingerprint="fp2"), (3,), 5) == big
        assert again.versions([key("ünï:{x}"), hour[0], key(fingerprint="fp2")]) == versions
        assert [again.add(w) for w in writes] == [False] * 3  # batch ids are kept with their expiry
        assert again.since("m", "fp1", 3000) == 1000 and again.since("m", "fp2", 3000) == 3000
        clock.now += 601
        assert again.versions([hour[0]]) == [0]  # so is the bucket's
    finally:
        again.close()


def test_concurrent_batches_of_every_metric_go_in_one_transaction(path, opened, rng):
    store = opened(SqliteStore(path))
    flushes: list[tuple[int, bool]] = []
    store.observe_flushes(lambda batches, seconds, failed: flushes.append((batches, failed)))
    gate = threading.Lock()
    gate.acquire()
    store._write_lock.acquire()  # the first caller leads and waits here; the others queue behind it
    writes = [
        batch(random_counts((2,), 8, rng), key(metric=f"m{i % 3}"), key(metric=f"m{i % 3}", window="1h"))
        for i in range(30)
    ]
    writes.append(writes[4])  # the same batch twice in one group: counted once
    outcomes: dict[int, bool] = {}
    threads = [
        threading.Thread(target=lambda i=i: outcomes.__setitem__(i, store.add(writes[i]))) for i in range(len(writes))
    ]
    threads[0].start()
    while not store._coalescer._queues:
        time.sleep(0.001)
    for thread in threads[1:]:
        thread.start()
    while len(next(iter(store._coalescer._queues.values()))) < len(writes) - 1:
        time.sleep(0.001)
    store._write_lock.release()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes.values()).count(True) == 30
    assert flushes == [(1, False), (30, False)]  # the first alone, then all the others in one transaction
    for m in range(3):
        expected = Counts((2,), np.zeros(1), np.zeros((1, 8)))
        for w in writes[m:30:3]:
            expected.add(w.counts)
        assert store.read(key(metric=f"m{m}"), (2,), 8) == expected
        assert store.read(key(metric=f"m{m}", window="1h"), (2,), 8) == expected


def test_groups_of_one_transaction_sharing_buckets_add_in_turn(path, opened, rng):
    """Batches of other periods (so other groups) for the same buckets, and a new bucket, in one
    add_many: every group adds to what the earlier ones wrote, the observers hear each version
    in turn, and the buckets record every period and batch."""
    store = opened(SqliteStore(path))
    seen = []
    store.observe_applied(lambda *args: seen.append(args))
    assert store.add(batch(random_counts((1,), 4, rng), key(), period=1))
    hour = (key(window="1h", bucket=3600), 10**10)
    writes = [batch(random_counts((1,), 4, rng), key(), hour, period=p) for p in (1, 2, 3, 2)]
    assert store.add_many(writes) == [True] * 4
    total = store.read(key(), (1,), 4)
    assert total.periods == {1, 2, 3}
    assert store.read(hour[0], (1,), 4) == Counts.summed([w.counts for w in writes])
    assert batches_added(store, [key(), hour[0]]) == [5, 4]
    for target in (key(), hour[0]):
        chain = [(before, after) for t, before, after, _ in seen if t == target]
        assert all(later[0] == earlier[1] for earlier, later in zip(chain, chain[1:]))
        assert chain[-1][1] == store.versions([target])[0]
    assert store.add_many(writes) == [False] * 4


def test_a_bucket_of_another_design_fails_only_its_own_batches(path, opened, rng):
    store = opened(SqliteStore(path))
    assert store.add(batch(random_counts((1,), 3, rng), key(window="1h")))
    good = batch(random_counts((1,), 3, rng), key(metric="other"))
    bad = batch(random_counts((2,), 3, rng), key(), key(window="1h"), batch_id=b"\x05" * 16)
    results = store.add_many([good, bad])
    assert results[0] is True and isinstance(results[1], StoreError) and "design" in str(results[1])
    with pytest.raises(StoreError, match="another design"):
        store.add(bad)
    assert store.versions([key(), key(window="1h")])[0] == 0
    assert store.read(key(metric="other"), (1,), 3) == good.counts
    assert store.add(batch(random_counts((2,), 3, rng), key(), batch_id=b"\x05" * 16))  # the id was not taken


def test_writes_are_observed_with_each_buckets_versions(path, opened, rng):
    store = opened(SqliteStore(path))
    seen = []
    store.observe_applied(lambda *args: seen.append(args))
    first, second = random_counts((3,), 4, rng), random_counts((3,), 4, rng)
    assert store.add(batch(first, key()))
    ((target, before, after, counts),) = seen
    assert (target, before, counts) == (key(), 0, first) and after == store.versions([key()])[0]
    assert store.add(batch(second, key()))
    assert seen[1][1] == after and seen[1][2] == store.versions([key()])[0] and seen[1][3] == second


def test_expired_ids_and_buckets_are_purged_in_chunks_and_logged(path, opened, rng, caplog):
    clock = Clock()
    store = opened(SqliteStore(path, clock=clock, maintenance_interval=3600))  # purged here, by hand
    counts = random_counts((1,), 2, rng)
    now = int(clock.now)
    writes = [batch(counts, key(), (key(window="1m", bucket=60 * i), now + 60), ttl=30) for i in range(5)]
    assert all(store.add(w) for w in writes)
    with contextlib.closing(sqlite3.connect(path)) as db:  # more expired ids than one chunk, written directly
        db.executemany(
            "INSERT INTO batches VALUES ('m', ?, ?)",
            [(i.to_bytes(16, "big"), (now + 10) * 1000) for i in range(2 * _PURGE_CHUNK + 7)],
        )
        db.commit()
    clock.now += 61
    with caplog.at_level(logging.INFO, logger="veil.aggregator.store"):
        assert store.purge() == (2 * _PURGE_CHUNK + 7 + 5, 5)
    assert sql(path, "SELECT count(*) FROM batches") == [(0,)]
    assert sql(path, "SELECT window, batches FROM buckets") == [("total", 5)]  # only the total is left
    assert sql(path, "SELECT count(*) FROM counters") == [(1,)]
    deleted = [r for r in caplog.records if r.getMessage() == "expired buckets deleted (window retention)"]
    assert [(r.buckets, r.windows) for r in deleted] == [(5, ["m/1m"])]
    assert store.purge() == (0, 0)


@pytest.mark.parametrize("first_purge", ["works", "raises"])
def test_the_maintenance_thread_purges_by_itself(path, opened, rng, first_purge, caplog):
    """Even after a purge failed in a way no store error covers: the thread goes on."""
    clock = Clock()
    store = opened(SqliteStore(path, clock=clock, maintenance_interval=0.05))
    if first_purge == "raises":
        purge, failures = store.purge, []

        def failing_once() -> tuple[int, int]:
            if not failures:
                failures.append(1)
                raise RuntimeError("not the store's own error")
            return purge()

        store.purge = failing_once  # type: ignore[method-assign]
    assert store.add(batch(random_counts((1,), 2, rng), (key(window="1m", bucket=60), int(clock.now) + 60), ttl=30))
    clock.now += 61
    for _ in range(200):
        if sql(path, "SELECT count(*) FROM buckets") == [(0,)] and sql(path, "SELECT count(*) FROM batches") == [(0,)]:
            break
        threading.Event().wait(0.05)
    else:
        raise AssertionError("nothing purged")
    if first_purge == "raises":
        assert any("failed unexpectedly" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_second_store_on_the_same_file_is_refused_until_the_first_closes(path, rng):
    first = SqliteStore(path)
    try:
        with pytest.raises(StoreError) as caught:
            SqliteStore(path)
        assert "is in use by another process" in one_sentence(caught.value)
    finally:
        first.close()
    SqliteStore(path).close()


def _foreign(path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        db.commit()


def _other_application(path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA application_id = 1234")
        db.commit()


def _newer(path) -> None:
    SqliteStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.commit()


def _corrupt(path) -> None:
    store = SqliteStore(path)
    rng = np.random.default_rng(1)
    for i in range(300):
        store.add(batch(random_counts((1,), 64, rng), key(metric=f"metric-{i}")))
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for start in range(2 * page, len(data) - page, 3 * page):  # scribble over some pages' headers
        data[start : start + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))


REFUSED = {
    "garbage": (lambda p: p.write_bytes(b"not a database at all, just some text" * 40), "is not a SQLite database"),
    "another program's": (_foreign, "is a SQLite database of another program"),
    "another application id": (_other_application, "is a SQLite database of another program (application_id 0x4d2)"),
    "newer schema": (_newer, f"has schema version {SCHEMA_VERSION + 1}, written by a newer Veil"),
    "corrupt": (_corrupt, "is corrupt"),
}


@pytest.mark.parametrize(("make", "said"), REFUSED.values(), ids=REFUSED.keys())
def test_a_file_it_cannot_serve_is_refused_in_one_sentence_and_left_as_it_was(path, make, said):
    make(path)
    before = path.read_bytes()
    with pytest.raises(StoreError) as caught:
        SqliteStore(path)
    assert said in one_sentence(caught.value) and str(path) in str(caught.value)
    assert path.read_bytes() == before


def test_a_new_file_gets_the_schema_and_the_application_id(path, opened):
    opened(SqliteStore(path))
    assert sql(path, "PRAGMA application_id") == [(APPLICATION_ID,)]
    assert sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    path2 = path.with_name("empty.db")
    path2.write_bytes(b"")  # an empty file is a new database
    opened(SqliteStore(path2))
    assert sql(path2, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


def test_reads_from_short_lived_threads_leave_no_connections_behind(path, opened, rng):
    """HTTP serves each connection on a thread of its own: a read connection per thread would pile up."""
    store = opened(SqliteStore(path))
    assert store.add(batch(random_counts((3,), 16, rng), key()))
    store.read(key(), (3,), 16)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        thread = threading.Thread(target=store.read, args=(key(), (3,), 16))
        thread.start()
        thread.join()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_a_schema_1_file_is_migrated_in_place_its_buckets_periods_not_said(path, opened, rng):
    """A file written before stores recorded periods (schema 1): its counts stay, its buckets
    read as holding reports of periods not said, and new writes record theirs beside that."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(_MIGRATIONS[0])
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute("PRAGMA user_version = 1")
        db.execute(
            "INSERT INTO buckets (id, metric, fingerprint, window, start, k, weights, batches, version) "
            "VALUES (1, 'm', 'fp1', 'total', 0, 2, '1', 1, 5)"
        )
        db.execute("INSERT INTO counters VALUES (1, 1, 3, ?)", (np.array([2, 1], "<i8").tobytes(),))
        db.commit()
    store = opened(SqliteStore(path))
    assert sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] and SCHEMA_VERSION == 2
    held = store.read(key(), (1,), 2)
    assert held == Counts((1,), [3], [[2, 1]]) and held.periods == {PERIOD_NOT_SAID}
    assert store.add(batch(Counts((1,), [1], [[1, 0]]), key(), period=20000))
    assert store.read(key(), (1,), 2).periods == {PERIOD_NOT_SAID, 20000}
