"""MemoryStore: the store contract in this process, volatile: everything is lost at exit (tests,
and the `memory` store URL where that is the point; SqliteStore keeps counts on one node).

Counters are int64 numpy arrays per bucket behind one lock. Batch ids and buckets that expire
are forgotten lazily: every call first drops whatever a min-heap of expiry times says is due,
so memory stays bounded by what the TTLs keep alive.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from ..counts import PERIOD_NOT_SAID, Counts
from ..errors import StoreError
from ._base import BatchWrite, CountsKey, Store
from ._checks import check_write

__all__ = ["MemoryStore"]

T = TypeVar("T", bound=Hashable)


@dataclass(eq=False)
class _Bucket:
    """One bucket: its counts (with the periods they came from), how many batches made them,
    when it may go (None: never)."""

    counts: Counts
    batches: int = 0
    expires_at: int | None = None


class _Expiries(Generic[T]):
    """Items with the time they may go, earliest first. An item may be pushed again with a later
    time; the owner checks, for each item that falls due, whether it really is."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()  # ties never compare the items themselves

    def push(self, at: float, item: T) -> None:
        heapq.heappush(self._heap, (at, next(self._order), item))

    def due(self, now: float) -> Iterator[T]:
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]

    def any_due(self, now: float) -> bool:
        return bool(self._heap) and self._heap[0][0] <= now


class MemoryStore(Store):
    """Counters in this process, lost when it exits."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # Unix seconds, like the targets' expiry times
        self._lock = threading.Lock()
        self._buckets: dict[CountsKey, _Bucket] = {}
        self._seen: dict[tuple[str, bytes], float] = {}  # (metric, batch id) -> when it may be forgotten
        self._since: dict[tuple[str, str], int] = {}
        self._bucket_expiries: _Expiries[CountsKey] = _Expiries()
        self._seen_expiries: _Expiries[tuple[str, bytes]] = _Expiries()

    def add(self, write: BatchWrite) -> bool:
        check_write(write)
        batch = (write.metric, write.batch_id)
        counts = write.counts
        with self._lock:
            now = self._clock()
            self._purge(now)
            if batch in self._seen:
                return False
            buckets = [self._buckets.get(key) for key, _ in write.targets]
            for (key, _), bucket in zip(write.targets, buckets):  # before changing anything: all targets or none
                if bucket is not None:
                    self._check_bucket(key, bucket, counts.weights, counts.k)
            self._seen[batch] = now + write.dedupe_ttl
            self._seen_expiries.push(self._seen[batch], batch)
            period = PERIOD_NOT_SAID if write.period is None else write.period
            for (key, expires_at), bucket in zip(write.targets, buckets):
                self._add_to(key, bucket, expires_at, counts, period)
            self._purge(now)  # a target whose expiry has already passed goes at once, as in Redis
            return True

    def read(self, key: CountsKey, weights: Sequence[int], k: int) -> Counts:
        with self._lock:
            return self._read(key, tuple(weights), k)

    def _read(self, key: CountsKey, weights: tuple[int, ...], k: int) -> Counts:
        self._purge(self._clock())
        self._check_design(key, weights, k)
        bucket = self._buckets.get(key)
        if bucket is None:
            return Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64))
        return Counts(weights, bucket.counts.n.copy(), bucket.counts.v.copy(), bucket.counts.periods)

    def read_many(self, requests: Sequence[tuple[CountsKey, Sequence[int], int]]) -> list[Counts]:
        """read(key, weights, k) of each request, all at one moment."""
        with self._lock:
            return [self._read(key, tuple(weights), k) for key, weights, k in requests]

    def versions(self, keys: Sequence[CountsKey]) -> list[int]:
        with self._lock:
            self._purge(self._clock())
            return self._versions(keys)

    def _versions(self, keys: Sequence[CountsKey]) -> list[int]:
        return [bucket.batches if (bucket := self._buckets.get(key)) else 0 for key in keys]

    def versioned_read(
        self, keys: Sequence[CountsKey], requests: Sequence[tuple[CountsKey, Sequence[int], int]]
    ) -> tuple[list[int], list[tuple[int, Counts]]]:
        """versions(keys) and read_many(requests), each bucket's counts with their version, all at
        one moment."""
        with self._lock:
            self._purge(self._clock())
            read = [self._read(key, tuple(weights), k) for key, weights, k in requests]
            return self._versions(keys), list(zip(self._versions([key for key, _, _ in requests]), read))

    def since(self, metric: str, fingerprint: str, now: int) -> int:
        with self._lock:
            return self._since.setdefault((metric, fingerprint), int(now))

    def ping(self) -> None:
        """Always reachable."""

    def _add_to(
        self, key: CountsKey, bucket: _Bucket | None, expires_at: int | None, counts: Counts, period: int
    ) -> None:
        """Add counts of a period to the bucket at key (None: there is none yet), whose design was checked."""
        if bucket is None:
            own = Counts(counts.weights, counts.n.copy(), counts.v.copy(), frozenset((period,)))
            self._buckets[key] = _Bucket(own, 1, expires_at)
            if expires_at is not None:
                self._bucket_expiries.push(expires_at, key)
            return
        held = bucket.counts
        np.add(held.n, counts.n, out=held.n)
        np.add(held.v, counts.v, out=held.v)
        held.periods |= {period}
        bucket.batches += 1
        # Only ever the later expiry; a bucket without one (a total window) keeps none.
        if expires_at is not None and bucket.expires_at is not None and expires_at > bucket.expires_at:
            bucket.expires_at = expires_at
            self._bucket_expiries.push(expires_at, key)

    def _check_design(self, key: CountsKey, weights: tuple[int, ...], k: int) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._check_bucket(key, bucket, weights, k)

    @staticmethod
    def _check_bucket(key: CountsKey, bucket: _Bucket, weights: tuple[int, ...], k: int) -> None:
        if bucket.counts.weights != weights or bucket.counts.v.shape[1] != k:
            held = f"{len(bucket.counts.weights)} weights, k = {bucket.counts.k}"
            raise StoreError(f"Bucket {key} holds counts of another design ({held}).")

    def _purge(self, now: float) -> None:
        if not (self._bucket_expiries.any_due(now) or self._seen_expiries.any_due(now)):
            return
        for key in self._bucket_expiries.due(now):
            bucket = self._buckets.get(key)
            if bucket is not None and bucket.expires_at is not None and bucket.expires_at <= now:
                del self._buckets[key]
        for batch in self._seen_expiries.due(now):
            at = self._seen.get(batch)
            if at is not None and at <= now:
                del self._seen[batch]
