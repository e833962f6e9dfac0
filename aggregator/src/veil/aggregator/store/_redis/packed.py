"""The packed copy of an ended bucket's counts hash (keys.packed_key), which
RedisStore.settled_read writes and reads: one int64 array rather than a hash's fields."""

from __future__ import annotations

import numpy as np

from ...counts import Counts

__all__ = ["pack_counts", "unpack_counts"]


def pack_counts(version: int, counts: Counts) -> bytes:
    """A packed copy: int64 little-endian version, k, the number R of rows held, the number P
    of periods, their weights, their n, their V rows (R x k), the P periods; the rows of
    weights with no reports are left out (RAPPOR has k + 1 weights, most of them never reported)."""
    rows = np.flatnonzero((counts.n != 0) | counts.v.any(axis=1))
    weights = np.asarray(counts.weights, np.int64)[rows]
    periods = np.array(sorted(counts.periods), np.int64)
    head = np.array([version, counts.k, rows.size, periods.size], np.int64)
    return b"".join(
        part.astype("<i8", copy=False).tobytes() for part in (head, weights, counts.n[rows], counts.v[rows], periods)
    )


def unpack_counts(packed: bytes, version: int, weights: tuple[int, ...], k: int) -> tuple[int, Counts] | None:
    """(version, counts) from a packed copy of a hash at `version`, the design (weights, k); None
    when it is of another version or does not fit the design (then the hash is read: it says
    what is wrong, if anything)."""
    if len(packed) < 32 or len(packed) % 8:
        return None
    flat = np.frombuffer(packed, "<i8")
    held, held_k, rows, count = flat[:4].tolist()
    if held != version or held_k != k or rows < 0 or count < 0 or flat.size != 4 + rows * (k + 2) + count:
        return None
    row_of = {t: r for r, t in enumerate(weights)}
    at = [row_of.get(t, -1) for t in flat[4 : 4 + rows].tolist()]
    if -1 in at:
        return None
    n, v = flat[4 + rows : 4 + 2 * rows], flat[4 + 2 * rows : flat.size - count].reshape(rows, k)
    periods = frozenset(flat[flat.size - count :].tolist())
    if at == list(range(len(weights))):  # every row, in order: n and V read-only views of the copy, not copied
        return version, Counts(weights, n, v, periods)
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64), periods)
    counts.n[at] = n
    counts.v[at] = v
    return version, counts
