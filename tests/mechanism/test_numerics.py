"""Numerics that hold over the whole accepted epsilon range, checked against exact rational
arithmetic (exact_arithmetic): gamma is e^epsilon rounded down, no threshold realizes a parity
above e^epsilon, the minimax q is the exact one, transition matrices are exact, and every
design's estimator and risk are within 1e-9 (relative) of their exact values."""

from __future__ import annotations

import math
from fractions import Fraction

import exact_arithmetic as exact
import pytest

from veil.mechanism import (
    EPSILON_RANGE,
    MECHANISMS,
    MechanismError,
    check_epsilon,
    epsilon_to_gamma,
    minimax_q,
    parity,
    spec_for,
    transition_matrix,
)

LOWEST, HIGHEST = EPSILON_RANGE


def log_grid(per_decade: int) -> list[float]:
    """Epsilons from the smallest accepted to the largest, evenly in log, ends included."""
    steps = math.ceil(per_decade * math.log10(HIGHEST / LOWEST))
    return [LOWEST] + [LOWEST * (HIGHEST / LOWEST) ** (i / steps) for i in range(1, steps)] + [HIGHEST]


GRID = log_grid(10) + [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
REL = 1e-9


def relative_error(value: float, reference: Fraction) -> float:
    return float(abs(Fraction(value) - reference) / abs(reference))


def test_the_range_is_what_the_specs_accept():
    assert EPSILON_RANGE == (1e-4, 20.0)
    for name in MECHANISMS:
        k = 2 if name == "warner" else 5
        assert spec_for(name, k, LOWEST).epsilon == LOWEST and spec_for(name, k, HIGHEST).epsilon == HIGHEST
        for bad in (1e-9, math.nextafter(LOWEST, 0), math.nextafter(HIGHEST, 50), 50.0):
            with pytest.raises(MechanismError, match=r"^epsilon must be a number from 0\.0001 to 20, not .*\.$"):
                spec_for(name, k, bad)
    assert check_epsilon(1) == 1.0 and isinstance(check_epsilon(1), float)


def test_gamma_is_e_to_the_epsilon_rounded_down():
    rounded_up = 0
    for epsilon in GRID:
        low, high = exact.exp_bounds(Fraction(epsilon))
        gamma = epsilon_to_gamma(epsilon)
        assert Fraction(gamma) <= low, epsilon  # never above e^epsilon
        assert Fraction(math.nextafter(gamma, math.inf)) > high, epsilon  # and the largest such float
        rounded_up += Fraction(math.exp(epsilon)) > high
    # The grid holds epsilons where math.exp rounds up: a gamma taken from it would fail above.
    assert rounded_up >= len(GRID) // 4


def _realized_parity(spec) -> Fraction:
    if spec.name.startswith("rappor"):
        return exact.rappor_parity(spec.flip_threshold)
    return exact.subset_parity(spec.k, spec.q, spec.keep_threshold)


@pytest.mark.parametrize("name", MECHANISMS)
def test_the_realized_parity_never_exceeds_e_to_the_epsilon(name):
    # Exactly, from the integer thresholds, against a rational lower bound of e^epsilon.
    for epsilon in GRID:
        low, _ = exact.exp_bounds(Fraction(epsilon))
        for k in (2,) if name == "warner" else (2, 3, 5, 16, 100, 1024, 2048):
            spec = spec_for(name, k, epsilon)
            realized = _realized_parity(spec)
            assert realized <= low, (name, k, epsilon)
            assert spec.parity == float(realized) <= spec.gamma
            # And as close below gamma as thresholds out of 2^64 allow (k-RR at k = 2 and
            # epsilon = 20 is the farthest, 2e-11 below).
            assert realized >= Fraction(spec.gamma) * (1 - Fraction(1, 10**10)), (name, k, epsilon)


@pytest.mark.parametrize(
    "name, k", [("krr", 2), ("krr", 5), ("subset", 6), ("rappor", 4), ("rappor-admissible", 4), ("warner", 2)]
)
def test_transition_matrices_are_exact_at_the_largest_epsilon(name, k):
    spec = spec_for(name, k, HIGHEST)
    _, matrix = transition_matrix(spec)
    assert all(isinstance(p, Fraction) for row in matrix for p in row)
    assert all(sum(row[j] for row in matrix) == 1 for j in range(k))
    low, _ = exact.exp_bounds(Fraction(HIGHEST))
    assert parity(matrix) == _realized_parity(spec) <= low  # finite, and below e^20


def test_minimax_q_is_exact_for_every_k_up_to_2048():
    for epsilon in log_grid(3):
        gamma = spec_for("subset", 2, epsilon).gamma  # as the specs compute it
        for k in range(2, 2049):
            assert minimax_q(k, gamma) == exact.minimax_q(k, gamma), (k, epsilon)


@pytest.mark.slow
def test_minimax_q_is_exact_on_a_fine_grid():
    for epsilon in log_grid(20):
        gamma = spec_for("subset", 2, epsilon).gamma
        for k in range(2, 2049):
            assert minimax_q(k, gamma) == exact.minimax_q(k, gamma), (k, epsilon)


@pytest.mark.parametrize("name", ["subset", "krr", "warner"])
def test_subset_family_estimators_and_risks_are_exact(name):
    for epsilon in GRID:
        for k in (2,) if name == "warner" else (2, 3, 10, 100, 1024, 2048):
            spec = spec_for(name, k, epsilon)
            gamma = Fraction(spec.gamma)
            c, d = exact.subset_estimator(k, spec.q, gamma)
            est = spec.estimator
            assert relative_error(est.alpha[0], c) <= REL and relative_error(est.beta[0], d) <= REL, (k, epsilon)
            a, b = exact.subset_design(k, spec.q, gamma)
            _, _, second_true, second_other = exact.moments([c], [d], [Fraction(1)], [a], [b])
            risk = exact.risk_uniform(k, second_true, second_other)
            assert relative_error(spec.risk_uniform(), risk) <= REL, (k, epsilon)


def _check_rappor(name: str, k: int, epsilon: float) -> None:
    spec = spec_for(name, k, epsilon)
    s = exact.sqrt_approx(Fraction(spec.gamma))  # the reference design: gamma = s^2, 1e-77 from spec.gamma
    weights, p, one_true, one_other = exact.rappor_law(k, s, spec.admissible)
    alpha, beta = exact.rappor_minimax(k, s * s, weights, p)
    mean_true, mean_other, second_true, second_other = exact.moments(alpha, beta, p, one_true, one_other)
    assert abs(mean_true - 1) < 1e-60 and abs(mean_other) < 1e-60  # the reference is unbiased
    est = spec.estimator
    assert list(est.weights) == weights
    for t, a, b, a_code, b_code in zip(weights, alpha, beta, est.alpha, est.beta):
        scale = abs(a) + abs(b)  # beta_t crosses 0 as t grows
        assert abs(Fraction(a_code) - a) <= REL * abs(a), (name, k, epsilon, t)
        assert abs(Fraction(b_code) - b) <= REL * scale, (name, k, epsilon, t)
    assert relative_error(spec.risk_uniform(), exact.risk_uniform(k, second_true, second_other)) <= REL
    if not spec.admissible:
        # The empirical estimator: (s+1)/(s-1) and -1/(s-1) per bit.
        empirical = spec.estimators()["empirical"]
        assert relative_error(empirical.alpha[0], (s + 1) / (s - 1)) <= REL
        assert relative_error(empirical.beta[0], -1 / (s - 1)) <= REL


RAPPOR_EPSILONS = [LOWEST, 1e-3, 0.01, 0.1, 1.0, 4.0, 8.0, HIGHEST]


@pytest.mark.parametrize("name", ["rappor", "rappor-admissible"])
@pytest.mark.parametrize("k", [2, 3, 8, 32, 256])
def test_rappor_estimators_and_risks_are_exact(name, k):
    for epsilon in RAPPOR_EPSILONS:
        _check_rappor(name, k, epsilon)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rappor", "rappor-admissible"])
@pytest.mark.parametrize("k", [1024])
def test_rappor_estimators_and_risks_are_exact_at_large_k(name, k):
    for epsilon in RAPPOR_EPSILONS:
        _check_rappor(name, k, epsilon)
