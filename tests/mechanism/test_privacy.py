"""The privacy calculus of docs/math.md (003 ch. 3-4, 000 sec. 3)."""

from __future__ import annotations

import math

import pytest

from veil.mechanism import (
    MechanismError,
    epsilon_to_gamma,
    gamma_to_epsilon,
    parity,
    posterior_bounds,
    rho_gamma,
    row_parity,
    spec_for,
    transition_matrix,
)


def test_epsilon_and_gamma_are_inverse():
    for eps in (0.01, 0.5, 1.0, 4.0, 10.0):
        assert gamma_to_epsilon(epsilon_to_gamma(eps)) == pytest.approx(eps)
    for bad in (0.0, -1.0, math.inf, math.nan, 1e-9, 21.0):
        with pytest.raises(MechanismError):
            epsilon_to_gamma(bad)
    with pytest.raises(MechanismError):
        gamma_to_epsilon(1.0)


def test_posterior_bounds_are_attained_by_the_worst_report():
    # For a binary property with prior a and a report whose likelihood ratio is gamma, Bayes'
    # rule gives exactly the upper bound; ratio 1/gamma gives the lower bound.
    gamma = math.e
    for a in (0.01, 0.1, 0.5, 0.9):
        low, high = posterior_bounds(gamma, a)
        assert high == pytest.approx(gamma * a / (gamma * a + (1 - a)))
        assert low == pytest.approx(a / (a + gamma * (1 - a)))
        assert low < a < high
    assert posterior_bounds(1.0, 0.3) == pytest.approx((0.3, 0.3))
    with pytest.raises(MechanismError, match="prior"):
        posterior_bounds(2.0, 1.0)


def test_posterior_of_a_real_design_stays_within_the_bounds():
    # Any property Q, any prior: check every report of a small design against the bound.
    spec = spec_for("subset", 5, 1.0)
    reports, matrix = transition_matrix(spec)
    prior = [0.4, 0.3, 0.15, 0.1, 0.05]
    for members in ((0,), (1, 2), (4,), (0, 3, 4)):
        a = sum(prior[j] for j in members)
        low, high = posterior_bounds(spec.gamma, a)
        for row in matrix:
            evidence = sum(p * x for p, x in zip(prior, row))
            posterior = sum(prior[j] * row[j] for j in members) / evidence
            assert low - 1e-12 <= posterior <= high + 1e-12


def test_rho1_to_rho2_privacy():
    g = rho_gamma(0.1, 0.5)
    assert g == pytest.approx(9.0)
    # At that parity a prior of rho1 can reach exactly rho2 and no more.
    assert posterior_bounds(g, 0.1)[1] == pytest.approx(0.5)
    with pytest.raises(MechanismError, match="rho2 must be larger"):
        rho_gamma(0.5, 0.1)


def test_parity_of_rows():
    assert row_parity([0.2, 0.1, 0.4]) == pytest.approx(4.0)
    assert row_parity([0.0, 0.1]) == math.inf
    assert row_parity([0.0, 0.0]) == 1.0
    assert parity([[0.5, 0.25], [0.5, 0.75]]) == pytest.approx(2.0)
