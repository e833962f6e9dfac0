"""The privacy calculus (docs/math.md, 2; 003 ch. 3-4, 000 sec. 3).

A transition matrix P has p_ij = P(Z = d_i | X = c_j): one row per report, one column per
true category. Its parity is the largest ratio within a row; P gives epsilon-LDP exactly when
its parity is at most gamma = e^epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from ._errors import MechanismError
from ._specs import MechanismSpec, Report

__all__ = [
    "posterior_bounds",
    "rho_gamma",
    "row_parity",
    "parity",
    "is_admissible",
    "transition_matrix",
]

_LARGEST_MATRIX = 1 << 16  # rows; beyond this enumerate nothing, use the spec's own calculus


def _check_probability(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise MechanismError(f"{name} must be strictly between 0 and 1, not {value!r}.")


def posterior_bounds(gamma: float, prior: float) -> tuple[float, float]:
    """The range of an adversary's posterior belief in any property of a person whose prior
    was ``prior``, after seeing one report of a design with parity gamma:
    a / (1 + (gamma-1)(1-a)) <= posterior <= gamma a / (1 + (gamma-1) a)."""
    _check_probability("A prior", prior)
    if gamma < 1:
        raise MechanismError(f"gamma must be at least 1, not {gamma!r}.")
    low = prior / (1 + (gamma - 1) * (1 - prior))
    high = gamma * prior / (1 + (gamma - 1) * prior)
    return low, high


def rho_gamma(rho1: float, rho2: float) -> float:
    """The largest parity that keeps rho1-to-rho2 privacy: no prior at most rho1 can become a
    posterior above rho2. A design qualifies when parity <= rho2 (1-rho1) / (rho1 (1-rho2))."""
    _check_probability("rho1", rho1)
    _check_probability("rho2", rho2)
    if rho2 <= rho1:
        raise MechanismError("rho2 must be larger than rho1.")
    return rho2 * (1 - rho1) / (rho1 * (1 - rho2))


def row_parity(row: Sequence[float]) -> float:
    """max_j p_ij / min_j p_ij (exact for a row of Fractions); infinite when the row has a zero
    beside a non-zero entry."""
    high, low = max(row), min(row)
    if high == 0:
        return 1.0
    return math.inf if low == 0 else high / low


def parity(matrix: Sequence[Sequence[float]]) -> float:
    return max(row_parity(row) for row in matrix)


def is_admissible(matrix: Sequence[Sequence[float]], gamma: float, rel_tol: float = 1e-9) -> bool:
    """Every row has parity gamma and exactly two distinct values (003 Thm 5.x, 000 Thm 4.1)."""
    for row in matrix:
        if not math.isclose(row_parity(row), gamma, rel_tol=rel_tol):
            return False
        high, low = max(row), min(row)
        if any(not (math.isclose(x, high, rel_tol=rel_tol) or math.isclose(x, low, rel_tol=rel_tol)) for x in row):
            return False
    return True


def transition_matrix(spec: MechanismSpec) -> tuple[list[Report], list[list[Fraction]]]:
    """The exact transition matrix of a spec as randomized (its integer thresholds), for small
    output spaces: (the reports, one row of k probabilities per report), as Fractions. So its
    parity is exact too: at most gamma, never above e^epsilon, and finite."""
    if spec.outputs > _LARGEST_MATRIX:
        raise MechanismError(
            f"The {spec.name} design with k = {spec.k} has {spec.outputs} outputs, too many to enumerate."
        )
    reports = list(spec.output_space())
    return reports, [[spec.probability(r, j) for j in range(spec.k)] for r in reports]
