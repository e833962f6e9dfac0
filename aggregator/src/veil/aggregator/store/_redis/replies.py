"""Redis's replies read into Counts: a hash's fields (HGETALL) or a design's values (HMGET),
parsed in bulk with numpy, strictly where a value is not what Redis writes for a count; a
hash that does not hold counts of the design is a StoreError naming it."""

from __future__ import annotations

import numpy as np

from ...counts import Counts
from ...errors import StoreError
from .._periods import periods_of
from .fields import field_positions

__all__ = ["checked_versioned", "counts_of", "integers", "not_counts", "parse_version"]


def _checked_counts(name: str, found: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> Counts:
    """Counts from HGETALL's fields; StoreError when the hash does not hold counts of this design."""
    try:
        return counts_of(found, weights, k)
    except (ValueError, OverflowError) as error:  # OverflowError: a value int64 cannot hold
        raise not_counts(name, weights, k, error) from None


def checked_versioned(name: str, found: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> tuple[int, Counts]:
    """The version and the counts in HGETALL's fields; StoreError as _checked_counts."""
    try:
        version = parse_version(found.get(b"version"))
        periods = periods_of(found.pop(b"periods", None)) if found else frozenset()
    except (ValueError, OverflowError) as error:
        raise not_counts(name, weights, k, error) from None
    counts = _checked_counts(name, found, weights, k)
    counts.periods = periods
    return version, counts


def parse_version(value: bytes | None) -> int:
    """A hash's "version" field: 0 when not set; ValueError when not a whole number."""
    if value is None:
        return 0
    if not value.isdigit():
        raise ValueError(f"version is {value!r}, not a whole number")
    return int(value)


def not_counts(name: str, weights: tuple[int, ...], k: int, error: Exception) -> StoreError:
    design = f"{len(weights)} weights, k = {k}"
    return StoreError(f"Redis hash {name} does not hold counts of this design ({design}): {error}")


_INT64_MAX = np.iinfo(np.int64).max
_DIGITS = b"0123456789"


def integers(values: list[bytes | None]) -> tuple[np.ndarray, int]:
    """HMGET's values as int64, a field not set (None) as 0, and how many were set; ValueError
    (or OverflowError) when one is not an integer int64 holds.

    The values are joined with spaces and parsed by numpy in one call (some 5x faster at
    k = 1024 than an array of bytes objects cast to int64), but only when each is certainly
    what Redis writes for a count: digits, and fewer than int64's limit (numpy saturates).
    Anything else goes the strict way, whose result or error it then is."""
    try:
        text = b" ".join(values)  # type: ignore[arg-type]  # a full hash: no None (a None raises TypeError)
        present = len(values)
    except TypeError:
        present = len(values) - values.count(None)
        text = b" ".join([b"0" if value is None else value for value in values])
    count = len(values)
    # Only digits besides the count - 1 separators, and no empty value.
    if (
        count
        and len(text.translate(None, _DIGITS)) == count - 1
        and b"  " not in text
        and text[:1] != b" "
        and text[-1:] != b" "
    ):
        flat = np.fromstring(text, dtype=np.int64, sep=" ")
        if flat.size == count and flat.max() < _INT64_MAX:
            return flat, present
    return np.array([b"0" if value is None else value for value in values]).astype(np.int64), present


def counts_of(fields: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> Counts:
    """Parse a hash's fields into Counts; ValueError when a field does not fit the design."""
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64))
    fields.pop(b"batches", None)
    fields.pop(b"version", None)
    fields.pop(b"periods", None)  # not counts: checked_versioned reads them
    if not fields:
        return counts
    positions = field_positions(weights, k)
    if positions is not None:
        try:
            where = [positions[name] for name in fields]
        except KeyError:
            pass  # a field of another design: the general parser below names it
        else:
            flat = np.zeros(len(weights) * (k + 1), np.int64)
            flat[where] = np.array(list(fields.values())).astype(np.int64)
            counts.n[:] = flat[: len(weights)]
            counts.v[:] = flat[len(weights) :].reshape(len(weights), k)
            return counts
    names = np.array(list(fields))
    values = np.array(list(fields.values())).astype(np.int64)
    kinds = names.astype("S1")
    is_n, is_v = kinds == b"n", kinds == b"v"
    if not (is_n | is_v).all():
        raise ValueError(f"unknown field {names[~(is_n | is_v)][0]!r}")
    row_of = counts.row_of_weight()
    (t,) = _numbers(names[is_n], 2)
    counts.n[_rows(t, row_of)] = values[is_n]
    t, j = _numbers(names[is_v], 3)
    if j.size and (j.min() < 0 or j.max() >= k):
        raise ValueError("a category index out of range")
    counts.v[_rows(t, row_of), j] = values[is_v]
    return counts


def _numbers(names: np.ndarray, width: int) -> np.ndarray:
    """The integers after the kind of fields like b"v:<t>:<j>" (width 3), one row per number."""
    if not names.size:
        return np.zeros((width - 1, 0), np.int64)
    parts = np.array(b":".join(names.tolist()).split(b":")).reshape(-1, width)
    return parts[:, 1:].astype(np.int64).T


def _rows(t: np.ndarray, row_of: np.ndarray) -> np.ndarray:
    if t.size and (t.min() < 0 or t.max() >= len(row_of) or (row_of[t] < 0).any()):
        raise ValueError("a report weight outside the design")
    return row_of[t]
