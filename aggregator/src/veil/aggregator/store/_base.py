"""The store contract: integer counters, added once per batch, read back as Counts.

A batch's counts go to several places at once, one per window of the metric (e.g. the
all-time total and the current hour's bucket). ``add`` applies all of them and records the
batch id in one atomic step, so a batch retried any number of times is counted exactly once.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..counts import Counts
from ..errors import StoreError, StoreMisconfigured

__all__ = ["CountsKey", "BatchWrite", "Store", "Version", "FlushObserver", "AppliedObserver"]

Version = int | tuple[int, ...]  # a bucket's version: see Store.versions


@dataclass(frozen=True)
class CountsKey:
    """Where one window bucket of one metric's counts lives."""

    metric: str
    fingerprint: str  # the metric spec's: counts of different specs never mix
    window: str  # e.g. "total", "1h"
    bucket: int  # the bucket's start, seconds since the Unix epoch (0 for "total")


@dataclass(frozen=True, eq=False)
class BatchWrite:
    """One validated batch: its id, its counts, and every bucket they are added to."""

    metric: str
    batch_id: bytes  # 16 bytes chosen by the device, the same on every retry
    counts: Counts
    # Each bucket with the time (Unix seconds) after which the store may drop it, or None to keep it.
    targets: tuple[tuple[CountsKey, int | None], ...]
    dedupe_ttl: int  # seconds to remember the batch id; at least the SDK's retry horizon
    # The reporting period its reports were made in (Unix seconds // period_seconds): the stores
    # record, per bucket, the periods that received reports (Counts.periods), in the same atomic
    # step as its counts. None: not said (the store knows no period length); it is recorded as
    # PERIOD_NOT_SAID, and the bucket's intervals then allow for every period it spans.
    period: int | None = None


# observer(batches, seconds, failed) after each write call (a group of batches).
FlushObserver = Callable[[int, float, bool], None]
# observer(target, version_before, version_after, counts): this process's write took the target
# from version_before to version_after by adding counts, in one atomic step (with S > 1 shards:
# tuples of S, None at every shard but the one written). (target, None, None, None) when the
# target changed in a way not known here (the write failed, or its data is already gone).
AppliedObserver = Callable[[CountsKey, "int | tuple | None", "int | tuple | None", "Counts | None"], None]


class Store(abc.ABC):
    """Counters for every metric, window and bucket. Implementations: MemoryStore, RedisStore, SqliteStore.

    A store implements the four abstract methods; the others have defaults built on them, which
    a store overrides where it can do better (read_many, settled_read), and two hooks through
    which it reports what it does (observe_flushes, observe_applied; the daemon wires both).
    ``config_options`` reads the store's own settings of a config file's [store] table.
    """

    # The settings of a config file's [store] table this store takes: name -> what it is.
    SETTINGS: ClassVar[dict[str, str]] = {}

    @classmethod
    def config_options(cls, url: str, settings: Mapping[str, object]) -> dict[str, object]:
        """The keyword arguments of this store for a [store] table's settings (its url aside);
        StoreMisconfigured, naming the key, for a setting this store does not take or a bad value."""
        for key in settings:
            taken = ", ".join(cls.SETTINGS) or "none but url"
            raise StoreMisconfigured(
                f"store.{key}: not a setting of the {url.split(':')[0]!r} store (its settings: {taken})."
            )
        return {}

    @abc.abstractmethod
    def add(self, write: BatchWrite) -> bool:
        """Add the batch's counts to every target and remember its id, atomically. True when
        counted now; False when the id was already counted (nothing changes). Raises
        StoreUnavailable when it cannot tell whether the batch was applied."""

    def add_many(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        """add() of each write, in as few write calls as the store can make (a caller may hold a
        whole set of uploads at once): for each, True or False as add
        answers, or the StoreError that add would have raised for it. This default adds them
        one by one; SqliteStore and RedisStore write them as groups."""
        results: list[bool | StoreError] = []
        for write in writes:
            try:
                results.append(self.add(write))
            except StoreError as err:
                results.append(err)
        return results

    def read(self, key: CountsKey, weights: Sequence[int], k: int) -> Counts:
        """The counts in one bucket (zeros where nothing was added)."""
        return self.read_many([(key, weights, k)])[0]

    def read_many(self, requests: Sequence[tuple[CountsKey, Sequence[int], int]]) -> list[Counts]:
        """read(key, weights, k) of each request, all of one moment, in one round trip where the
        store has round trips (RedisStore: one pipeline): what a series of hundreds of buckets
        needs. A bucket never written, or dropped after its retention, reads as zeros.
        This default reads them through versioned_read; stores may do it more cheaply."""
        return [counts for _, counts in self.versioned_read((), requests)[1]]

    def versions(self, keys: Sequence[CountsKey]) -> Sequence[Version]:
        """For each bucket, its version: 0 before anything was added, then a number that changes
        with every write and never comes back for the bucket (MemoryStore: the batches added;
        RedisStore: drawn at random by each write, as a lost write could bring a count back; on
        a cluster with S > 1 shards, the tuple of the S shards' versions once one has one). A cheap way to tell
        whether cached estimates are stale: compare versions for equality only."""
        return self.versioned_read(keys, ())[0]

    @abc.abstractmethod
    def versioned_read(
        self, keys: Sequence[CountsKey], requests: Sequence[tuple[CountsKey, Sequence[int], int]]
    ) -> tuple[Sequence[Version], Sequence[tuple[Version, Counts]]]:
        """versions(keys), and for each (key, weights, k) request its counts (with their
        periods, Counts.periods) with the version they are at, read in one atomic step: LiveEstimates may carry such
        counts forward by the writes it observes, so they must be exactly those of that version."""

    def settled_read(
        self, requests: Sequence[tuple[CountsKey, Sequence[int], int, int | None]]
    ) -> Sequence[tuple[Version, Counts]]:
        """versioned_read((), [(key, weights, k), ...])[1] of buckets that have ended, each with
        when the store may drop it (its targets' expiry; None: never). An ended bucket seldom
        changes, though a late batch can still land in it, so a store may keep a compact copy of
        what it read, tagged with the version, until that expiry, and serve the copy while the
        bucket is still at that version (RedisStore: one GET of a packed array per bucket, not an
        HMGET of its k + 1 fields). Exactly versioned_read's answer either way. This default is
        versioned_read."""
        return self.versioned_read((), [(key, weights, k) for key, weights, k, _ in requests])[1]

    @abc.abstractmethod
    def since(self, metric: str, fingerprint: str, now: int) -> int:
        """When counting of a metric's spec began (Unix seconds): the first ``now`` this was
        asked with, recorded then and kept as long as the store keeps counts. The aggregator
        asks before its first write of a spec, so the time is never after the first report's;
        the intervals of the all-time window allow for one report per device and period since."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Return when the store is reachable and takes writes; raise StoreUnavailable otherwise,
        StoreMisconfigured when it is set up so that a batch could be counted twice."""

    def observe_flushes(self, observer: FlushObserver) -> None:  # noqa: B027 (a hook: a default that does nothing)
        """Call observer(batches, seconds, failed) after every write call. Stores without write
        calls worth timing (MemoryStore) never call it."""

    def observe_applied(self, observer: AppliedObserver) -> None:  # noqa: B027 (a hook: a default that does nothing)
        """Call observer(key, version_before, version_after, counts) for every bucket this
        process's writes took from version_before to version_after by adding counts, once the
        write succeeded and before ``add`` returns; observer(key, None, None, None) when a write
        failed and the bucket may have changed in a way not known. Writes by other processes are
        not observed (their versions show them). LiveEstimates carries its counts forward by
        these instead of reading them again; MemoryStore never calls it (its reads are
        in-process copies, not worth skipping)."""

    def close(self) -> None:  # noqa: B027 (a store without connections has nothing to release)
        """Release connections (and SqliteStore's file lock)."""
