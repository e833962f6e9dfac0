"""MemoryStore beyond the contract: snapshots, lazy expiry on a controlled clock, open_store."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from store_cases import batch, doubled, key, random_counts

from veil.aggregator.store import MemoryStore, StoreError, open_store


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_snapshot_round_trips_exactly(tmp_path, rng):
    path, clock = tmp_path / "counts.npz", Clock()
    store = MemoryStore(path, clock=clock)
    hour = (key("ünï:{x}", "1h", 3600), int(clock.now) + 600)
    rappor = random_counts(range(65), 64, rng, rows=8)
    big = random_counts((3,), 5, rng)
    big.v[0, 0] = 2**62  # beyond float64's exact integers
    writes = [batch(rappor, key("ünï:{x}"), hour), batch(big, key(fingerprint="fp2")), batch(rappor, key("ünï:{x}"))]
    assert all(store.add(w) for w in writes)
    store.close()
    again = MemoryStore(path, clock=clock)
    assert again.read(key("ünï:{x}"), range(65), 64) == doubled(rappor)
    assert again.read(hour[0], range(65), 64) == rappor
    assert again.read(key(fingerprint="fp2"), (3,), 5) == big
    assert again.versions([key("ünï:{x}"), hour[0], key(fingerprint="fp2")]) == [2, 1, 1]
    assert [again.add(w) for w in writes] == [False] * 3  # batch ids are kept with their expiry
    clock.now += 601
    assert again.versions([hour[0]]) == [0]  # so is the bucket's expiry
    assert sorted(os.listdir(tmp_path)) == ["counts.npz"]  # no temporary file left


def test_save_can_be_called_any_time_and_needs_a_path(tmp_path, rng):
    store = MemoryStore(tmp_path / "s.npz")
    store.save()  # an empty store saves and reloads empty
    assert MemoryStore(tmp_path / "s.npz").versions([key()]) == [0]
    counts = random_counts((1,), 3, rng)
    store.add(batch(counts, key()))
    store.save()
    assert MemoryStore(tmp_path / "s.npz").read(key(), (1,), 3) == counts
    with pytest.raises(ValueError, match="snapshot_path"):
        MemoryStore().save()
    MemoryStore().close()  # nothing to write


def _npz(path: Path, **arrays: np.ndarray) -> None:
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def _meta(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


def _one_bucket(weights: str) -> np.ndarray:
    bucket = f'["m", "f", "w", 0, {weights}, 1, null]'
    return _meta(f'{{"format": "veil-memory-store", "version": 1, "buckets": [{bucket}], "seen": []}}')


CORRUPTIONS = {
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(300)),
    "npy": lambda p: np.save(p.open("wb"), np.arange(3)),
    "other zip": lambda p: zipfile.ZipFile(p, "w").writestr("x", "y"),
    "bad json": lambda p: _npz(p, meta=_meta("{")),
    "other format": lambda p: _npz(p, meta=_meta('{"format": "x", "version": 1}')),
    "missing array": lambda p: _npz(p, meta=_one_bucket("[1]")),
    "float counts": lambda p: _npz(
        p,
        meta=_one_bucket("[1]"),
        n0=np.ones(1),
        v0=np.ones((1, 2)),
    ),
    "wrong shape": lambda p: _npz(
        p,
        meta=_one_bucket("[1, 2]"),
        n0=np.ones(1, np.int64),
        v0=np.ones((1, 2), np.int64),
    ),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_snapshot_is_an_error_naming_the_file(tmp_path, corrupt):
    path = tmp_path / "bad.npz"
    corrupt(path)
    with pytest.raises(StoreError, match="bad.npz"):
        MemoryStore(path)


def test_a_truncated_snapshot_is_an_error(tmp_path, rng):
    store = MemoryStore(tmp_path / "s.npz")
    store.add(batch(random_counts(range(9), 8, rng), key()))
    store.save()
    data = (tmp_path / "s.npz").read_bytes()
    (tmp_path / "s.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match="s.npz"):
        MemoryStore(tmp_path / "s.npz")


def test_a_failed_save_keeps_the_previous_snapshot(tmp_path, rng, monkeypatch):
    counts = random_counts((1,), 3, rng)
    store = MemoryStore(tmp_path / "s.npz")
    store.add(batch(counts, key()))
    store.save()
    store.add(batch(counts, key()))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", disk_full)
    with pytest.raises(StoreError, match="s.npz"):
        store.save()
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["s.npz"]
    assert MemoryStore(tmp_path / "s.npz").read(key(), (1,), 3) == counts
    store.save()
    assert MemoryStore(tmp_path / "s.npz").read(key(), (1,), 3) == doubled(counts)


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
    store = open_store(f"memory://{tmp_path}/snap.npz")
    store.close()
    assert (tmp_path / "snap.npz").exists()
    for bad in ("memory:", "memory://host/x", "memory:///", "http://h/", "redis://h:port/0", "postgres://u:pw@h/db"):
        with pytest.raises(ValueError, match="Bad") as caught:
            open_store(bad)
        assert "pw" not in str(caught.value)
