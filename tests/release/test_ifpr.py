"""IFPR: P T = T exactly, E[S | T] = T by simulation, and the variances of 001 sec. 6."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.release import (
    ReleaseError,
    ifpr,
    ifpr_covariance,
    ifpr_matrix,
    ifpr_sample,
    ifpr_subset_variance,
    ifpr_total_variance,
)

EPS = 2.0**-53


def covariance_from_matrix(counts, theta):
    """V(S | T) = D_T - sum_j T_j P_j P_j' (001 eq. 3.6), straight from the matrix."""
    p = ifpr_matrix(counts, theta)
    t = np.asarray(counts, dtype=float)
    return np.diag(t) - sum(t[j] * np.outer(p[:, j], p[:, j]) for j in range(t.size))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=60), st.floats(0.0, 1.0))
def test_p_t_equals_t_to_float_precision(counts, theta):
    """Entry i of P T sums m non-negative terms whose exact total is T_i; each term carries a few
    roundings and the sum m - 1 more, so |P T - T| <= (m + 3) 2^-53 T_i."""
    t = np.array(counts, dtype=np.float64)
    p = ifpr_matrix(t, theta)
    assert np.allclose(p.sum(axis=0), 1.0, rtol=0, atol=(t.size + 3) * EPS)
    assert np.all(np.abs(p @ t - t) <= (t.size + 3) * EPS * t)
    assert np.all(p >= 0)


@pytest.mark.parametrize("counts", [(1, 1), (1, 2, 3), (1, 1, 1, 2, 2, 7, 40), tuple(range(1, 30))])
@pytest.mark.parametrize("theta", [Fraction(4, 5), Fraction(1, 3), Fraction(99, 100)])
def test_p_t_equals_t_exactly_in_rational_arithmetic(counts, theta):
    m = len(counts)
    for i in range(m):
        total = sum((1 - theta / counts[j] if i == j else theta / ((m - 1) * counts[j])) * counts[j] for j in range(m))
        assert total == counts[i]


def test_the_matrix_is_the_papers():
    p = ifpr_matrix([1, 2, 4], 0.8)
    assert p[0, 0] == pytest.approx(0.2) and p[1, 0] == pytest.approx(0.4) and p[2, 0] == pytest.approx(0.4)
    assert p[1, 1] == pytest.approx(0.6) and p[0, 1] == pytest.approx(0.2)
    assert p[2, 2] == pytest.approx(0.8) and p[0, 2] == pytest.approx(0.1)


def test_unbiased_over_many_runs_and_the_covariance_matches_6_1_and_6_2():
    counts = np.array([1, 1, 2, 2, 3, 5])
    theta, runs = 0.8, 20_000
    positions = np.repeat(np.arange(counts.size), counts)
    rng = np.random.default_rng(11)
    s = np.array([np.bincount(ifpr_sample(positions, counts, theta, rng), minlength=counts.size) for _ in range(runs)])
    v = ifpr_covariance(counts, theta)
    mean = s.mean(axis=0)
    assert np.all(np.abs(mean - counts) <= 4.5 * np.sqrt(np.diag(v) / runs))  # E[S | T] = T
    assert np.allclose(np.cov(s.T), v, atol=0.05)
    assert s.sum(axis=1).min() == s.sum(axis=1).max() == counts.sum()  # records are conserved


def test_one_records_destination_follows_its_column():
    counts = np.array([2, 1, 1, 4])
    positions = np.repeat(np.arange(4), counts)
    rng = np.random.default_rng(5)
    theta, runs = 0.9, 40_000
    dest = np.array([ifpr_sample(positions, counts, theta, rng)[0] for _ in range(runs)])  # a record of cell 0
    freq = np.bincount(dest, minlength=4) / runs
    column = ifpr_matrix(counts, theta)[:, 0]
    assert np.all(np.abs(freq - column) <= 4.5 * np.sqrt(column * (1 - column) / runs))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=2, max_size=25), st.floats(0.0, 1.0), st.data())
def test_variance_formulas_6_1_to_6_5_equal_the_matrix_computation(counts, theta, data):
    v = covariance_from_matrix(counts, theta)
    assert np.allclose(ifpr_covariance(counts, theta), v, atol=1e-9)
    assert ifpr_total_variance(counts, theta) == pytest.approx(np.trace(v), abs=1e-9)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(counts), max_size=len(counts))))
    assert ifpr_subset_variance(counts, theta, mask) == pytest.approx(v[np.ix_(mask, mask)].sum(), abs=1e-9)
    assert ifpr_subset_variance(counts, theta, mask) <= 2 * theta * mask.sum() * (1 + 1e-12) + 1e-12  # (6.6)


def test_the_papers_v11_examples():
    # 001 sec. 6: theta = .8, m = 5, T = (1, 1, 2, 2, 2) gives v_11 = .86; another singleton .8704;
    # then cells of 2, 3, 3, 3 more: .9205 (upper bound theta (2 - theta / T_1) = .96).
    assert ifpr_covariance([1, 1, 2, 2, 2], 0.8)[0, 0] == pytest.approx(0.86)
    assert ifpr_covariance([1, 1, 1, 2, 2, 2], 0.8)[0, 0] == pytest.approx(0.8704)
    assert round(ifpr_covariance([1, 1, 1, 2, 2, 2, 2, 3, 3, 3], 0.8)[0, 0], 4) == 0.9205


def test_merging_blocks_adds_variance_6_4_and_the_papers_totals():
    """(6.4): V_t|c - V_t|s. The paper's own numbers after (6.4) disagree with (6.3): two blocks of
    two singletons give V_t|s = 1.28 (as printed) but merged V_t|c = 2.9867, not 4.6933; two blocks
    of five doubletons give 12 and 12.4444, not 14.4 and 14.8444. The formulas are right (they equal
    the matrix computation); the printed arithmetic is not."""
    theta = 0.8
    separate = 2 * ifpr_total_variance([1, 1], theta)
    merged = ifpr_total_variance([1, 1, 1, 1], theta)
    assert separate == pytest.approx(1.28)
    assert merged == pytest.approx(2.98667, abs=1e-5)
    assert merged - separate == pytest.approx(theta**2 / 3 * (2 / 1 * 2 + 2 / 1 * 2))  # (6.4)
    assert 2 * ifpr_total_variance([2] * 5, theta) == pytest.approx(12.0)
    assert ifpr_total_variance([2] * 10, theta) == pytest.approx(12.44444, abs=1e-5)
    assert np.trace(covariance_from_matrix([1, 1, 1, 1], theta)) == pytest.approx(merged)


def test_ifpr_of_an_array_keeps_values_and_errors_are_clear():
    values = np.array(["a", "b", "b", "c", "c", "c"])
    out = ifpr(values, 0.5, rng=1)
    assert out.shape == values.shape and set(out) <= {"a", "b", "c"}
    with pytest.raises(ReleaseError, match="at least two distinct values"):
        ifpr(np.array(["a", "a"]), 0.5)
    with pytest.raises(ReleaseError, match="non-empty"):
        ifpr_matrix([1, 0, 2], 0.5)
    with pytest.raises(ReleaseError, match="frequencies of the records"):
        ifpr_sample(np.array([0, 1]), np.array([2, 1]), 0.5)
    with pytest.raises(ReleaseError, match="theta must be between 0 and 1"):
        ifpr_matrix([1, 2], 1.5)
