"""Every numba loop of the aggregator, and only those: plain kernels that write into arrays the
caller owns (counts are added to, never reset).

Randomizing kernels consume uint32 random words in exactly the order
veil.mechanism.WordRandomSource does, report by report, so that on the same words they send
what ``spec.randomize(value, WordRandomSource(words))`` sends. A report is drawn into scratch
and committed only once complete: when the words run out a kernel stops at the last report
boundary and returns (reports done, words those used); the caller refills and calls again on
the rest.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "subset_counts",
    "subset_reports",
    "rappor_counts",
    "rappor_reports",
    "count_subsets",
    "count_bitmaps",
]

# error_model="numpy": the one modulo below has a nonzero divisor, so skip Python's check.
_JIT = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")


def _kernel(function):
    """njit with _JIT. Where the install has nowhere writable for numba's on-disk cache (a
    read-only image without NUMBA_CACHE_DIR), numba refuses cache=True at decoration: compile
    at each start instead of failing to import."""
    try:
        return njit(**_JIT)(function)
    except RuntimeError:
        return njit(**{**_JIT, "cache": False})(function)

_OUT = -1  # the position a draw returns when the words ran out
_SHIFT = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)
_WORD = np.uint64(1 << 32)


# --- one decision ------------------------------------------------------------------------


@_kernel
def _bits64(words, pos):
    """WordRandomSource.bits64 at words[pos:pos + 2], the first word the high half: uniform
    on [0, 2**64), so ``_bits64(...) < T`` is true with probability exactly T / 2**64."""
    return (np.uint64(words[pos]) << _SHIFT) | np.uint64(words[pos + 1])


@_kernel
def _below(words, pos, n):
    """WordRandomSource.below(n) from words[pos:]: (uniform value in [0, n), next position),
    or (0, _OUT) when the words ran out."""
    bound = np.uint64(n)
    if pos >= words.size:
        return 0, _OUT
    product = np.uint64(words[pos]) * bound
    pos += 1
    low = product & _LOW
    if low < bound:
        # Lemire: of the 2**32 words, each result is hit floor(2**32 / n) or one more times;
        # rejecting the lowest (2**32 - n) mod n values of `low` leaves exactly the floor.
        floor = (_WORD - bound) % bound
        while low < floor:
            if pos >= words.size:
                return 0, _OUT
            product = np.uint64(words[pos]) * bound
            pos += 1
            low = product & _LOW
    return np.int64(product >> _SHIFT), pos


# --- one report --------------------------------------------------------------------------


@_kernel
def _draw_subset(words, pos, value, k, q, keep_threshold, stamp, mark, picks):
    """SubsetSpec.randomize(value) into picks[:q], unsorted (a kept value first). Returns the
    next position, or _OUT when the words ran out.

    Floyd's algorithm as veil.mechanism._random.choose, over the k - 1 other categories (index
    i stands for category i + (i >= value)); stamp[i] == mark says i is already chosen in
    this report, so the stamp array never needs clearing."""
    if words.size - pos < 2:
        return _OUT
    c = 0
    # The kept value goes first and no flag outlives this branch: with a flag tested after the
    # loop, numba reference-counts picks and stamp on every call, which costs 5x the draw.
    if _bits64(words, pos) < keep_threshold:
        picks[0] = value
        c = 1
    pos += 2
    others = k - 1
    for j in range(others - (q - c), others):
        t, pos = _below(words, pos, j + 1)
        if pos == _OUT:
            return _OUT
        pick = j if stamp[t] == mark else t
        stamp[pick] = mark
        picks[c] = pick + (pick >= value)
        c += 1
    return pos


@_kernel
def _flip_bits(words, pos, value, k, flip_threshold, picks):
    """One RAPPOR draw from words[pos:pos + 2k]: bit j is the one-hot bit (j == value) flipped
    when bits64 < flip_threshold. The set bits go, ascending, into picks[:weight] (written
    without a branch, so picks needs room for k); returns the weight."""
    weight = 0
    for j in range(k):
        picks[weight] = j
        weight += (j == value) != (_bits64(words, pos + 2 * j) < flip_threshold)
    return weight


@_kernel
def _draw_rappor(words, pos, value, k, flip_threshold, admissible, picks):
    """RapporSpec.randomize(value), or AdmissibleRapporSpec's (redrawing weights 0 and k), into
    picks[:weight]. Returns (next position, weight), or (_OUT, 0) when the words ran out.

    One exit, after the loop: a return inside it makes numba reference-count picks and words
    on every call, which costs more than the draw."""
    weight = 0
    drawn = False
    while not drawn and words.size - pos >= 2 * k:
        weight = _flip_bits(words, pos, value, k, flip_threshold, picks)
        pos += 2 * k
        drawn = not admissible or 0 < weight < k
    return (pos, weight) if drawn else (_OUT, 0)


@_kernel
def _add_report(picks, weight, rows, n, v):
    """Count one report holding categories picks[:weight] (rows: Counts.row_of_weight())."""
    row = rows[weight]
    n[row] += 1
    for c in range(weight):
        v[row, picks[c]] += 1


# numba's own sort costs some 100 ns even for one item, so reports are sorted by one of these
# two. Insertion sort takes about q^2 / 4 steps, each a branch a random report mispredicts;
# marking takes k steps without one; measured, they break even near q^2 = 2k. The kernel picks
# one per batch: choosing inside a helper makes numba reference-count its arrays on every call.


@_kernel
def _insertion_sort(picks, count):
    """Sort picks[:count] in place."""
    for c in range(1, count):
        x = picks[c]
        d = c
        while d > 0 and picks[d - 1] > x:
            picks[d] = picks[d - 1]
            d -= 1
        picks[d] = x


@_kernel
def _sort_by_marks(picks, count, present, mark):
    """Sort picks[:count], distinct categories below present.size, in place: mark them in
    present, then read every category back in order, branch-free (so picks needs room for k)."""
    for c in range(count):
        present[picks[c]] = mark
    c = 0
    for category in range(present.size):
        picks[c] = category
        c += present[category] == mark


@_kernel
def _unpack_bits(bitmap, picks):
    """The set bits of a bitmap (bit j is bit j % 8 of byte j // 8), ascending, into
    picks[:weight], branch-free (so picks needs room for 8 * bitmap.size); returns the weight."""
    weight = 0
    for b in range(bitmap.size):
        byte = bitmap[b]
        for bit in range(8):
            picks[weight] = 8 * b + bit
            weight += (byte >> bit) & 1
    return weight


# --- batches -----------------------------------------------------------------------------


@_kernel
def subset_counts(words, values, k, q, keep_threshold, rows, n, v):
    """Randomize values under a q-subset design and add the reports into n and v.
    Returns (reports done, words used)."""
    stamp = np.full(k - 1, -1, np.int64)
    picks = np.empty(q, np.int64)
    pos = 0
    for i in range(values.size):
        following = _draw_subset(words, pos, values[i], k, q, keep_threshold, stamp, i, picks)
        if following == _OUT:
            return i, pos
        _add_report(picks, q, rows, n, v)
        pos = following
    return values.size, pos


@_kernel
def subset_reports(words, values, k, q, keep_threshold, out):
    """Randomize values under a q-subset design into out[i] (sorted category indices).
    Returns (reports done, words used)."""
    stamp = np.full(k - 1, -1, np.int64)
    present = np.full(k, -1, np.int64)
    picks = np.empty(k, np.int64)
    by_marks = q * q > 2 * k
    pos = 0
    for i in range(values.size):
        following = _draw_subset(words, pos, values[i], k, q, keep_threshold, stamp, i, picks)
        if following == _OUT:
            return i, pos
        if by_marks:
            _sort_by_marks(picks, q, present, i)
        else:
            _insertion_sort(picks, q)
        for c in range(q):
            out[i, c] = picks[c]
        pos = following
    return values.size, pos


@_kernel
def rappor_counts(words, values, k, flip_threshold, admissible, rows, n, v):
    """Randomize values under (admissible) RAPPOR and add the reports into n and v.
    Returns (reports done, words used)."""
    picks = np.empty(k, np.int64)
    pos = 0
    for i in range(values.size):
        following, weight = _draw_rappor(words, pos, values[i], k, flip_threshold, admissible, picks)
        if following == _OUT:
            return i, pos
        _add_report(picks, weight, rows, n, v)
        pos = following
    return values.size, pos


@_kernel
def rappor_reports(words, values, k, flip_threshold, admissible, out):
    """Randomize values under (admissible) RAPPOR into the zeroed bitmaps out[i].
    Returns (reports done, words used)."""
    picks = np.empty(k, np.int64)
    pos = 0
    for i in range(values.size):
        following, weight = _draw_rappor(words, pos, values[i], k, flip_threshold, admissible, picks)
        if following == _OUT:
            return i, pos
        for c in range(weight):
            j = picks[c]
            out[i, j >> 3] |= np.uint8(1 << (j & 7))
        pos = following
    return values.size, pos


@_kernel
def count_subsets(reports, k, rows, n, v):
    """Add reports of category indices (one report per row, all of weight reports.shape[1],
    which must have a row) into n and v. Returns the first report naming a category outside
    [0, k), touching nothing, or -1 once all are counted."""
    weight = reports.shape[1]
    for i in range(reports.shape[0]):
        for c in range(weight):
            if reports[i, c] < 0 or reports[i, c] >= k:
                return i
    for i in range(reports.shape[0]):
        _add_report(reports[i], weight, rows, n, v)
    return -1


@_kernel
def count_bitmaps(reports, k, rows, n, v):
    """Add bitmap reports (ceil(k / 8) bytes per row) into n and v. Returns the first report
    with a bit set past k or a weight without a row, touching nothing, or -1 once all are
    counted."""
    picks = np.empty(8 * reports.shape[1], np.int64)
    for i in range(reports.shape[0]):
        weight = _unpack_bits(reports[i], picks)
        # picks ascend, so the last set bit is the largest; below k it also bounds the weight.
        if weight > 0 and picks[weight - 1] >= k:
            return i
        if rows[weight] < 0:
            return i
    for i in range(reports.shape[0]):
        _add_report(picks, _unpack_bits(reports[i], picks), rows, n, v)
    return -1
