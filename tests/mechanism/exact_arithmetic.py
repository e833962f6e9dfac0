"""Exact references for the numerics tests, in Fractions: e^x bounded by rationals from its
series, the minimax q, the realized parity of integer thresholds, and each design's estimator
and risk. Written from the definitions (docs/math.md), not from veil.mechanism's formulas. The
RAPPOR references round intermediate values to 256 significant bits (see rounded)."""

from __future__ import annotations

import math
from fractions import Fraction

ONE64 = 1 << 64


def exp_bounds(x: Fraction) -> tuple[Fraction, Fraction]:
    """Rationals low <= e^x <= high (x >= 0) within 2^-100 of each other, relative.

    The partial sums of sum x^n / n! are lower bounds; once n + 1 >= 2x the tail after term n-1
    is at most x^n/n! (1 + 1/2 + 1/4 + ...) = 2 x^n / n!."""
    if x < 0:
        raise ValueError("exp_bounds takes x >= 0.")
    total, term, n = Fraction(0), Fraction(1), 0
    while True:
        total += term
        n += 1
        term = term * x / n
        if n + 1 >= 2 * x and term * 2**101 <= total:
            return total, total + 2 * term


def objective(k: int, gamma: Fraction, x: int) -> Fraction:
    """f(x) = k^2 (x g^2 + k - x) / (x g + k - x)^2, exactly."""
    return Fraction(k * k) * (x * gamma * gamma + k - x) / (x * gamma + k - x) ** 2


def minimax_q(k: int, gamma: float) -> int:
    """Eq. 4.4 exactly: floor(k/(1+g)) when it is at least 1 and f is no smaller there than at
    ceil(k/(1+g)); otherwise the ceiling."""
    g = Fraction(gamma)
    ratio = k / (1 + g)
    low, high = math.floor(ratio), math.ceil(ratio)
    if low >= 1 and objective(k, g, low) >= objective(k, g, high):
        return low
    return high


def subset_parity(k: int, q: int, keep_threshold: int) -> Fraction:
    """The largest likelihood ratio of a q-subset design keeping the truth with probability
    T / 2^64: a report holding j against one without it, P(keep)/C(k-1,q-1) over
    P(not keep)/C(k-1,q)."""
    keep = Fraction(keep_threshold, ONE64)
    return (keep / math.comb(k - 1, q - 1)) / ((1 - keep) / math.comb(k - 1, q))


def rappor_parity(flip_threshold: int) -> Fraction:
    """((1-f)/f)^2 with f = T / 2^64: two true values differ in two bits."""
    f = Fraction(flip_threshold, ONE64)
    return ((1 - f) / f) ** 2


# --- estimators and risk ----------------------------------------------------------------------


def subset_design(k: int, q: int, gamma: Fraction) -> tuple[Fraction, Fraction]:
    """(P(Z_j = 1 | X = j), P(Z_j = 1 | X = i != j)) of the ideal q-subset design."""
    keep = q * gamma / (q * gamma + k - q)
    return keep, (keep * (q - 1) + (1 - keep) * q) / (k - 1)


def subset_estimator(k: int, q: int, gamma: Fraction) -> tuple[Fraction, Fraction]:
    """(c, d) of pi_j = c V_j / n + d: the inverse of E[V_j / n] = pi_j a + (1 - pi_j) b."""
    a, b = subset_design(k, q, gamma)
    return 1 / (a - b), -b / (a - b)


def rounded(x: Fraction, bits: int = 256) -> Fraction:
    """x to 256 significant bits (relative error 2^-256, some 1e-77): the RAPPOR references
    round their intermediate values so that k = 1024 takes a second, not hours."""
    if x == 0:
        return x
    shift = bits - (abs(x.numerator).bit_length() - x.denominator.bit_length())
    return Fraction(round(x * Fraction(2) ** shift)) / Fraction(2) ** shift


def sqrt_approx(x: Fraction, bits: int = 256) -> Fraction:
    """sqrt(x) to within 2^-bits: the reference RAPPOR designs use s = this, gamma = s^2."""
    return Fraction(math.isqrt(math.floor(x * 4**bits)), 2**bits)


def _binomials(m: int, f: Fraction) -> list[Fraction]:
    """C(m, t) f^t (1-f)^(m-t) for t = 0..m, by the ratio of successive terms, rounded."""
    out = [rounded((1 - f) ** m)]
    ratio = f / (1 - f)
    for t in range(m):
        out.append(rounded(out[-1] * ratio * (m - t) / (t + 1)))
    return out


def rappor_law(
    k: int, s: Fraction, admissible: bool
) -> tuple[list[int], list[Fraction], list[Fraction], list[Fraction]]:
    """(weights, P(T=t), P(T=t, Z_j=1 | X=j), P(T=t, Z_j=1 | X=i!=j)) of RAPPOR flipping every
    bit with f = 1/(s+1); admissible RAPPOR drops t = 0 and t = k and renormalizes."""
    f = 1 / (s + 1)
    b1, b2 = _binomials(k - 1, f), _binomials(k - 2, f)

    def binom(b: list[Fraction], t: int) -> Fraction:
        return b[t] if 0 <= t < len(b) else Fraction(0)

    weights = list(range(k + 1))
    one_true = [(1 - f) * binom(b1, t - 1) for t in weights]
    p = [one_true[t] + f * binom(b1, t) for t in weights]
    one_other = [f * ((1 - f) * binom(b2, t - 2) + f * binom(b2, t - 1)) for t in weights]
    if admissible:
        kept = 1 - p[0] - p[k]
        cut = slice(1, k)
        p, one_true, one_other = ([x / kept for x in xs[cut]] for xs in (p, one_true, one_other))
        weights = weights[cut]
    return weights, [rounded(x) for x in p], [rounded(x) for x in one_true], [rounded(x) for x in one_other]


def rappor_minimax(
    k: int, gamma: Fraction, weights: list[int], p: list[Fraction]
) -> tuple[list[Fraction], list[Fraction]]:
    """(alpha_t, beta_t) of docs/math.md's minimax estimator (003 eq. 7.11), from the definitions:
    w(t) = k / (t g + k - t), a_t = (f(t) - k) / (k - 1), a* = sum_t p_t a_t."""
    a = [Fraction(0) if t in (0, k) else rounded((objective(k, gamma, t) - k) / (k - 1)) for t in weights]
    a_star = sum(pt * at for pt, at in zip(p, a))
    w = [Fraction(k) / (t * gamma + k - t) for t in weights]
    return ([rounded((gamma - 1) * wt / a_star) for wt in w], [rounded((wt - 1) / a_star + Fraction(1, k)) for wt in w])


def moments(alpha, beta, p, one_true, one_other) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    """(E[Y|X=j], E[Y|X!=j], E[Y^2|X=j], E[Y^2|X!=j]) of Y = alpha_T Z_j + beta_T, exactly."""
    mt = mo = st = so = Fraction(0)
    for a, b, pt, ot, oo in zip(alpha, beta, p, one_true, one_other):
        mt += a * ot + b * pt
        mo += a * oo + b * pt
        st += (a + b) ** 2 * ot + b * b * (pt - ot)
        so += (a + b) ** 2 * oo + b * b * (pt - oo)
    return mt, mo, st, so


def risk_uniform(k: int, second_true: Fraction, second_other: Fraction) -> Fraction:
    """n * sum_j Var(pi_hat_j) at pi_j = 1/k: k (A/k + (1 - 1/k) B - 1/k^2)."""
    pi = Fraction(1, k)
    return k * (pi * second_true + (1 - pi) * second_other - pi * pi)
