"""The risk calculus of 001 sec. 4 against its own tables, and the exact R_j(a, t) against brute force."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.release import (
    ReleaseError,
    block_match_risks,
    goal_min_block_cells,
    goal_theta,
    goal_xi,
    h,
    min_block_size,
    no_match_bounds,
    no_match_probability,
    psi,
    theta_star,
    theta_zero,
)

# 001 Table 2: theta, psi(1, theta), psi(2, theta), xi, required block size.
TABLE_2 = [
    (0.4, 0.789, 0.476, 0.789, 2),
    (0.5, 0.667, 0.462, 0.667, 2),
    (2 / 3, 0.429, 0.429, 0.429, 3),
    (0.75, 0.308, 0.408, 0.408, 4),
    (0.8, 0.238, 0.395, 0.395, 5),
    (0.9, 0.110, 0.365, 0.365, 10),
    (0.95, 0.052, 0.350, 0.350, 20),
    (0.99, 0.010, 0.337, 0.337, 100),
]


@pytest.mark.parametrize("theta, psi1, psi2, xi, block", TABLE_2)
def test_table_2_to_the_printed_precision(theta, psi1, psi2, xi, block):
    assert round(psi(1, theta), 3) == psi1
    assert round(psi(2, theta), 3) == psi2
    assert round(h(theta), 3) == xi == round(max(psi(1, theta), psi(2, theta)), 3)
    assert min_block_size(theta) == block
    assert goal_min_block_cells(3, theta) == block and goal_min_block_cells(2, theta) == 2


@pytest.mark.parametrize("theta", [row[0] for row in TABLE_2])
def test_theta_zero_and_theta_star_invert_h_and_psi(theta):
    assert theta_zero(h(theta)) == pytest.approx(theta, abs=1e-12)
    assert theta_star(psi(1, theta)) == pytest.approx(theta, abs=1e-12)
    assert goal_theta(3, goal_xi(3, theta)) == pytest.approx(theta, abs=1e-12)
    assert goal_theta(1, goal_xi(1, theta)) == pytest.approx(theta, abs=1e-12)


def test_h_is_continuous_strictly_decreasing_from_1_to_one_third():
    thetas = np.linspace(0, 1, 2001)
    values = np.array([h(t) for t in thetas])
    assert values[0] == 1 and values[-1] == pytest.approx(1 / 3)
    assert np.all(np.diff(values) < 0)
    assert psi(1, 2 / 3) == pytest.approx(psi(2, 2 / 3)) == pytest.approx(3 / 7)
    # psi(., theta) is largest at t = 1 up to 2/3 and at t = 2 above (sec. 4.1).
    for theta in (0.3, 0.6, 0.7, 0.9):
        top = max(range(1, 50), key=lambda t: psi(t, theta))
        assert top == (1 if theta <= 2 / 3 else 2)


@pytest.mark.parametrize("xi", [0.334, 0.35, 0.395, 0.42857, 0.43, 0.5, 0.9, 0.999])
def test_theta_zero_solves_h_equals_xi_on_both_branches(xi):
    theta = theta_zero(xi)
    assert 0 < theta < 1 and h(theta) == pytest.approx(xi, rel=1e-12)
    assert (theta > 2 / 3) == (xi < 3 / 7)


def test_the_paper_example_xi_gives_theta_near_point_eight_and_five_cells():
    # 001 sec. 7 uses theta = .8 and m_0 = 5 for xi = .395 (h(.8) = .3947 rounds to .395).
    theta = theta_zero(0.395)
    assert theta == pytest.approx(0.8, abs=1e-3) and theta < 0.8
    assert min_block_size(theta) == 5


def test_min_block_size_is_not_fooled_by_float_rounding():
    assert 1 / (1 - 0.8) > 5 and 1 / (1 - 0.9) > 10  # the floats a plain ceil would round up
    assert min_block_size(0.8) == 5 and min_block_size(0.9) == 10 and min_block_size(2 / 3) == 3
    assert min_block_size(0.8 + 1e-6) == 6 and min_block_size(0.3) == 2


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: theta_zero(1 / 3), "xi must be strictly between 1/3 and 1"),
        (lambda: theta_zero(1.0), "xi must be strictly between 1/3 and 1"),
        (lambda: theta_star(0.0), "xi must be strictly between 0 and 1"),
        (lambda: min_block_size(1.0), "theta must be strictly between 0 and 1"),
        (lambda: goal_theta(4, 0.5), "goal must be 1, 2 or 3"),
    ],
)
def test_errors_are_release_errors_with_one_sentence(call, message):
    with pytest.raises(ReleaseError, match=message) as info:
        call()
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")


# 001 Table 1: bounds of P(S_1 = 0 | T) for T_1 = 1; rows k_1 = 2, 3, 4, 5, 10, 15 (lower) and UB.
TABLE_1_THETAS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
TABLE_1 = {
    2: [0.0900, 0.1600, 0.2100, 0.2400, 0.2500, 0.2400, 0.2100, 0.1600, 0.0900],
    3: [0.0902, 0.1620, 0.2167, 0.2560, 0.2812, 0.2940, 0.2958, 0.2880, 0.2723],
    4: [0.0903, 0.1626, 0.2187, 0.2604, 0.2894, 0.3072, 0.3154, 0.3155, 0.3087],
    5: [0.0904, 0.1629, 0.2196, 0.2624, 0.2931, 0.3132, 0.3243, 0.3277, 0.3247],
    10: [0.0904, 0.1634, 0.2211, 0.2657, 0.2989, 0.3225, 0.3378, 0.3461, 0.3487],
    15: [0.0905, 0.1635, 0.2215, 0.2666, 0.3005, 0.3250, 0.3414, 0.3510, 0.3550],
}
TABLE_1_UB = [0.0905, 0.1637, 0.2222, 0.2681, 0.3033, 0.3293, 0.3476, 0.3595, 0.3659]


def test_table_1_no_match_bounds():
    for k1, row in TABLE_1.items():
        for theta, value in zip(TABLE_1_THETAS, row):
            assert abs(no_match_bounds(1, theta, k1)[0] - value) <= 0.00005 + 1e-12, (k1, theta)
    for theta, value in zip(TABLE_1_THETAS, TABLE_1_UB):
        assert abs(no_match_bounds(1, theta, 2)[1] - value) <= 0.00005 + 1e-12
    # Sec. 7.1's "theoretical values" of the no-match shares at theta = .8: 35.95% and 7.19%.
    assert round(no_match_bounds(1, 0.8, 5)[1], 4) == 0.3595
    assert round(no_match_bounds(2, 0.8, 5)[1], 4) == 0.0719
    # Sec. 4.1's upper bounds for T_1 = 2 at theta = .2, .5, .7, .8.
    assert [round(no_match_bounds(2, t, 5)[1], 4) for t in (0.2, 0.5, 0.7, 0.8)] == [0.0082, 0.0379, 0.0608, 0.0719]


def brute_force(counts, theta, target):
    """R_target(a, t) for a = 1, 2 and P(S_target = 0), by enumerating every record's destination
    with exact rational arithmetic."""
    m = len(counts)
    theta = Fraction(theta).limit_denominator(10**6)
    records = [c for c, t in enumerate(counts) for _ in range(t)]
    unit = records.index(target)  # the intruder's target B: the first record of the target cell
    probs = {a: Fraction(0) for a in range(len(records) + 1)}
    correct = {a: Fraction(0) for a in range(len(records) + 1)}
    for dest in itertools.product(range(m), repeat=len(records)):
        weight = Fraction(1)
        for c, d in zip(records, dest):
            weight *= 1 - theta / counts[c] if c == d else theta / ((m - 1) * counts[c])
        a = sum(1 for d in dest if d == target)
        probs[a] += weight
        if dest[unit] == target:
            correct[a] += weight / a
    return float(correct[1] / probs[1]), float(correct[2] / probs[2]), float(probs[0])


@pytest.mark.parametrize(
    "counts, theta", [((1, 1), 0.8), ((1, 2, 1), 0.8), ((2, 1, 3), 0.5), ((1, 1, 2, 1), 0.9), ((2, 1, 1, 1), 0.75)]
)
def test_block_risks_and_no_match_equal_brute_force(counts, theta):
    r1, r2 = block_match_risks(np.array(counts), theta)
    p0 = no_match_probability(np.array(counts), theta)
    for j in range(len(counts)):
        b1, b2, b0 = brute_force(counts, theta, j)
        assert r1[j] == pytest.approx(b1, rel=1e-9)
        assert p0[j] == pytest.approx(b0, rel=1e-9)
        if sum(counts) >= 2:
            assert r2[j] == pytest.approx(b2, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=2, max_size=40), st.floats(0.05, 0.97))
def test_r1_is_bounded_by_psi_and_r2_by_r1_in_blocks_of_m0_cells(counts, theta):
    t = np.array(counts)
    r1, r2 = block_match_risks(t, theta)
    bound = np.array([psi(c, theta) for c in counts])
    assert np.all(r1 <= bound * (1 + 1e-12))
    assert np.all(r1 <= h(theta) * (1 + 1e-12))
    if t.size >= min_block_size(theta):  # (4.15): a large enough block makes a = 1 the worst case
        assert np.all(r2 <= r1 * (1 + 1e-12))
    lo, hi = no_match_bounds(1, theta, t.size)
    p0 = no_match_probability(t, theta)[t == 1]
    assert np.all((p0 >= lo * (1 - 1e-12)) & (p0 <= hi * (1 + 1e-12)))


def test_r1_approaches_psi_as_a_block_of_singletons_grows():
    # The sum in (4.11) falls to its lower bound 1 as the block grows, so (4.12) becomes tight.
    theta = theta_star(0.25)
    assert psi(1, theta) == pytest.approx(0.25)
    risks = [block_match_risks(np.ones(m, dtype=int), theta)[0][0] for m in (2, 5, 50, 5000)]
    assert np.all(np.diff(risks) > 0) and risks[-1] < 0.25 and risks[-1] == pytest.approx(0.25, abs=1e-4)
