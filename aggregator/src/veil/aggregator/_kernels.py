"""Every numba loop of the aggregator, and only those: plain kernels that write into arrays the
caller owns (counts are added to, never reset).

Randomizing kernels consume uint32 random words in exactly the order
veil.mechanism.WordRandomSource does, report by report, so that on the same words they send
what ``spec.randomize(value, WordRandomSource(words))`` sends. A report is committed only once
complete (drawn into scratch, or counted as drawn and taken back): when the words run out a
kernel stops at the last report boundary and returns (reports done, words those used); the
caller refills and calls again on the rest.

Compile flags live in _JIT alone. No fastmath: the kernels are integer arithmetic whose exact
results are the point, and score_intervals does numpy's float operations in numpy's order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = [
    "sfc64_fill",
    "subset_counts",
    "subset_reports",
    "rappor_counts",
    "rappor_reports",
    "count_subsets",
    "count_bitmaps",
    "decode_index_sets",
    "decode_hashed",
    "decode_subset_bitmaps",
    "decode_bitmaps",
    "encode_categories",
    "score_intervals",
    "simplex_projections",
]

# error_model="numpy": the one modulo below has a nonzero divisor, so skip Python's check.
_JIT: dict[str, Any] = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")  # njit's options


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
#
# WordRandomSource.below(n), one word w per try: the product w * n splits into a result (its
# high 32 bits, in [0, n)) and a remainder `low` (its low 32 bits). Of the 2**32 words, each
# result is hit floor(2**32 / n) or one more times; rejecting the words whose `low` is below
# (2**32 - n) mod n leaves exactly the floor for each, so the result is exactly uniform. As
# low >= n never rejects, the modulo is computed only when low < n (once in 2**32 / n words).
# The Floyd loops below inline this, with the words counted ahead: every draw takes at least
# one word, so a report whose remaining draws outnumber the words left cannot complete.


@_kernel
def _word(words, pos):
    """words[pos] as a uint64, indexed as unsigned: pos is never negative here, and a signed
    index makes numba test for a negative one (wraparound) on every read."""
    return np.uint64(words[np.uint64(pos)])


@_kernel
def _bits64(words, pos):
    """WordRandomSource.bits64 at words[pos:pos + 2], the first word the high half: uniform
    on [0, 2**64), so ``_bits64(...) < T`` is true with probability exactly T / 2**64."""
    return (_word(words, pos) << _SHIFT) | _word(words, pos + 1)


# --- one report --------------------------------------------------------------------------


@_kernel
def _draw_subset(words, pos, value, k, q, keep_threshold, stamp, mark, picks):
    """SubsetSpec.randomize(value) into picks[:q], unsorted (a kept value first). Returns the
    next position, or _OUT when the words ran out.

    Floyd's algorithm as veil.mechanism._random.choose, over the k - 1 other categories (index
    i stands for category i + (i >= value)); stamp[i] == mark says i is already chosen in
    this report, so the stamp array never needs clearing. Each below(j + 1) is Lemire's, inlined
    (see "one decision")."""
    size = words.size
    if size - pos < 2:
        return _OUT
    c = 0
    # The kept value goes first and no flag outlives this branch: with a flag tested after the
    # loop, numba reference-counts picks and stamp on every call, which costs 5x the draw.
    if _bits64(words, pos) < keep_threshold:
        picks[0] = value
        c = 1
    pos += 2
    others = k - 1
    first = others - (q - c)
    if size - pos < others - first:
        return _OUT
    for j in range(first, others):
        bound = np.uint64(j + 1)
        product = _word(words, pos) * bound
        pos += 1
        if (product & _LOW) < bound:
            # A rejection: its next try and the later draws need others - j words.
            floor = (_WORD - bound) % bound
            while (product & _LOW) < floor:
                if size - pos < others - j:
                    return _OUT
                product = _word(words, pos) * bound
                pos += 1
        t = np.int64(product >> _SHIFT)
        pick = j if stamp[np.uint64(t)] == mark else t
        stamp[np.uint64(pick)] = mark
        picks[np.uint64(c)] = pick + (pick >= value)
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
    Returns (reports done, words used).

    _draw_subset with each pick added into the counts as it is drawn, not kept and added after
    (a fifth faster, measured). A report that runs out of words midway is taken back: its
    picks are exactly the indices stamped with its mark, and its kept value is added only once
    it is complete."""
    stamp = np.full(k - 1, -1, np.int64)
    row = rows[q]
    counts = v[row]
    size = words.size
    others = k - 1
    pos = 0
    for i in range(values.size):
        value = values[i]
        if size - pos < 2:
            return i, pos
        keep = _bits64(words, pos) < keep_threshold
        first = others - q + keep
        at = pos + 2
        if size - at < others - first:
            return i, pos
        j = first
        while j < others:
            bound = np.uint64(j + 1)
            product = _word(words, at) * bound
            at += 1
            if (product & _LOW) < bound:
                floor = (_WORD - bound) % bound
                while (product & _LOW) < floor and size - at >= others - j:
                    product = _word(words, at) * bound
                    at += 1
                if (product & _LOW) < floor:
                    break  # the words ran out
            t = np.int64(product >> _SHIFT)
            pick = j if stamp[np.uint64(t)] == i else t
            stamp[np.uint64(pick)] = i
            counts[np.uint64(pick + (pick >= value))] += 1
            j += 1
        if j < others:
            for index in range(others):
                if stamp[index] == i:
                    counts[index + (index >= value)] -= 1
            return i, pos
        counts[value] += keep
        n[row] += 1
        pos = at
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


# --- decoding uploads --------------------------------------------------------------------
#
# One pass over a batch's packed payload that validates every report and sums it into counts
# the caller has just zeroed. A kernel stops at the first bad report and returns its index
# (the counts then hold a part of the batch: the caller drops them); -1 when all are counted.
# What makes a report bad is exactly what veil.aggregator.decode's whole-array checks say.

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_BYTE = np.uint64(0xFF)
_SHIFT56 = np.uint64(56)
_LANE_LIMIT = 255  # reports a byte lane counts before it is spilled


@_kernel
def _popcount64(x):
    """Set bits of a uint64 (LLVM turns this into one popcnt where the CPU has it)."""
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return (x * _H01) >> _SHIFT56


@_kernel
def _spill(lanes, totals):
    """Add the byte lanes into totals and clear them: byte b of lanes[w, bit] counts bit
    ``bit`` of payload byte 8w + b, that is category 8 (8w + b) + bit."""
    for w in range(lanes.shape[0]):
        for bit in range(8):
            word = lanes[w, bit]
            for b in range(8):
                totals[8 * (8 * w + b) + bit] += np.int64((word >> np.uint64(8 * b)) & _BYTE)
            lanes[w, bit] = 0


@_kernel
def decode_subset_bitmaps(data, count, k, q, v):
    """Bitmaps of a q-subset design: data holds count rows of ceil(k / 8) bytes. A report is
    bad when a padding bit (past k) is set or its weight is not q. Adds each report's bits into
    v (int64, k); returns the first bad report or -1.

    The bits are summed without unpacking them (SWAR): a row is copied into a zero-padded
    scratch of 64-bit words, and bit ``bit`` of all eight bytes of a word is masked out at once
    into eight byte-wide counters, spilled into wide totals every 255 reports, before a byte
    can overflow. About 20x fewer operations than a loop over the bits."""
    width = (k + 7) // 8
    words = (width + 7) // 8
    padding = (0xFF << (k - 8 * (width - 1))) & 0xFF
    row = np.zeros(words, np.uint64)
    row_bytes = row.view(np.uint8)  # its tail past width stays zero
    lanes = np.zeros((words, 8), np.uint64)
    totals = np.zeros(64 * words, np.int64)
    pending = 0
    for i in range(count):
        at = i * width
        if data[at + width - 1] & padding:
            return i
        for b in range(width):
            row_bytes[b] = data[at + b]
        weight = np.uint64(0)
        for w in range(words):
            word = row[w]
            weight += _popcount64(word)
            for bit in range(8):
                lanes[w, bit] += (word >> np.uint64(bit)) & _H01
        if np.int64(weight) != q:
            return i
        pending += 1
        if pending == _LANE_LIMIT:
            _spill(lanes, totals)
            pending = 0
    _spill(lanes, totals)
    for j in range(k):
        v[j] += totals[j]
    return -1


@_kernel
def decode_bitmaps(data, count, k, rows, n, v):
    """Bitmaps of any design (RAPPOR: one row of counts per report weight): data holds count
    rows of ceil(k / 8) bytes. A report is bad when a padding bit is set or its weight has no
    row (rows[t] < 0). Adds each report into n and v; returns the first bad report or -1."""
    width = (k + 7) // 8
    words = (width + 7) // 8
    padding = (0xFF << (k - 8 * (width - 1))) & 0xFF
    scratch = np.zeros(words, np.uint64)
    scratch_bytes = scratch.view(np.uint8)  # its tail past width stays zero
    for i in range(count):
        at = i * width
        if data[at + width - 1] & padding:
            return i
        for b in range(width):
            scratch_bytes[b] = data[at + b]
        weight = np.uint64(0)
        for w in range(words):
            weight += _popcount64(scratch[w])
        row = rows[np.int64(weight)]
        if row < 0:
            return i
        n[row] += 1
        for b in range(width):
            byte = data[at + b]
            for bit in range(min(8, k - 8 * b)):  # padding bits are zero here, and past v's end
                v[row, 8 * b + bit] += (byte >> bit) & 1
    return -1


@_kernel
def decode_index_sets(reports, k, v):
    """Index sets of a q-subset design, one report per row. A report is bad when its indices
    are not strictly increasing or one is k or more. Adds each report into v (int64, k);
    returns the first bad report or -1."""
    q = reports.shape[1]
    for i in range(reports.shape[0]):
        previous = np.int64(-1)
        for c in range(q):
            index = np.int64(reports[i, c])
            if index <= previous or index >= k:
                return i
            previous = index
        for c in range(q):
            v[reports[i, c]] += 1
    return -1


@_kernel
def decode_hashed(reports, parents, extend, modulus, buckets, v):
    """Hashed reports of a strings round (veil.mechanism.HashedSpec), one report per row of
    uint32 words (a_0 .. a_(CODE_BYTES - 1), c, bucket: the row's length says how many). The
    candidates are the rows of ``parents`` (uint8, one prefix of L bytes per row), each extended
    by every byte when ``extend`` (v: 256 per parent, in byte order), else the parents
    themselves. A report is bad when a coefficient is not below the modulus or its bucket not
    below ``buckets``. Adds into v (int64) the reports that hold each candidate: h(u) = (c +
    sum_i a_i u_i) mod P in bucket mask; returns the first bad report or -1. The 256
    extensions' hashes are (h(parent) + a_L x) mod P: a table of a_L x mod P per report makes
    each parent's 256 tests independent of one another."""
    mask = np.int64(buckets - 1)
    size = parents.shape[1]
    c = reports.shape[1] - 2  # the constant's word; the bucket's follows it
    table = np.empty(256, np.int64)
    for i in range(reports.shape[0]):
        for w in range(c + 1):
            if np.int64(reports[i, w]) >= modulus:
                return i
        bucket = np.int64(reports[i, c + 1])
        if bucket > mask:
            return i
        if extend:
            a = np.int64(reports[i, size])
            step = np.int64(0)
            for x in range(256):
                table[x] = step
                step += a
                if step >= modulus:
                    step -= modulus
        for j in range(parents.shape[0]):
            h = np.int64(reports[i, c])
            for b in range(size):
                h = (h + np.int64(reports[i, b]) * np.int64(parents[j, b])) % modulus
            if not extend:
                v[j] += (h & mask) == bucket
                continue
            base = j * 256
            for x in range(256):
                t = h + table[x]
                if t >= modulus:
                    t -= modulus
                v[base + x] += (t & mask) == bucket
    return -1


# --- encoding estimates ------------------------------------------------------------------

_EXPONENT = np.uint64(0x7FF0000000000000)
_NAN = np.uint64(0x7FF8000000000000)  # the NaN float("nan") is


@_kernel
def encode_categories(numbers, tags, prefixes, lengths, out):
    """Serialize repeated CategoryEstimate records into out (big enough: k records of at most
    prefixes.shape[2] + 9 * numbers.shape[1] bytes); returns the bytes written.

    numbers[j] are category j's doubles (fields with tags[i], wire type 1). A number that is
    not finite is written as the one NaN float("nan") is; one that is 0.0 (all bits zero) is
    left out, as proto3 does. The record starts with prefixes[c, j, :lengths[c, j]] (its own
    tag, its length and the label field), c being how many of its numbers are written."""
    bits = numbers.view(np.uint64)
    at = 0
    for j in range(numbers.shape[0]):
        written = 0
        for i in range(numbers.shape[1]):
            written += bits[j, i] != 0
        size = lengths[written, j]
        for b in range(size):
            out[at + b] = prefixes[written, j, b]
        at += size
        for i in range(numbers.shape[1]):
            word = bits[j, i]
            if word == 0:
                continue
            if word & _EXPONENT == _EXPONENT:
                word = _NAN
            out[at] = tags[i]
            for b in range(8):
                out[at + 1 + b] = np.uint8((word >> np.uint64(8 * b)) & _BYTE)
            at += 9
    return at


# --- a simulation keystream --------------------------------------------------------------

_ROTATE = np.uint64(24)
_ROTATE_BACK = np.uint64(64 - 24)
_RIGHT_SHIFT = np.uint64(11)
_LEFT_SHIFT = np.uint64(3)
_ONE = np.uint64(1)


@_kernel
def _sfc64_next(a, b, c, counter):
    """One step of SFC64: (output, a, b, c, counter) after it."""
    output = a + b + counter
    rotated = (c << _ROTATE) | (c >> _ROTATE_BACK)
    return output, b ^ (b >> _RIGHT_SHIFT), c + (c << _LEFT_SHIFT), rotated + output, counter + _ONE


@_kernel
def sfc64_fill(state, out):
    """Write the next out.size words of an SFC64 stream into out (uint32), each 64-bit output
    split into two words, low half first. state (uint64, 6) is a, b, c, counter, then a pending
    high half and whether there is one (1 or 0): left by a fill of odd length, it is the next
    fill's first word, so the words do not depend on how the stream is split into fills.

    SFC64 is Chris Doty-Humphrey's Small Fast Chaotic generator, 64-bit variant, from his
    PractRand suite; numpy.random.SFC64 implements the same steps. 256 bits of state, of which
    a 64-bit counter that makes every cycle at least 2**64 outputs long. Not cryptographically
    secure (its state follows from a few outputs): for simulation only."""
    a, b, c, counter = state[0], state[1], state[2], state[3]
    size = out.size
    i = 0
    if state[5] != 0 and size > 0:
        out[0] = np.uint32(state[4])
        state[5] = 0
        i = 1
    while i + 1 < size:
        output, a, b, c, counter = _sfc64_next(a, b, c, counter)
        out[np.uint64(i)] = np.uint32(output & _LOW)
        out[np.uint64(i + 1)] = np.uint32(output >> _SHIFT)
        i += 2
    if i < size:
        output, a, b, c, counter = _sfc64_next(a, b, c, counter)
        out[np.uint64(i)] = np.uint32(output & _LOW)
        state[4] = output >> _SHIFT
        state[5] = 1
    state[0], state[1], state[2], state[3] = a, b, c, counter


@_kernel
def _score_roots(center, w, a, b):
    """veil.aggregator.estimate's roots of (center - pi)^2 = w s2(pi), with whether they exist."""
    qa = 1.0 + w
    qb = -(2.0 * center + w * (a - b))
    qc = center * center - w * b
    disc = qb * qb - 4.0 * qa * qc
    root = np.sqrt(max(disc, 0.0))
    q = -0.5 * (qb + np.copysign(root, qb))
    first = q / qa
    second = qc / q if q != 0.0 else first
    return min(first, second), max(first, second), disc >= 0.0


@_kernel
def score_intervals(mean, delta, scale, a, b, z, stderr, lower, upper):
    """For each row i and category j of mean (rows, k): the standard error sqrt(scale_i s2(pi~))
    at pi~ = mean clipped to [0, 1], and the continuity-corrected score interval of half-step
    delta_i, into stderr, lower, upper: the rules and the order of operations of
    veil.aggregator.estimate._score_interval, one pass per element instead of some forty numpy
    passes over the whole matrix (a series of 720 buckets at k = 1024 is 737,280 of them)."""
    rows, k = mean.shape
    for i in range(rows):
        w = z * z * scale[i]
        d = delta[i]
        for j in range(k):
            m = mean[i, j]
            clipped = min(max(m, 0.0), 1.0)
            s = np.sqrt(max(scale[i] * (b + (a - b) * clipped - clipped * clipped), 0.0))
            stderr[i, j] = s
            center_low, center_high = m - d, m + d
            low, high = np.inf, -np.inf
            r1, r2, ok = _score_roots(center_low, w, a, b)
            start, end = max(r1, 0.0), min(min(r2, center_low), 1.0)
            if ok and start <= end:
                low, high = min(low, start), max(high, end)
            start, end = max(center_low, 0.0), min(center_high, 1.0)
            if start <= end:
                low, high = min(low, start), max(high, end)
            r1, r2, ok = _score_roots(center_high, w, a, b)
            start, end = max(max(r1, center_high), 0.0), min(r2, 1.0)
            if ok and start <= end:
                low, high = min(low, start), max(high, end)
            if low > high:  # no share qualifies: the data contradict the design
                low, high = center_low - z * s, center_high + z * s
            lower[i, j] = low
            upper[i, j] = high


@_kernel
def simplex_projections(x, out):
    """Each row of x (rows, k) projected onto the probability simplex, into out: max(x - theta,
    0) with theta the one at which the result sums to 1, found without sorting (Michelot 1986).
    theta is the mean excess (sum - 1) / count of the entries above it, and the mean excess of
    any set of entries is at most theta (the sum of the largest r entries, less 1, over r, is
    largest at the support): so the mean excess of a set holding the support lies at or below
    theta, and every entry at or below it is outside the support, for good. Start with the whole
    row, drop those, take the mean excess of the rest, and repeat until none drops: then it is
    theta. Each pass keeps its entries without a branch (write, then advance by the comparison):
    about half of an estimate's entries fall either side, which a branch would mispredict.
    A few passes over a shrinking set for estimates; at worst one entry dropped per pass."""
    rows, k = x.shape
    kept = np.empty(k)
    for i in range(rows):
        for j in range(k):
            kept[j] = x[i, j]
        count = k
        while True:
            total = 0.0
            for p in range(count):
                total += kept[p]
            theta = (total - 1.0) / count
            left = 0
            for p in range(count):
                y = kept[p]
                kept[left] = y
                left += y > theta
            if left == count:
                break
            count = left
        for j in range(k):
            out[i, j] = max(x[i, j] - theta, 0.0)
