"""Warner masking of binary attributes, with variances, covariances and correlations (paper 002).

Each record's 0/1 value x is released as z = x XOR y, y a "slip" with P(y = 1) = p (Dalenius's
scheme 1; scheme 2, z = 1 - (x XOR y), is the same with p -> 1 - p). The slips come from a
response population of M slips, M p of them 1, dealt to the n records:

- ``replacement=False`` (Kim's recommendation, M = n): exactly round(n p) slips are 1, dealt at
  random without replacement; p is then that share exactly, so the estimators below are exact;
- ``replacement=True`` (Warner's setting, M -> infinity): independent Bernoulli(p) slips.

Two attributes may share each record's slip (Kim's approach 1, one response population for all
attributes: same p) or draw their own (approach 2: the default; any p's). Sharing, not equal p,
is what changes the covariance formula: attributes masked with equal p by separate slips
follow eq. 5, not eq. 6.

With c = 1 - 2p, N the size of the population the n records were sampled from without
replacement (None: infinite, i.e. with replacement) and M the number of slips (None: infinite),
the general variance and covariance computed here reduce to 002's equations:
eq. 3 (M = n), eq. 4 (N, M infinite), eq. 5 (separate slips, any M), eq. 6 (shared, M = n),
eq. 7 (shared, N, M infinite), eq. 8 (one attribute unmasked). N = n gives the variance of the
masking alone, given the table (what a data holder adds to the data it releases).

The attribute-level estimators target the original table's own statistics (shares, the
covariance pi_12 - pi_1 pi_2 and the correlation with 1/n moments), so a user of the masked table
gets, in expectation, what the original table would have given:

- pi_hat = (mean z - p) / c                                                            (002 eq. 1);
- pi_12 from E[z1 z2]: separate slips (p1 p2 + p1 c2 pi2 + p2 c1 pi1 + c1 c2 pi12), a shared slip
  (p (1 - pi1 - pi2) + pi12), one attribute clear (p1 pi2 + c1 pi12);
- the covariance: pi_12_hat - pi1_hat pi2_hat is exactly unbiased with separate slips or one
  attribute clear (the estimates are then uncorrelated given the table); with a shared slip it
  is corrected for the estimates' own covariance (derived in the function); a variance is the
  covariance of an attribute with itself;
- the correlation: the ratio of those (consistent, not exactly unbiased; with a shared slip
  and M = n the correction cancels and it equals the plain correlation of the estimates, Kim's
  "exact" case).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ReleaseError, TableError
from ._random import RngLike, make_rng
from ._table import Table, as_table, require_columns

__all__ = [
    "Masking",
    "warner_mask",
    "warner_proportion",
    "warner_variance",
    "warner_covariance",
    "warner_estimator_correlation",
    "masked_joint",
    "masked_covariance",
    "masked_variance",
    "masked_correlation",
    "masking_variance",
    "MaskRelease",
    "release_mask",
]


def _check_p(p: float) -> float:
    p = float(p)
    if not 0.0 < p < 1.0 or p == 0.5:
        raise ReleaseError(f"the slip probability p must be strictly between 0 and 1 and not 1/2, not {p!r}.")
    return p


@dataclass(frozen=True)
class Masking:
    """How one attribute was masked: p (exact share of 1-slips when replacement is False), the
    draw, and the slip group: attributes with the same non-None slip name share each record's slip."""

    p: float
    replacement: bool = False
    slip: str | None = None

    def __post_init__(self) -> None:
        _check_p(self.p)


def _bits(x: np.ndarray | Sequence[object], name: str = "attribute") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind in "US":
        bad = np.flatnonzero((arr != "0") & (arr != "1"))
        if bad.size:
            raise TableError(f"{name}, record {int(bad[0]) + 1}: value {str(arr[bad[0]])!r} is not 0 or 1.")
        return (arr == "1").astype(np.int64)
    arr = np.asarray(arr)
    bad = np.flatnonzero((arr != 0) & (arr != 1))
    if bad.size:
        raise TableError(f"{name}, record {int(bad[0]) + 1}: value {arr[bad[0]]!r} is not 0 or 1.")
    return arr.astype(np.int64)


def _slips(n: int, p: float, replacement: bool, gen: np.random.Generator) -> tuple[np.ndarray, float]:
    if replacement:
        return (gen.random(n) < p).astype(np.int64), p
    ones = int(round(n * p))
    if ones in (0, n) or 2 * ones == n:
        raise ReleaseError(
            f"with {n} records, p = {p!r} gives {ones} slips of 1: the share must be strictly "
            f"between 0 and 1 and not 1/2."
        )
    y = np.zeros(n, dtype=np.int64)
    y[:ones] = 1
    return gen.permutation(y), ones / n


def warner_mask(
    x: np.ndarray | Sequence[object], p: float, *, replacement: bool = False, rng: RngLike = None
) -> tuple[np.ndarray, Masking]:
    """Mask one 0/1 attribute: z = x XOR y. Returns z and the Masking (whose p is the exact
    share of 1-slips when drawn without replacement)."""
    bits = _bits(x)
    _check_p(p)
    y, used = _slips(bits.size, p, replacement, make_rng(rng))
    return bits ^ y, Masking(used, replacement)


def warner_proportion(z: np.ndarray | Sequence[object], p: float) -> float:
    """002 eq. 1: pi_hat = (mean z - p) / (1 - 2p)."""
    p = _check_p(p)
    return float((np.mean(_bits(z)) - p) / (1 - 2 * p))


def _fpc(size: int | None, n: int) -> tuple[float, float]:
    """(finite correction (size - n)/(size - 1), the factor 1/(size - 1) of a pair's covariance)."""
    if size is None:
        return 1.0, 0.0
    if size < n or size < 2:
        raise ReleaseError(f"a population or slip count of {size} is smaller than the {n} records.")
    return (size - n) / (size - 1), 1.0 / (size - 1)


def warner_variance(pi: float, p: float, n: int, *, population: int | None = None, slips: int | None = None) -> float:
    """V(pi_hat) for n records sampled from a population of N = ``population`` (None: with
    replacement) and masked with slips from a response population of M = ``slips`` (None:
    independent slips). M = n is 002 eq. 3; N = M = None eq. 4; N = n the masking alone.

    With u = 1 - 2y, d = x - 1/2, e = pi - 1/2: sum z = n/2 + sum u_i d_i, so
    V(sum z) = n (1/4 - c^2 e^2) + n (n-1) (c^2 cx + 4 cy (e^2 + cx)), cx = -pi(1-pi)/(N-1) and
    cy = -p(1-p)/(M-1) the covariances of two records' x's and y's; V(pi_hat) = V(sum z)/(n c)^2.
    """
    return warner_covariance(pi, pi, pi, p, p, n, shared=True, population=population, slips=slips)


def warner_covariance(
    pi1: float,
    pi2: float,
    pi12: float,
    p1: float | None,
    p2: float | None,
    n: int,
    *,
    shared: bool = False,
    population: int | None = None,
    slips: int | None = None,
) -> float:
    """Cov(pi1_hat, pi2_hat) of two masked attributes (p None: that attribute unmasked).

    Separate slips or one attribute unmasked: (pi12 - pi1 pi2)/n * (N - n)/(N - 1)  (002 eqs. 5, 8),
    whatever the slips. A shared slip (p1 = p2 = p): with E[d1 d2] = (1 - 2pi1 - 2pi2 + 4pi12)/4,
    e_k = pi_k - 1/2 and c12 = -(pi12 - pi1 pi2)/(N - 1),
    n^2 c^2 Cov = n (E[d1 d2] - c^2 e1 e2) + n (n-1) (c^2 c12 + 4 cy (e1 e2 + c12))  (eqs. 6, 7 at M = n, M = inf).
    """
    if n < 1:
        raise ReleaseError(f"n must be at least 1, not {n!r}.")
    for name, v in (("pi1", pi1), ("pi2", pi2), ("pi12", pi12)):
        if not 0.0 <= v <= 1.0:
            raise ReleaseError(f"{name} must be a probability, not {v!r}.")
    f_n, k_n = _fpc(population, n)
    if not shared or p1 is None or p2 is None:
        if shared:
            raise ReleaseError("a shared slip needs both attributes masked.")
        return (pi12 - pi1 * pi2) / n * f_n
    p = _check_p(p1)
    if abs(p - _check_p(p2)) > 1e-15:
        raise ReleaseError("attributes that share a slip share its p.")
    _, k_m = _fpc(slips, n)
    c2 = (1 - 2 * p) ** 2
    cy = -p * (1 - p) * k_m
    c12 = -(pi12 - pi1 * pi2) * k_n
    e1e2 = (pi1 - 0.5) * (pi2 - 0.5)
    d1d2 = (1 - 2 * pi1 - 2 * pi2 + 4 * pi12) / 4
    total = n * (d1d2 - c2 * e1e2) + n * (n - 1) * (c2 * c12 + 4 * cy * (e1e2 + c12))
    return total / (n * n * c2)


def warner_estimator_correlation(
    pi1: float, pi2: float, pi12: float, p: float, n: int, *, population: int | None = None, slips: int | None = None
) -> float:
    """Corr(pi1_hat, pi2_hat) for two attributes sharing a slip (002 Table 1: M = n gives
    "proposed", N = M = None "Warner's")."""
    cov = warner_covariance(pi1, pi2, pi12, p, p, n, shared=True, population=population, slips=slips)
    v1 = warner_variance(pi1, p, n, population=population, slips=slips)
    v2 = warner_variance(pi2, p, n, population=population, slips=slips)
    return cov / math.sqrt(v1 * v2)


def _estimate(z: np.ndarray, m: Masking | None) -> float:
    return float(np.mean(z)) if m is None else float((np.mean(z) - m.p) / (1 - 2 * m.p))


def _shared(m1: Masking | None, m2: Masking | None) -> bool:
    if m1 is None or m2 is None or m1.slip is None or m1.slip != m2.slip:
        return False
    if m1.p != m2.p or m1.replacement != m2.replacement:
        raise ReleaseError(f"attributes sharing slip {m1.slip!r} must share p and the draw.")
    return True


def masked_joint(z1: np.ndarray, z2: np.ndarray, m1: Masking | None, m2: Masking | None) -> float:
    """The unbiased estimate of pi_12 = P(x1 = 1, x2 = 1) from released columns (None: not masked)."""
    a, b = _bits(z1), _bits(z2)
    if a.size != b.size:
        raise ReleaseError("the two columns must have one value per record each.")
    if m1 is None and m2 is not None:
        return masked_joint(b, a, m2, m1)
    both = float(np.mean(a * b))
    if m1 is None:
        return both
    if m2 is None:
        return (both - m1.p * float(np.mean(b))) / (1 - 2 * m1.p)
    pi1, pi2 = _estimate(a, m1), _estimate(b, m2)
    if _shared(m1, m2):
        return both - m1.p * (1 - pi1 - pi2)
    c1, c2 = 1 - 2 * m1.p, 1 - 2 * m2.p
    return (both - m1.p * m2.p - m1.p * c2 * pi2 - m2.p * c1 * pi1) / (c1 * c2)


def masked_covariance(z1: np.ndarray, z2: np.ndarray, m1: Masking | None, m2: Masking | None) -> float:
    """The unbiased estimate of the original table's covariance pi_12 - pi_1 pi_2 (1/n moments).

    A = pi12_hat - pi1_hat pi2_hat has E[A] = s - C, C = Cov(pi1_hat, pi2_hat | table). C is zero
    unless the slip is shared; then (N = n in warner_covariance, w = 4p(1-p), c = 1 - 2p)
    C = beta s + gamma e, e = (pi1 - 1/2)(pi2 - 1/2), beta = w M / ((M-1) n c^2),
    gamma = w (M-n) / ((M-1) n c^2), and B = (pi1_hat - 1/2)(pi2_hat - 1/2) has E[B] = e + C.
    Solving the two expectations for s: s_hat = ((1 + gamma) A + gamma B) / (1 - beta + gamma).
    """
    a, b = _bits(z1), _bits(z2)
    pi1, pi2 = _estimate(a, m1), _estimate(b, m2)
    est = masked_joint(a, b, m1, m2) - pi1 * pi2
    if not _shared(m1, m2):
        return est
    assert m1 is not None
    n, p = a.size, m1.p
    w, c2 = 4 * p * (1 - p), (1 - 2 * p) ** 2
    if m1.replacement:
        beta = gamma = w / (n * c2)
    else:
        beta, gamma = w / ((n - 1) * c2), 0.0
    cross = (pi1 - 0.5) * (pi2 - 0.5)
    return ((1 + gamma) * est + gamma * cross) / (1 - beta + gamma)


def masked_variance(z: np.ndarray, m: Masking | None) -> float:
    """The unbiased estimate of the original table's variance pi (1 - pi) of one attribute."""
    if m is None:
        return masked_covariance(z, z, None, None)
    own = Masking(m.p, m.replacement, "\0self")  # an attribute shares its slip with itself
    return masked_covariance(z, z, own, own)


def masked_correlation(z1: np.ndarray, z2: np.ndarray, m1: Masking | None, m2: Masking | None) -> float:
    """The estimate of the original table's correlation of two attributes (nan if a variance
    estimate is not positive)."""
    v1, v2 = masked_variance(z1, m1), masked_variance(z2, m2)
    if v1 <= 0 or v2 <= 0:
        return float("nan")
    return masked_covariance(z1, z2, m1, m2) / math.sqrt(v1 * v2)


def masking_variance(pi: float, n: int, m: Masking) -> float:
    """V(pi_hat | the table): the variance the masking alone adds to the estimate of the table's share."""
    return warner_variance(pi, m.p, n, population=n, slips=None if m.replacement else n)


@dataclass(frozen=True, eq=False)
class MaskRelease:
    table: Table
    original: Table
    columns: tuple[str, ...]
    maskings: dict[str, Masking]

    def report(self) -> dict[str, Any]:  # a JSON document
        orig = {c: _bits(self.original[c], f"column {c!r}") for c in self.columns}
        rel = {c: _bits(self.table[c], f"column {c!r}") for c in self.columns}
        n = next(iter(orig.values())).size
        cols = {}
        for c in self.columns:
            m = self.maskings[c]
            est = _estimate(rel[c], m)
            slips = None if m.replacement else n
            cols[c] = {
                "p": m.p,
                "slips": "with replacement" if m.replacement else "without replacement (M = n)",
                "slip_group": m.slip,
                "original_share": float(orig[c].mean()),
                "released_share": float(rel[c].mean()),
                "estimate": est,
                "masking_se": math.sqrt(masking_variance(min(max(est, 0.0), 1.0), n, m)),
                "se_with_sampling": math.sqrt(warner_variance(min(max(est, 0.0), 1.0), m.p, n, slips=slips)),
                "records_changed": int(np.count_nonzero(orig[c] != rel[c])),
            }
        pairs = []
        for i, a in enumerate(self.columns):
            for b in self.columns[i + 1 :]:
                ma, mb = self.maskings[a], self.maskings[b]
                cov0 = float(np.mean(orig[a] * orig[b]) - orig[a].mean() * orig[b].mean())
                sd0 = math.sqrt(orig[a].var() * orig[b].var())
                pairs.append(
                    {
                        "columns": [a, b],
                        "shared_slip": _shared(ma, mb),
                        "original_covariance": cov0,
                        "estimated_covariance": masked_covariance(rel[a], rel[b], ma, mb),
                        "original_correlation": cov0 / sd0 if sd0 > 0 else None,
                        "estimated_correlation": masked_correlation(rel[a], rel[b], ma, mb),
                        "naive_correlation_of_released": float(np.corrcoef(rel[a], rel[b])[0, 1]),
                    }
                )
        return {
            "method": "Warner masking of binary attributes (paper 002)",
            "records": n,
            "columns": cols,
            "pairs": pairs,
            "seed": "not recorded: a seed replays the release, so keep it secret",
        }


def release_mask(
    table: Mapping[str, Sequence[object] | np.ndarray],
    columns: Sequence[str],
    p: float | Mapping[str, float],
    *,
    shared: bool = False,
    replacement: bool = False,
    rng: RngLike = None,
) -> MaskRelease:
    """Mask 0/1 columns of a table. p: one value for all or a value per column. shared: one slip
    per record for every column (002's approach 1; needs one p), else a slip per column."""
    tab = as_table(table)
    columns = tuple(dict.fromkeys(columns))
    if not columns:
        raise ReleaseError("name at least one column to mask.")
    require_columns(tab, columns)
    if isinstance(p, Mapping):
        for name in p:
            if name not in columns:
                raise ReleaseError(f"p is given for column {name!r}, which is not masked.")
        missing = [c for c in columns if c not in p]
        if missing:
            raise ReleaseError(f"no p for column {missing[0]!r}.")
        ps = {c: _check_p(p[c]) for c in columns}
    else:
        ps = {c: _check_p(p) for c in columns}
    if shared and len(set(ps.values())) > 1:
        raise ReleaseError("columns that share a slip need one p.")
    bits = {c: _bits(tab[c], f"column {c!r}") for c in columns}
    gen = make_rng(rng)
    n = next(iter(bits.values())).size
    out = {name: col.copy() for name, col in tab.items()}
    maskings = {}
    common = _slips(n, ps[columns[0]], replacement, gen) if shared else None
    for c in columns:
        y, used = common if common is not None else _slips(n, ps[c], replacement, gen)
        out[c] = (bits[c] ^ y).astype(str)
        maskings[c] = Masking(used, replacement, "shared" if shared else None)
    return MaskRelease(out, tab, columns, maskings)
