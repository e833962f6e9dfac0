"""Inverse-frequency post-randomization (IFPR) of one block, and the variance it adds (001 sec. 3.3, 6).

A block holds m >= 2 non-empty cells with original frequencies T_1..T_m. A record of cell j
leaves it with probability theta / T_j and then lands in one of the other m - 1 cells of the
block, chosen uniformly. So the block's transition matrix (column j = the law of a record of
cell j; columns sum to 1) is

    p_jj = 1 - theta / T_j,    p_ij = theta / ((m - 1) T_j)  (i != j),

and P T = T: each cell expects to lose theta records and to gain (m - 1) * theta / (m - 1) =
theta. The released counts S are therefore unbiased, E[S | T] = T, and

    V(S | T) = D_T - sum_j T_j P_j P_j'            (3.6), i.e. eqs. 6.1-6.2 entrywise;
    trace    = 2 m theta - theta^2 m/(m-1) sum 1/T_j                                (6.3);
    V(S_A | T) for the total of a subset A of b cells                             (6.5):
             = 2 theta b (m-b)/(m-1) - theta^2/(m-1)^2 [b^2 sum_{A^c} 1/T + (m-b)^2 sum_A 1/T].

Sampling is exact given the matrix: a record moves when a uniform double u in [0, 1) (numpy's
53-bit ``random``) is below theta / T_j, which happens with probability ceil(2^53 theta/T_j) / 2^53,
within 2^-53 of the float64 matrix entry itself; its destination is a uniform integer among the
m - 1 other cells (numpy's ``integers``, exact by rejection).
"""

from __future__ import annotations

import numpy as np

from ._errors import ReleaseError
from ._random import RngLike, make_rng

__all__ = [
    "ifpr_matrix",
    "ifpr_sample",
    "ifpr_covariance",
    "ifpr_total_variance",
    "ifpr_subset_variance",
    "ifpr",
]


def _check(counts: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    t = np.asarray(counts)
    if t.ndim != 1 or t.size < 2:
        raise ReleaseError("an IFPR block needs at least two cells.")
    if not np.all(t >= 1):
        raise ReleaseError("every cell of an IFPR block must be non-empty (frequency at least 1).")
    theta = float(theta)
    if not 0.0 <= theta <= 1.0:
        raise ReleaseError(f"theta must be between 0 and 1, not {theta!r}.")
    return t.astype(np.float64), theta


def ifpr_matrix(counts: np.ndarray, theta: float) -> np.ndarray:
    """The block's m x m transition matrix P, P[i, j] = P(released in cell i | original cell j).

    P @ counts equals counts up to float rounding: entry i sums m non-negative terms whose exact
    total is T_i, so the error is at most about (m + 3) * 2^-53 * T_i (each term carries a few
    roundings and the sum m - 1 more). With exact arithmetic (fractions) it is exactly T.
    """
    t, theta = _check(counts, theta)
    m = t.size
    p = np.broadcast_to(theta / ((m - 1) * t), (m, m)).copy()
    p[np.diag_indices(m)] = 1.0 - theta / t
    return p


def ifpr_sample(positions: np.ndarray, counts: np.ndarray, theta: float, rng: RngLike = None) -> np.ndarray:
    """Post-randomize records of one block: ``positions`` holds each record's cell (0..m-1),
    ``counts`` the block's original frequencies (which must be the positions' own counts).
    Returns each record's released cell."""
    t, theta = _check(counts, theta)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= t.size):
        raise ReleaseError("a record's cell lies outside the block.")
    if not np.array_equal(np.bincount(pos, minlength=t.size), t):
        raise ReleaseError("the counts must be the frequencies of the records' cells in the block.")
    gen = make_rng(rng)
    out = pos.copy()
    moves = gen.random(pos.size) < theta / t[pos]
    drawn = gen.integers(0, t.size - 1, size=int(moves.sum()))
    here = pos[moves]
    out[moves] = drawn + (drawn >= here)  # skip the record's own cell
    return out


def ifpr(values: np.ndarray, theta: float, rng: RngLike = None) -> np.ndarray:
    """IFPR of a whole array of category values, all its distinct values forming one block."""
    vals = np.asarray(values)
    cats, pos = np.unique(vals, return_inverse=True)
    if cats.size < 2:
        raise ReleaseError("IFPR needs at least two distinct values.")
    return cats[ifpr_sample(pos, np.bincount(pos), theta, rng)]


def ifpr_covariance(counts: np.ndarray, theta: float) -> np.ndarray:
    """V(S | T) of the block's released counts (001 eqs. 6.1, 6.2)."""
    t, theta = _check(counts, theta)
    m = t.size
    inv = 1.0 / t
    total = inv.sum()
    rest = total - inv[:, None] - inv[None, :]  # sum over l != i, j of 1/T_l
    v = -theta / (m - 1) * (2.0 + theta * (rest / (m - 1) - inv[:, None] - inv[None, :]))
    v[np.diag_indices(m)] = theta * (2.0 - theta * inv) - theta**2 / (m - 1) ** 2 * (total - inv)
    return v


def ifpr_total_variance(counts: np.ndarray, theta: float) -> float:
    """The trace of V(S | T) (001 eq. 6.3)."""
    t, theta = _check(counts, theta)
    m = t.size
    return float(2 * m * theta - theta**2 * m / (m - 1) * np.sum(1.0 / t))


def ifpr_subset_variance(counts: np.ndarray, theta: float, subset: np.ndarray) -> float:
    """V(S_A | T) of the released total of the cells in ``subset`` (a boolean mask) (001 eq. 6.5)."""
    t, theta = _check(counts, theta)
    a = np.asarray(subset, dtype=bool)
    if a.shape != t.shape:
        raise ReleaseError("the subset mask must have one entry per cell of the block.")
    m, b = t.size, int(a.sum())
    inv = 1.0 / t
    return float(
        2 * theta * b * (m - b) / (m - 1)
        - theta**2 / (m - 1) ** 2 * (b * b * inv[~a].sum() + (m - b) ** 2 * inv[a].sum())
    )
