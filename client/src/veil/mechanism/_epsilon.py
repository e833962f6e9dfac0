"""The privacy level: the epsilons Veil accepts, and gamma = e^epsilon rounded down.

Every threshold and estimator derives from one float gamma per spec, and that float is never
above the true e^epsilon: math.exp rounds to nearest, up about half the time, and a threshold
built from a gamma rounded up could realize a parity above e^epsilon by a rounding error.

The accepted range, [1e-4, 20], is where every number derived from gamma holds (measured
against exact rational arithmetic, tests/mechanism/test_numerics.py):

- Above 20 the report is the truth but with probability about (k-1) e^-epsilon (2e-9 at k = 2):
  no privacy is left to tune, and the integer thresholds (out of 2^64) stop resolving it: the
  realized parity of k-RR at k = 2 is 2e-11 below gamma at epsilon = 20, 2e-4 at 30, and past
  about 44 the chance of a lie is below one step of a threshold.
- Below 1e-4 nothing can be learned: n * Var of Warner's estimate is about 1/epsilon^2, so even
  eight billion reports leave a standard error above 0.1 on a yes/no share; and gamma itself,
  a float within 2^-52 of 1, fixes epsilon to a relative 2e-12 at 1e-4 but only 2e-7 at 1e-9.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from ._errors import MechanismError

__all__ = ["EPSILON_RANGE", "check_epsilon", "epsilon_to_gamma", "gamma_to_epsilon"]

EPSILON_RANGE = (1e-4, 20.0)  # the smallest and largest epsilon a spec accepts (see above)

_SERIES_BITS = 128  # fixed-point bits of the series: a bound within some 2^-120 of e^x


def check_epsilon(epsilon: object) -> float:
    """epsilon as a float when it is a number within EPSILON_RANGE; MechanismError otherwise."""
    low, high = EPSILON_RANGE
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not low <= epsilon <= high:
        raise MechanismError(f"epsilon must be a number from {low:g} to {high:g}, not {epsilon!r}.")
    return float(epsilon)


@functools.lru_cache(maxsize=1024)
def epsilon_to_gamma(epsilon: float) -> float:
    """The largest float at most e^epsilon (but where e^epsilon is within 2^-120 of a float,
    which may then be passed over for the one below): the gamma of every spec."""
    epsilon = check_epsilon(epsilon)
    low = _exp_lower_bound(epsilon)
    gamma = math.exp(epsilon)  # within an ulp or so: a step or two at most below
    while Fraction(gamma) > low:
        gamma = math.nextafter(gamma, 0.0)
    while Fraction(up := math.nextafter(gamma, math.inf)) <= low:
        gamma = up
    return gamma


def gamma_to_epsilon(gamma: float) -> float:
    if not (math.isfinite(gamma) and gamma > 1):
        raise MechanismError(f"gamma must be a finite number above 1, not {gamma!r}.")
    return math.log(gamma)


def _exp_lower_bound(x: float) -> Fraction:
    """A rational at most e^x (x >= 0): the series sum x^n / n! in fixed point, every term
    rounded down and the tail dropped, so each step can only lower it."""
    a, b = x.as_integer_ratio()
    one = 1 << _SERIES_BITS
    term = total = one
    n = 0
    while term:
        n += 1
        term = term * a // (b * n)
        total += term
    return Fraction(total, one)
