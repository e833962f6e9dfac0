"""The MemoryStore's snapshot: a versioned .npz file, written atomically (temporary file, fsync,
rename, fsync of the directory), that round-trips every counter exactly (int64 arrays)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass

import numpy as np

from ..counts import Counts
from ._base import CountsKey, StoreError

__all__ = ["Bucket", "Seen", "save_snapshot", "load_snapshot"]

_FORMAT = "veil-memory-store"
_VERSION = 1

Seen = dict[tuple[str, bytes], float]  # (metric, batch id) -> Unix time the id may be forgotten


@dataclass(eq=False)
class Bucket:
    """One bucket of the MemoryStore: its counts, how many batches made them, when it may go."""

    counts: Counts
    batches: int = 0
    expires_at: int | None = None


def save_snapshot(path: str, buckets: dict[CountsKey, Bucket], seen: Seen) -> None:
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "buckets": [
            [key.metric, key.fingerprint, key.window, key.bucket, list(b.counts.weights), b.batches, b.expires_at]
            for key, b in buckets.items()
        ],
        "seen": [[metric, batch_id.hex(), at] for (metric, batch_id), at in seen.items()],
    }
    arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    for i, bucket in enumerate(buckets.values()):
        arrays[f"n{i}"], arrays[f"v{i}"] = bucket.counts.n, bucket.counts.v
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                np.savez_compressed(file, **arrays)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        # The rename itself is durable only once the directory is on disk.
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as error:
        raise StoreError(f"Cannot write the memory store snapshot {path}: {error}") from error


def load_snapshot(path: str) -> tuple[dict[CountsKey, Bucket], Seen] | None:
    """The snapshot's buckets and batch ids; None when there is no file. A file that cannot be
    read back exactly raises StoreError naming it: starting empty would silently lose counts."""
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as data:
            return _parse(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as error:
        # AttributeError/TypeError: a .npy file or a meta of the wrong shape.
        raise StoreError(f"Cannot load the memory store snapshot {path}: {type(error).__name__}: {error}") from error


def _parse(data: np.lib.npyio.NpzFile) -> tuple[dict[CountsKey, Bucket], Seen]:
    meta = json.loads(data["meta"].tobytes().decode())
    if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
        raise ValueError(f"not a {_FORMAT} snapshot of version {_VERSION}")
    buckets = {}
    for i, (metric, fingerprint, window, start, weights, batches, expires_at) in enumerate(meta["buckets"]):
        n, v = data[f"n{i}"], data[f"v{i}"]
        if n.dtype != np.int64 or v.dtype != np.int64:
            raise ValueError(f"bucket {i} is not int64")
        key = CountsKey(str(metric), str(fingerprint), str(window), int(start))
        counts = Counts(tuple(int(t) for t in weights), n, v)  # checks the shapes (MechanismError is a ValueError)
        buckets[key] = Bucket(counts, int(batches), None if expires_at is None else int(expires_at))
    seen = {(str(metric), bytes.fromhex(batch_id)): float(at) for metric, batch_id, at in meta["seen"]}
    return buckets, seen
