"""Counts and batches for the store tests (module name unique in the tree: tests are rootless)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Sequence

import numpy as np

from veil.aggregator.counts import Counts
from veil.aggregator.store import BatchWrite, CountsKey, RedisStore, SqliteStore

# Metric names that would collide, break the key grammar or escape a hash tag if used raw.
# Socket timeouts of a RedisStore whose test is not about timeouts: a reply delayed by a loaded
# machine is not a failure (a server that is down refuses the connection at once anyway).
PATIENT = {"socket_timeout": 30.0, "socket_connect_timeout": 30.0}

AWKWARD_METRICS = ("a", "a:b", "a:c:fp", "a}", "{a", "{a}", "}{", "a b", "a%3Ab", "ünïcødé 📈", "veil:{a}:c")


def random_counts(weights: Sequence[int], k: int, rng: np.random.Generator, rows: int | None = None) -> Counts:
    """Counts of a design with these weights; when rows is given only that many weights (the
    first and last included) have reports, as in a real RAPPOR batch, so most counters are zero."""
    weights = tuple(weights)
    n = np.zeros(len(weights), np.int64)
    v = np.zeros((len(weights), k), np.int64)
    every = np.arange(len(weights))
    used = every if rows is None else np.unique(np.r_[0, every[-1], rng.choice(every, rows)])
    n[used] = rng.integers(1, 1000, used.size)
    v[used] = rng.integers(0, n[used, None] + 1, (used.size, k))
    v[used] *= rng.random((used.size, k)) < 0.8  # some zero counters among the non-zero rows
    return Counts(weights, n, v)


def key(metric: str = "m", window: str = "total", bucket: int = 0, fingerprint: str = "fp1") -> CountsKey:
    return CountsKey(metric, fingerprint, window, bucket)


def batch(
    counts: Counts,
    *targets: CountsKey | tuple[CountsKey, int | None],
    batch_id: bytes | None = None,
    ttl: int = 3600,
    period: int | None = None,
) -> BatchWrite:
    """A batch of counts to these targets (a bare key never expires), of the first target's metric."""
    pairs = tuple(t if isinstance(t, tuple) else (t, None) for t in targets)
    return BatchWrite(pairs[0][0].metric, batch_id or os.urandom(16), counts, pairs, ttl, period)


def doubled(counts: Counts, times: int = 2) -> Counts:
    return Counts(counts.weights, counts.n * times, counts.v * times)


def batches_added(store, keys: Sequence[CountsKey]) -> list[int]:
    """How many batches each bucket has counted: what an exactly-once test checks. MemoryStore's
    version is that number; RedisStore's version is drawn at random by each write, and the count
    is the "batches" field of its hash, or the sum over its shards' (read here through the
    store's own client); SqliteStore's, the bucket row's (read here on a connection of the
    test's own)."""
    if isinstance(store, RedisStore):
        return [
            sum(int(store._redis.hget(name, "batches") or 0) for name in store.bucket_hashes(place)) for place in keys
        ]
    if isinstance(store, SqliteStore):
        with contextlib.closing(sqlite3.connect(store.path)) as db:
            return [
                (
                    db.execute(
                        "SELECT batches FROM buckets WHERE metric = ? AND fingerprint = ? AND window = ? "
                        "AND start = ? AND (expires_at IS NULL OR expires_at > ?)",
                        (p.metric, p.fingerprint, p.window, p.bucket, time.time()),
                    ).fetchone()
                    or [0]
                )[0]
                for p in keys
            ]
    return store.versions(keys)
