"""Randomize and count reports in batches: simulation, load generation, and summing report
arrays into sufficient statistics.

Randomization here is report for report what ``spec.randomize`` does on a device, driven by a
keystream instead of the OS CSPRNG: on the same random words, ``simulate_reports(spec, values)``
equals ``[spec.randomize(v, WordRandomSource(words)) for v in values]`` (one source shared by
the loop). The default keystream is AES-256-CTR under a fresh random key; FastKeystream is a
seeded generator for reproducible simulation.

Each mechanism is drawn by the batch sampler its registration names (veil.mechanism.MECHANISMS).
Report layouts: a design with a fixed report size (spec.q: subset, krr, warner) gives an (n, q)
uint32 array of sorted category indices; the others (RAPPOR) give (n, ceil(k / 8)) uint8
bitmaps, category j being bit j % 8 (least significant first) of byte j // 8, as
numpy.unpackbits(..., bitorder="little") reads them, with the padding bits zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from veil.mechanism import MechanismError, MechanismSpec, wire_shape

from . import _kernels
from ._keystream import AesCtrKeystream, FastKeystream, Keystream
from .counts import Counts

__all__ = [
    "simulate_counts",
    "simulate_reports",
    "count_reports",
    "Keystream",
    "AesCtrKeystream",
    "FastKeystream",
]

# Words per refill (4 MiB): many reports per kernel call, and a buffer that stays in cache.
CHUNK_WORDS = 1 << 20


class _Design(NamedTuple):
    counts_kernel: Callable
    reports_kernel: Callable
    args: tuple  # the design's arguments to both kernels, after (words, values)
    words_per_report: int  # the fewest words one report takes


# A sampler reads what every design registered with it has (duck-typed: any class may register).
def _q_subset(spec: Any) -> _Design:
    args = (spec.k, spec.q, np.uint64(spec.keep_threshold))
    return _Design(_kernels.subset_counts, _kernels.subset_reports, args, 2 + spec.q)


def _rappor(spec: Any) -> _Design:
    args = (spec.k, np.uint64(spec.flip_threshold), spec.admissible)
    return _Design(_kernels.rappor_counts, _kernels.rappor_reports, args, 2 * spec.k)


# The kernels of each batch sampler a mechanism may name (veil.mechanism.SAMPLERS).
_SAMPLERS: dict[str, Callable[[MechanismSpec], _Design]] = {"q-subset": _q_subset, "rappor": _rappor}


def _design(spec: MechanismSpec) -> _Design:
    sampler = wire_shape(spec.name).sampler
    if sampler is None:
        raise MechanismError(f"There is no batch kernel for the {spec.name!r} mechanism.")
    return _SAMPLERS[sampler](spec)


def _checked_values(spec: MechanismSpec, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise MechanismError("True values must be a one-dimensional array of category indices.")
    if values.size and (values.min() < 0 or values.max() >= spec.k):
        raise MechanismError(f"A true value must be a category index from 0 to {spec.k - 1}.")
    return np.ascontiguousarray(values, dtype=np.int64)


def _checked_counts(spec: MechanismSpec, out: Counts | None) -> Counts:
    if out is None:
        return Counts.zeros(spec)
    if out.k != spec.k or out.weights != spec.weight_law().weights:
        raise MechanismError("These counts belong to a different design than the spec.")
    return out


def _drive(
    step: Callable[[np.ndarray, int], tuple[int, int]], n: int, keystream: Keystream, words_per_report: int
) -> None:
    """Call step(words, start) -> (reports done, words used) until n reports are done, with
    every call's words continuing the stream where the previous call's used words end."""
    if n == 0:
        return
    words = np.empty(min(CHUNK_WORDS, n * words_per_report), np.uint32)
    keystream.fill(words)
    start = 0
    while True:
        done, used = step(words, start)
        start += done
        if start == n:
            return
        tail = words.size - used
        if done == 0:
            # A single report needs more words than the buffer holds (a wide RAPPOR report,
            # or a long run of redraws): double the buffer, keeping all its words.
            grown = np.empty(2 * words.size, np.uint32)
            grown[:tail] = words
            words = grown
        else:
            words[:tail] = words[used:]
        keystream.fill(words[tail:])


def simulate_counts(
    spec: MechanismSpec, values: np.ndarray, *, keystream: Keystream | None = None, out: Counts | None = None
) -> Counts:
    """Randomize each true category index in values and count the reports, per weight, without
    ever holding them; adds into out when given. The default keystream is a fresh
    AesCtrKeystream."""
    design = _design(spec)
    values = _checked_values(spec, values)
    counts = _checked_counts(spec, out)
    rows = counts.row_of_weight()

    def step(words: np.ndarray, start: int) -> tuple[int, int]:
        return design.counts_kernel(words, values[start:], *design.args, rows, counts.n, counts.v)

    _drive(step, values.size, keystream or AesCtrKeystream(), design.words_per_report)
    return counts


def simulate_reports(spec: MechanismSpec, values: np.ndarray, *, keystream: Keystream | None = None) -> np.ndarray:
    """Randomize each true category index in values into one report row (layouts: see the
    module docstring). The default keystream is a fresh AesCtrKeystream."""
    design = _design(spec)
    values = _checked_values(spec, values)
    if spec.q is None:
        out = np.zeros((values.size, (spec.k + 7) // 8), np.uint8)
    else:
        out = np.empty((values.size, spec.q), np.uint32)

    def step(words: np.ndarray, start: int) -> tuple[int, int]:
        return design.reports_kernel(words, values[start:], *design.args, out[start:])

    _drive(step, values.size, keystream or AesCtrKeystream(), design.words_per_report)
    return out


def count_reports(spec: MechanismSpec, reports: np.ndarray, *, out: Counts | None = None) -> Counts:
    """Sum report rows (layouts: see the module docstring) into per-weight counts; adds into
    out when given. Reports are assumed valid, but one naming a category outside the spec or
    of a weight the design never sends raises MechanismError and nothing is counted."""
    counts = _checked_counts(spec, out)
    rows = counts.row_of_weight()
    reports = np.asarray(reports)
    if spec.q is None:
        width = (spec.k + 7) // 8
        if reports.ndim != 2 or reports.dtype != np.uint8 or reports.shape[1] != width:
            raise MechanismError(f"Bitmap reports of this design must be a uint8 array of {width} bytes per row.")
        bad = _kernels.count_bitmaps(np.ascontiguousarray(reports), spec.k, rows, counts.n, counts.v)
        if bad >= 0:
            raise MechanismError(
                f"Report {bad} sets a bit past category {spec.k - 1} or has a weight this design never sends."
            )
    else:
        # Every row has weight reports.shape[1], and q is the one weight with a row.
        if reports.ndim != 2 or reports.dtype.kind not in "iu" or reports.shape[1] != spec.q:
            raise MechanismError(f"Reports of this design must be an integer array of {spec.q} categories per row.")
        bad = _kernels.count_subsets(np.ascontiguousarray(reports), spec.k, rows, counts.n, counts.v)
        if bad >= 0:
            raise MechanismError(f"Report {bad} names a category outside 0 to {spec.k - 1}.")
    return counts
