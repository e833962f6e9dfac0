"""SqliteStore: the store contract in one SQLite file (the standard library's sqlite3), the
single-node default.

Durability: WAL with ``synchronous = FULL``. Every commit appends its pages to the write-ahead
log and fsyncs it before COMMIT returns, and ``add`` returns (the aggregator acknowledges the
batch) only after that, so neither a SIGKILL of the process nor a power loss of the host loses
an acknowledged batch. ``synchronous = NORMAL``, the usual companion of WAL, fsyncs the log only
at checkpoints: commits survive a crash of the process, but a power loss or a kernel crash can
roll back the last ones, which the SDKs have by then deleted from their queues.

Layout (schema version ``SCHEMA_VERSION`` in ``PRAGMA user_version``; ``PRAGMA application_id``
is ``APPLICATION_ID``, "Veil"):

    buckets   one row per window bucket: metric, fingerprint, window, start, the design (k,
              weights), batches added, version (drawn at random by each write), expires_at,
              periods (the reporting periods with data, as _periods.periods_text writes them;
              schema version 2: buckets already there read as PERIOD_NOT_SAID)
    counters  one row per bucket and report weight: n, and V_j as a BLOB of k little-endian int64
    batches   one row per batch id counted (metric, id), until expires_ms
    since     when counting of each metric's spec began (Store.since)

Writes: one connection, one writer at a time. Concurrent ``add`` calls are written together
(group commit, see _coalesce): whichever caller leads writes every queued batch, of any metric,
in one transaction and so one fsync; batches with the same targets and design are summed and
added once per target, as RedisStore does, and the transaction takes a few statements whatever
its groups and metrics (one read of every batch id, one of every bucket, one insert of the ids,
and one batch of updates each for the buckets and their counters). Reads: each thread has its own connection; WAL lets
it read a consistent snapshot while the writer writes.

Expiry: reads and writes take expired batch ids and buckets as gone at once. A maintenance
thread deletes them in chunks of ``_PURGE_CHUNK`` rows, each its own short transaction, so a
write waits for one chunk at most, and logs every bucket deleted.

Checkpoints: the same thread copies the WAL back into the database every ``_CHECKPOINT_EVERY``
transactions (or each ``maintenance_interval``), on a connection of its own while writes go on,
then catches up on the last few frames holding the write lock: a checkpoint racing a steady
writer never finishes, and the WAL only starts over once one has, so without that last step it
would grow for as long as uploads keep coming.

Faults: a full disk or an I/O error rolls the transaction back and raises StoreUnavailable
(nothing of the group was counted; every client retries under its own batch id, counted at
most once), and ``ping`` fails (health NOT_SERVING) until a probe write succeeds again. A file
that is not a SQLite database, belongs to another program, has a newer schema or fails
``PRAGMA quick_check`` is refused with a StoreError of one sentence, as is a file another
process serves: each store holds an exclusive flock on ``<file>.lock`` while open.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..counts import PERIOD_NOT_SAID, Counts
from ..errors import StoreError, StoreUnavailable
from ._base import AppliedObserver, BatchWrite, CountsKey, FlushObserver, Store
from ._checks import check_write
from ._coalesce import Coalescer
from ._periods import NONE_RECORDED, periods_of, periods_text

__all__ = ["SqliteStore", "APPLICATION_ID", "SCHEMA_VERSION", "check_database", "describe_database"]

log = logging.getLogger("veil.aggregator.store")

APPLICATION_ID = 0x5665696C  # b"Veil"
_MAGIC = b"SQLite format 3\x00"
_VERSIONS = (1 << 63) - 1  # versions are drawn from 1 .. 2^63 - 1 (SQLite integers), never 0
_PURGE_CHUNK = 1000  # expired rows deleted per transaction by the maintenance thread
_IDLE_READERS = 16  # read connections kept open between reads
_CHECKPOINT_EVERY = 128  # transactions between checkpoints (some 2-5 MiB of WAL)
_QUICK_CHECK_BYTES = 1 << 30  # files up to this size are checked at open; larger: `veil store check`

# Schema migrations: _MIGRATIONS[i] takes a database from version i to i + 1, in one transaction.
_MIGRATIONS = (
    """
    CREATE TABLE buckets (
        id INTEGER PRIMARY KEY,
        metric TEXT NOT NULL, fingerprint TEXT NOT NULL, window TEXT NOT NULL, start INTEGER NOT NULL,
        k INTEGER NOT NULL, weights TEXT NOT NULL,
        batches INTEGER NOT NULL, version INTEGER NOT NULL, expires_at INTEGER,
        UNIQUE (metric, fingerprint, window, start)
    );
    CREATE INDEX buckets_by_expiry ON buckets (expires_at) WHERE expires_at IS NOT NULL;
    CREATE TABLE counters (
        bucket INTEGER NOT NULL, weight INTEGER NOT NULL, n INTEGER NOT NULL, v BLOB NOT NULL,
        PRIMARY KEY (bucket, weight)
    );
    CREATE TABLE batches (
        metric TEXT NOT NULL, id BLOB NOT NULL, expires_ms INTEGER NOT NULL,
        PRIMARY KEY (metric, id)
    ) WITHOUT ROWID;
    CREATE INDEX batches_by_expiry ON batches (expires_ms);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
    CREATE TABLE since (
        metric TEXT NOT NULL, fingerprint TEXT NOT NULL, started INTEGER NOT NULL,
        PRIMARY KEY (metric, fingerprint)
    ) WITHOUT ROWID;
    """,
    f"""
    ALTER TABLE buckets ADD COLUMN periods TEXT NOT NULL DEFAULT '{NONE_RECORDED}';
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)

# Errors after which the same write may succeed later (disk full, I/O error, locked, out of memory).
_TRANSIENT_CODES = {
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_NOMEM",
    "SQLITE_CANTOPEN",
    "SQLITE_READONLY",
}

_T = TypeVar("_T")
_Group = tuple[str, tuple[tuple[CountsKey, "int | None"], ...], tuple[int, ...], int, int]


class SqliteStore(Store):
    """Counters in one SQLite file (``sqlite:///path`` URL); see the module doc."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        coalesce: int = 256,
        maintenance_interval: float = 1.0,
        busy_timeout: float = 2.0,
    ) -> None:
        if coalesce < 1:
            raise ValueError("coalesce must be at least 1 (1: every batch in its own transaction).")
        self._path = os.path.abspath(os.fspath(path))
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._lock_fd = _lock(self._path)
        try:
            self._writer = _open_checked(self._path, busy_timeout)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._writer.create_function("veil_add", 2, _add_blobs, deterministic=True)
        self._write_lock = threading.Lock()
        self._write_failed: str | None = None  # why the last write failed, while it may pass later
        self._coalescer: Coalescer[BatchWrite, bool | StoreError] = Coalescer(self._flush, max_batches=coalesce)
        self._applied_observers: list[AppliedObserver] = []
        self._idle_readers: list[sqlite3.Connection] = []  # read connections not in use; see _reading
        self._readers_lock = threading.Lock()
        self._closed = threading.Event()
        self._maintenance_interval = maintenance_interval
        self._commits = 0  # transactions since the last checkpoint
        self._checkpoint_due = threading.Event()
        self._maintenance = threading.Thread(target=self._maintain, name="veil-sqlite-maintenance", daemon=True)
        self._maintenance.start()
        log.info(
            "SQLite store open",
            extra={
                "path": self._path,
                "schema_version": SCHEMA_VERSION,
                "bytes": os.path.getsize(self._path),
                "synchronous": "FULL",
            },
        )

    @property
    def path(self) -> str:
        return self._path

    # --- observers -------------------------------------------------------------------------

    def observe_flushes(self, observer: FlushObserver) -> None:
        """Call observer(batches, seconds, failed) after every transaction that adds batches."""
        self._coalescer.observe(observer)

    def observe_applied(self, observer: AppliedObserver) -> None:
        """As RedisStore.observe_applied: observer(target, version_before, version_after, counts)
        for every bucket a committed transaction changed, before any of its batches' ``add``
        returns; observer(target, None, None, None) for the targets of a failed one."""
        self._applied_observers.append(observer)

    def _notify(self, target: CountsKey, before: int | None, after: int | None, counts: Counts | None) -> None:
        for observer in self._applied_observers:
            try:
                observer(target, before, after, counts)
            except Exception:  # noqa: BLE001 (an observer must never fail a write)
                pass

    # --- writes ----------------------------------------------------------------------------

    def add(self, write: BatchWrite) -> bool:
        check_write(write)
        result = self._coalescer.submit(None, write)  # one group: every batch in the next transaction
        if isinstance(result, StoreError):
            raise result
        return result

    def add_many(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        for write in writes:
            check_write(write)
        try:
            return list(self._coalescer.submit_many(None, writes))  # one transaction, with others queued
        except StoreError as err:
            return [err] * len(writes)

    def _flush(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        """Write a group of batches in one transaction; for each, True when applied now, False
        when its id was counted before (or earlier in writes), or the StoreError of a batch
        whose bucket holds another design (nothing of it is written)."""
        now = self._clock()
        now_ms = int(now * 1000)
        results: list[bool | StoreError] = [False] * len(writes)
        applied: list[tuple[CountsKey, int | None, int | None, Counts | None]] = []
        with self._write_lock, self._boundary("add", writing=True):
            db = self._writer
            db.execute("BEGIN IMMEDIATE")
            try:
                # Each group: the writes with the same targets, design and period whose ids are new.
                groups: dict[_Group, list[int]] = {}
                for i in _unseen(db, writes, now_ms):
                    write = writes[i]
                    period = PERIOD_NOT_SAID if write.period is None else write.period
                    group = (write.metric, write.targets, write.counts.weights, write.counts.k, period)
                    groups.setdefault(group, []).append(i)
                # A few statements for the whole transaction, whatever its groups and metrics: each
                # runs with the GIL let go, and every time it is taken back other threads may
                # hold it a while. Every group's buckets are read at once, kept up to date here
                # as groups add to them (two groups may share a bucket), and written at the end.
                held = _held_buckets(db, [target for group in groups for target, _ in group[1]])
                ids: list[tuple[str, bytes, int]] = []
                written = _Written()
                for (metric, targets, weights, k, period), members in groups.items():
                    rows = [held.get(target) for target, _ in targets]
                    other = _other_designs(targets, rows, weights, k, now)
                    if other is not None:
                        for i in members:  # each caller raises its own exception object
                            results[i] = _other_design(*other)
                        continue
                    counts = writes[members[0]].counts
                    if len(members) > 1:
                        counts = Counts.summed([writes[i].counts for i in members])
                    ids += [(metric, writes[i].batch_id, now_ms + 1000 * writes[i].dedupe_ttl) for i in members]
                    g = len(members)
                    for target, expires_at in targets:
                        applied.append(_add_to_bucket(db, held, written, target, expires_at, counts, period, g, now))
                    for i in members:
                        results[i] = True
                written.write(db, ids)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                if self._applied_observers:
                    for write in writes:
                        for target, _ in write.targets:
                            self._notify(target, None, None, None)
                raise
        self._write_failed = None
        self._commits += 1
        if self._commits >= _CHECKPOINT_EVERY:
            self._checkpoint_due.set()
        for target, before, after, added in applied:
            self._notify(target, before, after, added)
        return results

    def since(self, metric: str, fingerprint: str, now: int) -> int:
        """The time first recorded for this spec, recording `now` (committed) when there is none."""
        with self._write_lock, self._boundary("since", writing=True):
            db = self._writer
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT OR IGNORE INTO since (metric, fingerprint, started) VALUES (?, ?, ?)",
                    (metric, fingerprint, int(now)),
                )
                started = db.execute(
                    "SELECT started FROM since WHERE metric = ? AND fingerprint = ?", (metric, fingerprint)
                ).fetchone()[0]
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        return started

    # --- reads -----------------------------------------------------------------------------

    def versioned_read(
        self, keys: Sequence[CountsKey], requests: Sequence[tuple[CountsKey, Sequence[int], int]]
    ) -> tuple[list[int], list[tuple[int, Counts]]]:
        """versions(keys) and read_many(requests), every bucket with the version its counts are
        at, all in one read transaction (one snapshot of the file)."""
        now = self._clock()
        with self._reading() as db, self._boundary("read"):
            db.execute("BEGIN")
            try:
                live = _live_buckets(db, [*keys, *(key for key, _, _ in requests)], now)
                versions = [row[3] if (row := live.get(key)) else 0 for key in keys]
                counters = _counters(db, [row[0] for key, _, _ in requests if (row := live.get(key))])
                read = [_read_bucket(key, tuple(weights), k, live.get(key), counters) for key, weights, k in requests]
            finally:
                _rollback(db)  # a read transaction: nothing to commit
        return versions, read

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A read connection of this store's pool for the block, opened when none is idle (one
        per concurrent reader: HTTP serves each connection on a thread of its own, so a
        connection per thread would pile up), at most _IDLE_READERS kept."""
        if self._closed.is_set():
            raise StoreUnavailable(f"The SQLite store {self._path} is closed.")
        with self._readers_lock:
            db = self._idle_readers.pop() if self._idle_readers else None
        if db is None:
            with self._boundary("read"):
                db = _connect(self._path, self._busy_timeout)
                db.execute("PRAGMA query_only = ON")
        try:
            yield db
        finally:
            with self._readers_lock:
                keep = not self._closed.is_set() and len(self._idle_readers) < _IDLE_READERS
                if keep:
                    self._idle_readers.append(db)
            if not keep:
                db.close()

    # --- health and maintenance ------------------------------------------------------------

    def ping(self) -> None:
        """Reachable unless closed, or the last write failed in a way that can pass (a full
        disk, an I/O error) and a probe write fails too."""
        if self._closed.is_set():
            raise StoreUnavailable(f"The SQLite store {self._path} is closed.")
        if self._write_failed is None:
            return
        with self._write_lock, self._boundary("probe", writing=True):
            try:
                self._writer.execute("BEGIN IMMEDIATE")
                self._writer.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)", (time.time(),))
                self._writer.execute("COMMIT")
            except BaseException:
                _rollback(self._writer)
                raise
        log.info("SQLite store writable again", extra={"path": self._path})
        self._write_failed = None

    def _maintain(self) -> None:
        try:
            checkpointer = _connect(self._path, self._busy_timeout)
        except sqlite3.Error as error:
            log.error(
                "SQLite maintenance cannot start: expired rows stay until the next start",
                extra={"path": self._path, "error": str(error)},
            )
            return
        purged = time.monotonic()
        try:
            while not self._closed.is_set():
                self._checkpoint_due.wait(self._maintenance_interval)
                self._checkpoint_due.clear()
                try:
                    if time.monotonic() - purged >= self._maintenance_interval:
                        purged = time.monotonic()
                        self.purge()
                    self._checkpoint(checkpointer)
                except (StoreError, sqlite3.Error) as error:
                    log.warning(
                        "SQLite maintenance failed; retried in a moment",
                        extra={"path": self._path, "error": str(error)},
                    )
                except Exception:  # noqa: BLE001 (not the store's: logged whole, and the thread goes on)
                    log.exception(
                        "SQLite maintenance failed unexpectedly; retried in a moment", extra={"path": self._path}
                    )
        finally:
            checkpointer.close()

    def _checkpoint(self, checkpointer: sqlite3.Connection) -> None:
        """Copy the WAL into the database: the bulk beside the writer, the rest holding the write
        lock, so the next transaction starts the WAL over (see the module doc)."""
        self._commits = 0
        checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        with self._write_lock:
            if not self._closed.is_set():
                with self._boundary("checkpoint", writing=True):
                    self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def purge(self) -> tuple[int, int]:
        """Delete expired batch ids and buckets now, a chunk per transaction; (ids, buckets)
        deleted. The maintenance thread calls this every ``maintenance_interval`` seconds."""
        ids = buckets = 0
        while not self._closed.is_set():
            now = self._clock()
            with self._write_lock, self._boundary("purge", writing=True):
                db = self._writer
                db.execute("BEGIN IMMEDIATE")
                try:
                    gone = db.execute(
                        "DELETE FROM batches WHERE (metric, id) IN (SELECT metric, id FROM batches "
                        "WHERE expires_ms <= ? LIMIT ?)",
                        (int(now * 1000), _PURGE_CHUNK),
                    ).rowcount
                    expired = db.execute(
                        "SELECT id, metric, window, start FROM buckets WHERE expires_at <= ? LIMIT ?",
                        (now, _PURGE_CHUNK),
                    ).fetchall()
                    for row in expired:
                        db.execute("DELETE FROM counters WHERE bucket = ?", (row[0],))
                        db.execute("DELETE FROM buckets WHERE id = ?", (row[0],))
                    db.execute("COMMIT")
                except BaseException:
                    _rollback(db)
                    raise
            ids += gone
            buckets += len(expired)
            if expired:
                log.info(
                    "expired buckets deleted (window retention)",
                    extra={
                        "path": self._path,
                        "buckets": len(expired),
                        "windows": sorted({f"{metric}/{window}" for _, metric, window, _ in expired}),
                    },
                )
            if gone < _PURGE_CHUNK and len(expired) < _PURGE_CHUNK:
                return ids, buckets
        return ids, buckets

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._checkpoint_due.set()
        self._maintenance.join(10)
        with self._readers_lock:
            for db in self._idle_readers:  # those in use close when their read ends
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            self._idle_readers.clear()
        with self._write_lock:
            with contextlib.suppress(sqlite3.Error):
                self._writer.close()
        os.close(self._lock_fd)

    @contextlib.contextmanager
    def _boundary(self, what: str, *, writing: bool = False) -> Iterator[None]:
        """sqlite3's errors as the store's, in one sentence; a failed write that may pass later
        (disk full, I/O) makes ping() probe until a write succeeds."""
        try:
            yield
        except sqlite3.Error as error:
            message = f"The SQLite store {self._path} failed {what}: {error}."
            # SQLITE_IOERR_FSYNC -> SQLITE_IOERR
            code = "_".join((getattr(error, "sqlite_errorname", None) or "").split("_")[:2])
            if code in _TRANSIENT_CODES:
                if writing:
                    if self._write_failed is None:
                        log.error(
                            "SQLite write failed: the batches of this transaction were not counted, "
                            "their clients retry them",
                            extra={"path": self._path, "error": str(error)},
                        )
                    self._write_failed = str(error)
                raise StoreUnavailable(message) from error
            log.error("SQLite store error", extra={"path": self._path, "error": str(error)})
            raise StoreError(message) from error


# --- the write path -------------------------------------------------------------------------


def _unseen(db: sqlite3.Connection, writes: Sequence[BatchWrite], now_ms: int) -> list[int]:
    """The positions of the writes whose batch ids are not counted (or were, but expired), the
    first of a repeated id only; one query for all of them (per _TERMS), whatever their metrics."""
    wanted = list(dict.fromkeys((write.metric, write.batch_id) for write in writes))
    taken: set[tuple[str, bytes]] = set()
    for at in range(0, len(wanted), _TERMS):
        terms = _padded(wanted[at : at + _TERMS])
        found = db.execute(
            "SELECT metric, id, expires_ms FROM batches WHERE " + " OR ".join(["(metric = ? AND id = ?)"] * len(terms)),
            [value for term in terms for value in term],
        )
        taken.update((metric, batch_id) for metric, batch_id, expires_ms in found if expires_ms > now_ms)
    unseen = []
    for i, write in enumerate(writes):
        batch = (write.metric, write.batch_id)
        if batch not in taken:
            taken.add(batch)
            unseen.append(i)
    return unseen


def _padded(items: list[_T]) -> list[_T]:
    """The items, the last repeated up to a power of two: a statement's text depends on how many
    it takes, and so few texts stay in the connection's cache of prepared statements. A repeated
    id in IN, or row in INSERT OR REPLACE, changes nothing."""
    return items + items[-1:] * ((1 << (len(items) - 1).bit_length()) - len(items))


def _held_buckets(db: sqlite3.Connection, targets: Sequence[CountsKey]) -> dict[CountsKey, tuple]:
    """The rows of the targets' buckets that exist, expired or not, as the write path needs
    them: id, k, weights, version, expires_at, periods; one query (per _TERMS buckets)."""
    wanted = list(dict.fromkeys(targets))
    found = {}
    for at in range(0, len(wanted), _TERMS):
        terms = _padded(wanted[at : at + _TERMS])
        for metric, fingerprint, window, start, *row in db.execute(
            "SELECT metric, fingerprint, window, start, id, k, weights, version, expires_at, periods FROM buckets "
            "WHERE " + " OR ".join(["(metric = ? AND fingerprint = ? AND window = ? AND start = ?)"] * len(terms)),
            [value for term in terms for value in _where(term)],
        ):
            found[CountsKey(metric, fingerprint, window, start)] = tuple(row)
    return found


class _Written:
    """What a transaction's groups add, gathered to be written in a few statements at the end:
    the buckets' new batches, versions, expiries and periods, and the counters' rows."""

    def __init__(self) -> None:
        self.buckets: list[tuple[int, int, int | None, str, int]] = []
        self.counters: list[tuple[int, int, int, bytes]] = []

    def write(self, db: sqlite3.Connection, ids: list[tuple[str, bytes, int]]) -> None:
        for at in range(0, len(ids), _TERMS):
            rows = _padded(ids[at : at + _TERMS])
            values = ", ".join(["(?, ?, ?)"] * len(rows))
            db.execute(
                f"INSERT OR REPLACE INTO batches (metric, id, expires_ms) VALUES {values}",
                [value for row in rows for value in row],
            )
        if self.buckets:
            db.executemany(
                "UPDATE buckets SET batches = batches + ?, version = ?, expires_at = ?, periods = ? WHERE id = ?",
                self.buckets,
            )
        if self.counters:
            db.executemany(
                "INSERT INTO counters (bucket, weight, n, v) VALUES (?, ?, ?, ?) ON CONFLICT (bucket, weight) "
                "DO UPDATE SET n = n + excluded.n, v = veil_add(v, excluded.v)",
                self.counters,
            )


def _other_designs(
    targets, held: Sequence[tuple | None], weights: tuple[int, ...], k: int, now: float
) -> tuple[CountsKey, tuple] | None:
    """The first target holding live counts of another design, with that design; None when none does."""
    text = _weights_text(weights)
    for (target, _), row in zip(targets, held):
        if row is not None and (row[4] is None or row[4] > now) and (row[1] != k or row[2] != text):
            return target, row[1:3]
    return None


def _add_to_bucket(
    db: sqlite3.Connection,
    held: dict[CountsKey, tuple],
    written: _Written,
    target: CountsKey,
    expires_at: int | None,
    counts: Counts,
    period: int,
    batches: int,
    now: float,
) -> tuple[CountsKey, int | None, int | None, Counts | None]:
    """Add counts (of `batches` batches made in `period`) to a bucket whose design was checked:
    a new bucket's row is inserted now (its id is needed), the rest gathered in `written`, and
    `held` (the buckets' rows) updated to match. What observers hear of it: (target, version
    before, version after, counts), or Nones when it is gone."""
    row = held.get(target)
    if row is not None and row[4] is not None and row[4] <= now:  # expired, not yet purged: gone
        _delete_bucket(db, row[0])
        del held[target]
        row = None
    if row is not None:
        # Only ever the later expiry; a bucket without one (a total window) keeps none.
        kept = row[4]
        expiry = None if kept is None else (kept if expires_at is None else max(kept, expires_at))
    else:
        expiry = expires_at
    if expiry is not None and expiry <= now:  # a target already past its expiry goes at once
        return target, None, None, None
    version = 1 + secrets.randbelow(_VERSIONS)
    if row is None:
        periods = f",{period},"
        bucket = db.execute(
            "INSERT INTO buckets (metric, fingerprint, window, start, k, weights, batches, version, "
            "expires_at, periods) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*_where(target), counts.k, _weights_text(counts.weights), batches, version, expiry, periods),
        ).lastrowid
        assert bucket is not None
        before = 0
    else:
        bucket, before = row[0], row[3]
        recorded = periods_of(row[5])
        periods = row[5] if period in recorded else periods_text(recorded | {period})
        written.buckets.append((batches, version, expiry, periods, bucket))
    held[target] = (bucket, counts.k, _weights_text(counts.weights), version, expiry, periods)
    written.counters += [
        (bucket, int(t), int(counts.n[r]), counts.v[r].astype("<i8", copy=False).tobytes())
        for r, t in enumerate(counts.weights)
        if counts.n[r] or counts.v[r].any()
    ]
    return target, before, version, Counts(counts.weights, counts.n, counts.v, frozenset((period,)))


def _add_blobs(held: bytes, added: bytes) -> bytes:
    """veil_add(v, w): the element-wise sum of two int64 vectors (SQL function of the writer)."""
    return (np.frombuffer(held, "<i8") + np.frombuffer(added, "<i8")).tobytes()


def _delete_bucket(db: sqlite3.Connection, bucket: int) -> None:
    db.execute("DELETE FROM counters WHERE bucket = ?", (bucket,))
    db.execute("DELETE FROM buckets WHERE id = ?", (bucket,))


# --- the read path --------------------------------------------------------------------------


def _where(key: CountsKey) -> tuple[str, str, str, int]:
    return key.metric, key.fingerprint, key.window, int(key.bucket)


def _weights_text(weights: Sequence[int]) -> str:
    return ",".join(str(int(t)) for t in weights)


_CHUNK = 500  # values per IN (...) list, well below SQLite's limit on a statement's parameters
_TERMS = 128  # (metric, id) or bucket terms per OR of the write path, rows per INSERT of batch ids


def _live_buckets(db: sqlite3.Connection, keys: Sequence[CountsKey], now: float) -> dict[CountsKey, tuple]:
    """(id, k, weights, version, periods) of each of the keys' buckets that exists and has not expired:
    one query per metric, spec and window (per _CHUNK buckets), not one per bucket, as a series
    of hundreds of buckets reads them."""
    starts: dict[tuple[str, str, str], set[int]] = {}
    for key in keys:
        starts.setdefault((key.metric, key.fingerprint, key.window), set()).add(int(key.bucket))
    found = {}
    for (metric, fingerprint, window), unordered in starts.items():
        wanted = sorted(unordered)
        for at in range(0, len(wanted), _CHUNK):
            chunk = wanted[at : at + _CHUNK]
            for start, *row in db.execute(
                f"SELECT start, id, k, weights, version, periods FROM buckets WHERE metric = ? AND fingerprint = ? AND "
                f"window = ? AND start IN ({', '.join('?' * len(chunk))}) "
                f"AND (expires_at IS NULL OR expires_at > ?)",
                (metric, fingerprint, window, *chunk, now),
            ):
                found[CountsKey(metric, fingerprint, window, start)] = tuple(row)
    return found


def _counters(db: sqlite3.Connection, buckets: Sequence[int]) -> dict[int, list[tuple[int, int, bytes]]]:
    """The (weight, n, V blob) rows of each bucket id, _CHUNK buckets per query."""
    found: dict[int, list[tuple[int, int, bytes]]] = {}
    wanted = sorted(set(buckets))
    for at in range(0, len(wanted), _CHUNK):
        chunk = wanted[at : at + _CHUNK]
        for bucket, weight, n, v in db.execute(
            f"SELECT bucket, weight, n, v FROM counters WHERE bucket IN ({', '.join('?' * len(chunk))})", chunk
        ):
            found.setdefault(bucket, []).append((weight, n, v))
    return found


def _read_bucket(
    key: CountsKey,
    weights: tuple[int, ...],
    k: int,
    row: tuple | None,
    counters: dict[int, list[tuple[int, int, bytes]]],
) -> tuple[int, Counts]:
    """The version and counts of a bucket from its _live_buckets row (None: none) and _counters."""
    if row is not None and (row[1] != k or row[2] != _weights_text(weights)):
        raise _other_design(key, row[1:3])
    held = counters.get(row[0], ()) if row is not None else ()
    if len(held) == 1 and len(weights) == 1 and held[0][0] == weights[0]:
        # A q-subset bucket: V is a read-only view of the blob read, not a copy (720 buckets at
        # k = 1024 would copy 5.9 MB); counts read from a store are never added to in place.
        _, n, v = held[0]
        periods = periods_of(row[4])  # type: ignore[index]
        return row[3], Counts(weights, np.array([n], np.int64), np.frombuffer(v, "<i8").reshape(1, k), periods)  # type: ignore[index]
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64))
    if row is None:
        return 0, counts
    counts.periods = periods_of(row[4])
    rows = {t: r for r, t in enumerate(weights)}
    for t, n, v in held:
        r = rows[t]
        counts.n[r] = n
        counts.v[r] = np.frombuffer(v, "<i8")
    return row[3], counts


def _other_design(key: CountsKey, held: Sequence[object]) -> StoreError:
    k, weights = held[0], str(held[1])
    return StoreError(f"Bucket {key} holds counts of another design ({len(weights.split(','))} weights, k = {k}).")


# --- opening a file -------------------------------------------------------------------------


def _connect(path: str, busy_timeout: float, *, readonly: bool = False) -> sqlite3.Connection:
    uri = Path(path).as_uri() + ("?mode=ro" if readonly else "")
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=busy_timeout)


def _lock(path: str) -> int:
    """An exclusive flock on <path>.lock, held while the store is open (the file descriptor);
    StoreError when another process holds it. The store's files are then owner-only (_owner_only)."""
    directory = os.path.dirname(path)
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            log.info("data directory created", extra={"path": directory})
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise StoreError(f"Cannot open the SQLite store {path}: {error.strerror or error}.") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreError(
            f"The SQLite store {path} is in use by another process (pid {holder}): one aggregator "
            f"serves a SQLite file at a time."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    try:
        _owner_only(fd, path)
    except OSError as error:
        os.close(fd)
        raise StoreError(f"Cannot make the SQLite store {path} owner-only: {error.strerror or error}.") from None
    return fd


def _owner_only(lock_fd: int, path: str) -> None:
    """The store's files readable and writable by their owner only (0600), whatever the umask
    and whatever mode files already there had: the lock, the database (created empty here if
    missing, so SQLite never creates it under the umask), and its -wal and -shm, which SQLite
    creates with the database's mode."""
    os.fchmod(lock_fd, 0o600)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, 0o600)


def _open_checked(path: str, busy_timeout: float) -> sqlite3.Connection:
    """The writer's connection to a checked file, migrated to SCHEMA_VERSION and in WAL mode."""
    size = os.path.getsize(path) if os.path.exists(path) else 0
    problem = check_database(path, full=size <= _QUICK_CHECK_BYTES, missing_ok=True)
    if problem is not None:
        raise StoreError(problem)
    if size > _QUICK_CHECK_BYTES:
        log.info(
            "SQLite store too large to check at every start; `veil store check` checks it",
            extra={"path": path, "bytes": size},
        )
    try:
        db = _connect(path, busy_timeout)
    except sqlite3.Error as error:
        raise StoreError(f"Cannot open the SQLite store {path}: {error}.") from None
    try:
        if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
            raise StoreError(f"The SQLite store {path} cannot use a write-ahead log (WAL) here.")
        db.execute("PRAGMA synchronous = FULL")  # see the module doc: an acknowledged batch is on disk
        db.execute("PRAGMA wal_autocheckpoint = 0")  # the maintenance thread checkpoints, not an upload
        db.execute("PRAGMA journal_size_limit = 16777216")  # the WAL file shrinks back to 16 MiB after a checkpoint
        version = db.execute("PRAGMA user_version").fetchone()[0]
        for target in range(version + 1, SCHEMA_VERSION + 1):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _MIGRATIONS[target - 1].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {target}")
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
            log.info(
                "SQLite store schema migrated" if version else "SQLite store created",
                extra={"path": path, "schema_version": target},
            )
    except sqlite3.Error as error:
        db.close()
        raise StoreError(f"Cannot open the SQLite store {path}: {error}.") from None
    except BaseException:
        db.close()
        raise
    return db


def describe_database(path: str) -> list[str]:
    """What a checked Veil database holds, a line each: sizes, schema, batch ids, and per metric
    and window its buckets and reports (for `veil store check`; read-only)."""
    now = time.time()
    db = _connect(path, 2.0, readonly=True)
    try:
        wal = Path(path + "-wal")
        lines = [
            f"file {os.path.getsize(path):,} bytes, write-ahead log {wal.stat().st_size if wal.exists() else 0:,} "
            f"bytes; schema version {db.execute('PRAGMA user_version').fetchone()[0]} (this Veil: "
            f"{SCHEMA_VERSION})"
        ]
        live, expired = db.execute(
            "SELECT count(*) FILTER (WHERE expires_ms > ?), count(*) FILTER (WHERE expires_ms <= ?) FROM batches",
            (now * 1000, now * 1000),
        ).fetchone()
        lines.append(f"batch ids: {live:,} remembered, {expired:,} expired and not yet purged")
        for metric, window, buckets, stale, reports in db.execute(
            "SELECT b.metric, b.window, count(DISTINCT b.id), "
            "count(DISTINCT b.id) FILTER (WHERE b.expires_at <= ?), "
            "coalesce(sum(c.n) FILTER (WHERE b.expires_at IS NULL OR b.expires_at > ?), 0) FROM buckets b "
            "LEFT JOIN counters c ON c.bucket = b.id GROUP BY b.metric, b.window ORDER BY 1, 2",
            (now, now),
        ):
            lines.append(
                f"{metric} [{window}]: {buckets - stale:,} bucket{'s' * (buckets - stale != 1)}"
                + (f" (and {stale:,} expired)" if stale else "")
                + f", {reports:,} reports"
            )
        return lines
    finally:
        db.close()


def check_database(path: str, *, full: bool = True, missing_ok: bool = False, integrity: bool = False) -> str | None:
    """None when the file can be served by this version (a Veil database of schema version at
    most SCHEMA_VERSION, or an empty or missing file when missing_ok), else the problem in one
    sentence. full: also run PRAGMA quick_check (O(file size)), or with integrity PRAGMA
    integrity_check (slower: indexes too). Changes nothing."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_MAGIC))
    except FileNotFoundError:
        return None if missing_ok else f"There is no SQLite store at {path}."
    except OSError as error:
        return f"Cannot read the SQLite store {path}: {error.strerror or error}."
    if not head and missing_ok:
        return None
    if head != _MAGIC:
        return f"{path} is not a SQLite database; move it away or point store.url elsewhere."
    try:
        db = _connect(path, 2.0, readonly=True)
    except sqlite3.Error as error:
        return f"Cannot open the SQLite store {path}: {error}."
    try:
        application_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
        if application_id != APPLICATION_ID and (application_id != 0 or tables):
            return (
                f"{path} is a SQLite database of another program (application_id {application_id:#x}), not a "
                f"Veil store; point store.url elsewhere."
            )
        if version > SCHEMA_VERSION:
            return (
                f"{path} has schema version {version}, written by a newer Veil; this one reads versions up to "
                f"{SCHEMA_VERSION}, so upgrade Veil or point store.url elsewhere."
            )
        if full:
            check = "integrity_check" if integrity else "quick_check"
            found = [row[0] for row in db.execute(f"PRAGMA {check}(1)")]
            if found != ["ok"]:
                lines = [line for line in found[0].splitlines() if line.strip() and not line.startswith("***")]
                first = " ".join((lines or found)[0].split())[:200]
                return (
                    f"{path} is corrupt ({check}: {first}); restore it from a backup, or move it away to start empty."
                )
    except sqlite3.DatabaseError as error:
        return f"{path} is corrupt or not a Veil store ({error}); restore it from a backup, or move it away."
    finally:
        db.close()
    return None


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
