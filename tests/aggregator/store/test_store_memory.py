"""MemoryStore beyond the contract: lazy expiry on a controlled clock; open_store's URLs."""

from __future__ import annotations

import pytest
from store_cases import batch, key, random_counts

from veil.aggregator.errors import StoreError
from veil.aggregator.store import MemoryStore, SqliteStore, open_store


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_expired_batch_ids_and_buckets_are_purged_so_memory_stays_bounded(rng):
    clock = Clock()
    store = MemoryStore(clock=clock)
    counts = random_counts((1,), 2, rng)
    for i in range(1000):
        assert store.add(batch(counts, key(), (key(window="1m", bucket=60 * i), int(clock.now) + 60), ttl=30))
    assert (len(store._seen), len(store._buckets)) == (1000, 1001)
    clock.now += 61
    assert store.versions([key()]) == [1000]
    assert (len(store._seen), len(store._buckets)) == (0, 1)  # only the total is left


def test_a_bucket_keeps_its_latest_expiry_and_a_total_none(rng):
    clock, hour, counts = Clock(), key(window="1h", bucket=3600), random_counts((1,), 2, rng)
    store = MemoryStore(clock=clock)
    now = int(clock.now)
    assert store.add(batch(counts, key(), (hour, now + 600)))
    assert store.add(batch(counts, (key(), now + 300), (hour, now + 300)))  # never shortens, nor ends a total
    clock.now = now + 599
    assert store.versions([key(), hour]) == [2, 2]
    assert store.add(batch(counts, (hour, now + 900)))
    clock.now = now + 899
    assert store.versions([key(), hour]) == [2, 3]
    clock.now = now + 900
    assert store.versions([key(), hour]) == [2, 0]


def test_a_bucket_of_another_design_refuses_the_whole_batch(rng):
    store = MemoryStore()
    assert store.add(batch(random_counts((1,), 3, rng), key(window="1h")))
    with pytest.raises(StoreError, match="design"):
        store.add(batch(random_counts((2,), 3, rng), key(), key(window="1h"), batch_id=b"\x05" * 16))
    assert store.versions([key(), key(window="1h")]) == [0, 1]
    assert store.add(batch(random_counts((2,), 3, rng), key(), batch_id=b"\x05" * 16))  # the id was not taken


def test_open_store_urls(tmp_path):
    assert isinstance(open_store("memory"), MemoryStore)
    store = open_store(f"sqlite://{tmp_path}/data/veil.db")  # its directory is made
    assert isinstance(store, SqliteStore) and store.path == f"{tmp_path}/data/veil.db"
    store.close()
    for bad in (
        "memory:",
        "memory://host/x",
        "memory:///",
        "http://h/",
        "redis://h:port/0",
        "postgres://u:pw@h/db",
        "sqlite://",
        "sqlite:relative.db",
        "sqlite://host/x.db",
        f"sqlite://{tmp_path}/",
    ):
        with pytest.raises(ValueError, match="Bad") as caught:
            open_store(bad)
        assert "pw" not in str(caught.value)


def test_the_snapshot_url_is_refused_with_a_sentence_pointing_to_sqlite(tmp_path):
    with pytest.raises(ValueError, match=r"no longer writes a snapshot .* 'sqlite:///path/to/veil\.db'"):
        open_store(f"memory://{tmp_path}/snapshot.json")
    assert not (tmp_path / "snapshot.json").exists()
