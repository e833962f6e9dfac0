"""Bytes a SQLite store takes per batch id and per bucket (docs/operating.md, "Sizing the store").

Batch ids: N batches of one metric ("browser", 16-byte random ids, the default 48 h dedupe TTL)
into one bucket, the file's pages counted after a checkpoint, minus the file before them.
Buckets: M one-hour buckets of a q-subset metric at k in {16, 128, 1024}, one batch each,
minus the bytes of their batch ids measured first. Run:

    .venv/bin/python bench/sqlite_sizing.py [--ids 200000] [--buckets 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np

from veil.aggregator.counts import Counts
from veil.aggregator.store import BatchWrite, CountsKey, SqliteStore
from veil.mechanism import spec_for


def used_bytes(path: Path) -> int:
    """Pages in use (the file less its free pages), after the WAL is copied in."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (
            db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
        )
    return (pages - free) * size


def batch(metric: str, k: int, targets: list[tuple[CountsKey, int | None]], rng: np.random.Generator) -> BatchWrite:
    weights = Counts.zeros(spec_for("subset", k, 1.0)).weights
    counts = Counts(weights, [1000], rng.integers(0, 1000, (1, k)))
    return BatchWrite(metric, os.urandom(16), counts, tuple(targets), 48 * 3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ids", type=int, default=200_000)
    parser.add_argument("--buckets", type=int, default=2_000)
    args = parser.parse_args()
    rng = np.random.default_rng(14)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "ids.db"
        store = SqliteStore(path, maintenance_interval=3600)
        total = CountsKey("browser", "fp", "total", 0)
        store.add(batch("browser", 16, [(total, None)], rng))
        before = used_bytes(path)
        for _ in range(args.ids):
            store.add(batch("browser", 16, [(total, None)], rng))
        per_id = (used_bytes(path) - before) / args.ids
        store.close()
        results["bytes_per_batch_id"] = round(per_id, 1)
        for k in (16, 128, 1024):
            path = Path(scratch) / f"k{k}.db"
            store = SqliteStore(path, maintenance_interval=3600)
            store.add(batch("browser", k, [(CountsKey("browser", "fp", "1h", 0), 2**40)], rng))
            before = used_bytes(path)
            for i in range(1, args.buckets + 1):
                store.add(batch("browser", k, [(CountsKey("browser", "fp", "1h", 3600 * i), 2**40)], rng))
            per_bucket = (used_bytes(path) - before) / args.buckets - per_id
            store.close()
            results[f"bytes_per_bucket_k{k}"] = round(per_bucket)
    results["sqlite"] = sqlite3.sqlite_version
    json.dump(results, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
