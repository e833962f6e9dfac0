"""The identification-risk calculus of inverse-frequency PRAM (001 sec. 4; 000 sec. 5).

An intruder knows the key-variable cell c_j of a target B and that B is in the data, and picks
one of the S_j released records in c_j at random (none if S_j = 0). R_j(a, t) is the
probability that this match is correct given S_j = a and the original frequencies t. Under
IFPR with parameter theta in a block of at least two non-empty cells,

    R_j(1, t) <= psi(t_j, theta) = (t_j - theta) / (t_j (t_j - theta) + theta^2)    (4.12)

whatever the rest of t. psi(., theta) is largest at t_j = 1 when theta <= 2/3 and at t_j = 2
above, which gives h(theta) = max_t psi(t, theta); R_j(a, t) <= 1/3 for every a >= 3; and
R_j(2, t) <= R_j(1, t) once the block has at least ceil(1/(1 - theta)) cells (4.15). Hence:

- Goal 1 (R_j(1, t) <= xi for the singletons): theta = theta_*(xi), the root of psi(1, .) = xi,
  blocks covering every singleton cell.
- Goal 2 (R_j(1, t) <= xi for every j): theta = theta_0(xi), the root of h = xi (xi > 1/3),
  blocks covering every singleton and doubleton cell.
- Goal 3 (R_j(a, t) <= xi for every j and a): as Goal 2, and every block of at least
  m_0 = ceil(1/(1 - theta)) cells.
"""

from __future__ import annotations

import math

import numpy as np

from ._errors import ReleaseError

__all__ = [
    "GOALS",
    "psi",
    "h",
    "theta_star",
    "theta_zero",
    "min_block_size",
    "goal_theta",
    "goal_xi",
    "goal_min_block_cells",
    "block_match_risks",
    "no_match_probability",
    "no_match_bounds",
]

GOALS = (1, 2, 3)

# 1/(1 - theta) is an integer for the table's thetas (.8 -> 5, .9 -> 10, 2/3 -> 3), but float
# rounding makes it 5.000000000000001: ceil would then ask for one cell more than the paper.
# Within this relative distance of an integer, the integer is taken.
_CEIL_SLACK = 1e-9


def _check_theta(theta: float) -> float:
    theta = float(theta)
    if not 0.0 < theta < 1.0:
        raise ReleaseError(f"theta must be strictly between 0 and 1, not {theta!r}.")
    return theta


def psi(t: float, theta: float) -> float:
    """The bound (4.12) on R_j(1, t) for a cell of original frequency t >= 1."""
    if t < 1:
        raise ReleaseError(f"a cell's frequency must be at least 1, not {t!r}.")
    if not 0.0 <= theta <= 1.0:
        raise ReleaseError(f"theta must be between 0 and 1, not {theta!r}.")
    return (t - theta) / (t * (t - theta) + theta * theta)


def h(theta: float) -> float:
    """max over t of psi(t, theta): psi(1, theta) for theta <= 2/3, psi(2, theta) above."""
    return psi(1, theta) if theta <= 2.0 / 3.0 else psi(2, theta)


def theta_star(xi: float) -> float:
    """Goal 1's theta: the root in (0, 1) of psi(1, theta) = xi, for 0 < xi < 1.

    xi theta^2 + (1 - xi) theta - (1 - xi) = 0, whose positive root, written without
    cancellation, is 2 sqrt(1 - xi) / (sqrt(1 - xi) + sqrt(1 + 3 xi)).
    """
    xi = float(xi)
    if not 0.0 < xi < 1.0:
        raise ReleaseError(f"xi must be strictly between 0 and 1 for Goal 1, not {xi!r}.")
    a, b = math.sqrt(1.0 - xi), math.sqrt(1.0 + 3.0 * xi)
    return 2.0 * a / (a + b)


def theta_zero(xi: float) -> float:
    """Goals 2 and 3's theta: the root in (0, 1) of h(theta) = xi, for 1/3 < xi < 1.

    h(2/3) = 3/7. For xi >= 3/7 the root is theta_*(xi) (the psi(1, .) branch); below, it is the
    root in (2/3, 1) of psi(2, theta) = xi, i.e. of xi theta^2 + (1 - 2 xi) theta + 4 xi - 2 = 0:
    ((2 xi - 1) + sqrt((1 + 6 xi)(1 - 2 xi))) / (2 xi).
    """
    xi = float(xi)
    if not 1.0 / 3.0 < xi < 1.0:
        raise ReleaseError(f"xi must be strictly between 1/3 and 1 for Goals 2 and 3, not {xi!r}.")
    if xi >= 3.0 / 7.0:
        return theta_star(xi)
    return ((2.0 * xi - 1.0) + math.sqrt((1.0 + 6.0 * xi) * (1.0 - 2.0 * xi))) / (2.0 * xi)


def min_block_size(theta: float) -> int:
    """m_0 = ceil(1/(1 - theta)): the fewest cells a block needs for R_j(2, t) <= R_j(1, t).

    A value within a relative 1e-9 of an integer counts as that integer, so theta = .8 gives
    5 (as in 001's Table 2), not the 6 that float rounding of 1/(1 - .8) would give.
    """
    theta = _check_theta(theta)
    x = 1.0 / (1.0 - theta)
    nearest = round(x)
    if abs(x - nearest) <= _CEIL_SLACK * x:
        return max(int(nearest), 2)
    return max(math.ceil(x), 2)


def goal_theta(goal: int, xi: float) -> float:
    """The theta that achieves a goal at level xi."""
    _check_goal(goal)
    return theta_star(xi) if goal == 1 else theta_zero(xi)


def goal_xi(goal: int, theta: float) -> float:
    """The level xi a goal achieves with a given theta (the inverse of goal_theta)."""
    _check_goal(goal)
    theta = _check_theta(theta)
    return psi(1, theta) if goal == 1 else h(theta)


def goal_min_block_cells(goal: int, theta: float) -> int:
    """The fewest cells in a block: m_0 for Goal 3, two (a block must offer somewhere to go) otherwise."""
    _check_goal(goal)
    return min_block_size(theta) if goal == 3 else 2


def _check_goal(goal: int) -> None:
    if goal not in GOALS:
        raise ReleaseError(f"goal must be 1, 2 or 3, not {goal!r}.")


def block_match_risks(counts: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact R_j(1, t) and R_j(2, t) for every cell j of one IFPR block (001 eqs. 4.3, 4.11).

    ``counts`` are the block's original frequencies t (all >= 1, at least two cells). With
    alpha_i = p_ji (the chance that a record of cell i is released in cell j) and
    beta_i = alpha_i / (1 - alpha_i), Sigma_a is the a-th elementary symmetric polynomial of the
    beta's, cell i counted t_i times except the target's own cell, counted t_j - 1 times; then
    R_j(1, t) = beta_j / (beta_j + Sigma_1) and R_j(2, t) = beta_j Sigma_1 / (2 (beta_j Sigma_1 + Sigma_2)).
    """
    t = np.asarray(counts, dtype=np.float64)
    theta = _check_theta(theta)
    m = t.size
    if m < 2 or np.any(t < 1):
        raise ReleaseError("an IFPR block needs at least two cells, each of frequency at least 1.")
    other = theta / ((m - 1) * t - theta)  # beta of cell i seen from any other cell's target
    own = (t - theta) / theta  # beta of the target's own cell
    s1_all, s2_all = np.sum(t * other), np.sum(t * other * other)
    sigma1 = s1_all - t * other + (t - 1) * own
    power2 = s2_all - t * other * other + (t - 1) * own * own
    sigma2 = (sigma1 * sigma1 - power2) / 2.0
    r1 = own / (own + sigma1)
    r2 = own * sigma1 / (2.0 * (own * sigma1 + sigma2))
    return r1, r2


def no_match_probability(counts: np.ndarray, theta: float) -> np.ndarray:
    """P(S_j = 0 | t) for every cell j of one IFPR block (001 eq. 4.9): the chance that no
    released record matches a target of cell j."""
    t = np.asarray(counts, dtype=np.float64)
    theta = _check_theta(theta)
    m = t.size
    if m < 2 or np.any(t < 1):
        raise ReleaseError("an IFPR block needs at least two cells, each of frequency at least 1.")
    stay_out = t * np.log1p(-theta / ((m - 1) * t))  # log P(no record of cell i moves to j)
    return np.exp(t * np.log(theta / t) + np.sum(stay_out) - stay_out)


def no_match_bounds(t1: int, theta: float, cells: int) -> tuple[float, float]:
    """001 eq. 4.10: (theta/t1)^t1 (1 - theta/(k1-1))^(k1-1) <= P(S_1 = 0 | t) <= (theta/t1)^t1 e^-theta."""
    theta = _check_theta(theta)
    if t1 < 1 or cells < 2:
        raise ReleaseError("the bounds need t1 >= 1 and a block of at least two cells.")
    base = (theta / t1) ** t1
    return base * (1.0 - theta / (cells - 1)) ** (cells - 1), base * math.exp(-theta)
