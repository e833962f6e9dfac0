"""Batches awaiting the aggregator's acknowledgement: in memory, or spooled to disk.

With a queue directory every batch is written to ``outbox/`` (tmp + fsync + rename) before its
first upload and removed when acknowledged, so a restart sends what was never acknowledged.
A batch file is the serialized UploadRequest (randomized reports, their batch id and, since
revision 2, their made_unix: no true value), sent as it is (a file an earlier SDK wrote says no
made_unix and is counted by arrival, as then); its name carries its creation time, its report count and its batch id,
``<unix ms>-<count>-<batch id hex>.batch``, so loading needs no parsing. The files' total size
is capped; a batch beyond the cap is dropped (and counted by the caller).
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._fs import fsync_dir, private_dir, write_atomic
from ._log import LogOnce

__all__ = ["Batch", "Spool", "Outbox"]

_NAME = re.compile(r"^(\d{13})-(\d+)-([0-9a-f]{32})\.batch$")
_STALE_TMP_SECONDS = 600  # a temporary file this old was left by a crash


@dataclass(eq=False)
class Batch:
    seq: int  # order of creation in this process (FIFO); loaded batches come first
    batch_id: bytes
    count: int
    created: float  # Unix time: the retry horizon survives restarts
    payload: bytes | None = None  # None once spooled: read back from `path` when sent
    path: Path | None = None
    size: int = 0
    attempts: int = 0


class Spool:
    DIR = "outbox"

    def __init__(self, queue_dir: Path, max_bytes: int, log: LogOnce) -> None:
        self._dir = private_dir(queue_dir / self.DIR)
        self._max_bytes = max_bytes
        self._log = log
        self.bytes = 0

    def load(self) -> Iterator[tuple[Path, float, int, bytes, int]]:
        """(path, created, count, batch id, size) of every batch on disk, oldest first."""
        now = time.time()
        found = []
        for entry in os.scandir(self._dir):
            match = _NAME.match(entry.name)
            try:
                if match is None:
                    if entry.name.endswith(".tmp") and now - entry.stat().st_mtime > _STALE_TMP_SECONDS:
                        os.unlink(entry.path)
                    continue
                size = entry.stat().st_size
            except OSError:
                continue
            found.append(
                (entry.name, Path(entry.path), int(match[1]) / 1000, int(match[2]), bytes.fromhex(match[3]), size)
            )
        found.sort()
        self.bytes = sum(item[-1] for item in found)
        for _, path, created, count, batch_id, size in found:
            yield path, created, count, batch_id, size

    def fits(self, size: int) -> bool:
        return self.bytes + size <= self._max_bytes

    def write(self, batch: Batch, payload: bytes) -> Path:
        path = self._dir / f"{int(batch.created * 1000):013d}-{batch.count}-{batch.batch_id.hex()}.batch"
        write_atomic(path, payload)
        self.bytes += len(payload)
        return path

    def read(self, path: Path) -> bytes | None:
        """The payload, or None when the file is gone (another process sharing the directory
        sent it)."""
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, batch: Batch) -> None:
        if batch.path is None:
            return
        try:
            batch.path.unlink()
            fsync_dir(self._dir)
        except FileNotFoundError:
            pass
        self.bytes = max(0, self.bytes - batch.size)


class Outbox:
    """FIFO of batches; the worker thread is its only user."""

    def __init__(self, spool: Spool | None, log: LogOnce) -> None:
        self.spool = spool
        self._log = log
        self._batches: deque[Batch] = deque()
        self.reports = 0  # reports in all batches here
        self.in_memory = 0  # reports in batches not spooled (counted against the memory bound)

    def __len__(self) -> int:
        return len(self._batches)

    def head(self) -> Batch | None:
        return self._batches[0] if self._batches else None

    def oldest(self, n: int) -> list[Batch]:
        """The n oldest batches (a copy: the caller may pop them)."""
        return list(itertools.islice(self._batches, n))

    def load(self, first_seq: int) -> int:
        """Queue the batches found on disk; returns the next free seq."""
        seq = first_seq
        if self.spool is not None:
            for path, created, count, batch_id, size in self.spool.load():
                self._batches.append(Batch(seq, batch_id, count, created, path=path, size=size))
                self.reports += count
                seq += 1
        return seq

    def add(self, batch: Batch, payload: bytes) -> bool:
        """Queue a new batch, spooled when there is a spool. False when the disk cap refuses it
        (the caller counts its reports as dropped)."""
        if self.spool is not None:
            if not self.spool.fits(len(payload)):
                return False
            try:
                batch.path = self.spool.write(batch, payload)
                batch.size = len(payload)
            except OSError:
                self._log.warning(
                    "spool:write",
                    "Unsent Veil batches cannot be written under the queue directory; keeping them in memory.",
                )
        if batch.path is None:
            batch.payload = payload
            self.in_memory += batch.count
        self._batches.append(batch)
        self.reports += batch.count
        return True

    def payload(self, batch: Batch) -> bytes | None:
        if batch.payload is not None:
            return batch.payload
        return self.spool.read(batch.path) if self.spool is not None and batch.path is not None else None

    def pop(self, batch: Batch) -> None:
        """Remove a batch (acknowledged, failed or gone; mostly the head) and its file."""
        if self._batches[0] is batch:
            self._batches.popleft()
        else:  # answered in one call with older batches that wait for a retry
            self._batches.remove(batch)
        self.reports -= batch.count
        if batch.path is None:
            self.in_memory -= batch.count
        elif self.spool is not None:
            self.spool.remove(batch)

    def clear_memory(self) -> int:
        """Forget the batches held only in memory (at shutdown); returns their report count."""
        lost = self.in_memory
        self._batches = deque(b for b in self._batches if b.path is not None)
        self.reports -= lost
        self.in_memory = 0
        return lost

    def forked(self) -> Outbox:
        """An empty outbox for a forked child: the parent keeps sending its own batches."""
        return Outbox(self.spool, self._log)
