"""The fields of a counts hash: n:<t> and v:<t>:<j> (t a report weight, j a category), their
names for a design, and the field, increment pairs a write sends."""

from __future__ import annotations

import numpy as np

from ...counts import Counts

__all__ = ["field_names", "field_positions", "increments"]


_NAMED_FIELDS = 1 << 16  # designs with at most this many counters have their field names cached
_FIELD_NAMES: dict[tuple[tuple[int, ...], int], np.ndarray] = {}


def field_names(weights: tuple[int, ...], k: int) -> np.ndarray | None:
    """The field names (bytes, in an object array) of n, then of V row by row, of a design
    with few enough counters (a q-subset design has k + 1); None for larger ones (RAPPOR)."""
    if len(weights) * (k + 1) > _NAMED_FIELDS:
        return None
    names = _FIELD_NAMES.get((weights, k))
    if names is None:
        listed = [f"n:{t}".encode() for t in weights] + [f"v:{t}:{j}".encode() for t in weights for j in range(k)]
        names = np.empty(len(listed), object)
        names[:] = listed
        if len(_FIELD_NAMES) >= 64:
            _FIELD_NAMES.clear()
        _FIELD_NAMES[weights, k] = names
    return names


def increments(counts: Counts) -> list[str | int]:
    """Field, increment pairs of the non-zero counts: n:<t> and v:<t>:<j>, t a report weight."""
    names = field_names(counts.weights, counts.k)
    if names is None:
        weights = np.asarray(counts.weights, dtype=np.int64)
        (ns,) = np.nonzero(counts.n)
        rows, cols = np.nonzero(counts.v)
        fields = [f"n:{t}" for t in weights[ns].tolist()]
        fields += [f"v:{t}:{j}" for t, j in zip(weights[rows].tolist(), cols.tolist(), strict=True)]
        values = counts.n[ns].tolist() + counts.v[rows, cols].tolist()  # Python ints: redis-py encodes no numpy
    else:
        flat = np.concatenate([counts.n, counts.v.ravel()])
        (present,) = np.nonzero(flat)
        fields = names[present].tolist()
        values = flat[present].tolist()
    pairs: list[str | int] = [0] * (2 * len(fields))
    pairs[0::2] = fields
    pairs[1::2] = values
    return pairs


_FIELD_POSITIONS: dict[tuple[tuple[int, ...], int], dict[bytes, int]] = {}


def field_positions(weights: tuple[int, ...], k: int) -> dict[bytes, int] | None:
    """Field name -> its position in field_names(weights, k), for designs that have those."""
    positions = _FIELD_POSITIONS.get((weights, k))
    if positions is None:
        names = field_names(weights, k)
        if names is None:
            return None
        positions = {name: i for i, name in enumerate(names.tolist())}
        if len(_FIELD_POSITIONS) >= 64:
            _FIELD_POSITIONS.clear()
        _FIELD_POSITIONS[weights, k] = positions
    return positions
