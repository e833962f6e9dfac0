"""epsilon-DP PRAM (paper 004): feasibility, closed forms, Proposition 2, optimality, sampling, MLE."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.release import (
    ReleaseError,
    TableError,
    binary_keep_probability,
    dp_parity,
    dp_pram,
    dp_pram_design,
    dp_pram_matrix,
    dp_pram_mle,
    mutual_information,
    proposition2_applies,
    proposition2_vertices,
    release_dp_pram,
    satisfies_dp,
    symmetric_keep_probability,
    vertex_candidates,
)


def constraint_ratios(q, s):
    """Every ratio of 004's condition (10), for every ordered pair k != k'."""
    out = []
    for k, kp in itertools.permutations(range(s), 2):
        out += [(s - 1) * q[k] / (1 - q[kp]), (1 - q[k]) / ((s - 1) * q[kp])]
        if s >= 3:
            out.append((1 - q[k]) / (1 - q[kp]))
    return np.array(out)


def mi_brute(q, p):
    joint = dp_pram_matrix(q) * p[None, :]
    pz = joint.sum(axis=1)
    mask = joint > 0
    return float(np.sum(joint[mask] * np.log(joint[mask] / (pz[:, None] * p[None, :])[mask])))


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 9), st.floats(0.05, 5.0), st.lists(st.floats(0.0, 1.0), min_size=9, max_size=9))
def test_every_design_satisfies_every_dp_constraint(s, epsilon, weights):
    p = np.array(weights[:s]) + 1e-3
    design = dp_pram_design(p, epsilon)
    q = design.q
    assert np.all(constraint_ratios(q, s) <= math.exp(epsilon))  # strictly in floating point
    assert satisfies_dp(q, epsilon) and dp_parity(q) <= math.exp(epsilon)
    assert design.mutual_information == pytest.approx(mi_brute(q, design.p), abs=1e-12)


def test_binary_closed_form():
    for epsilon in (0.05, 0.5, 1.0, 3.0):
        v = math.exp(epsilon) / (1 + math.exp(epsilon))
        assert binary_keep_probability(epsilon) == pytest.approx(v)
        for p in ([0.5, 0.5], [0.48, 0.52], [0.01, 0.99]):
            design = dp_pram_design(p, epsilon)
            assert design.search == "binary" and design.exact
            assert design.q == pytest.approx([v, v], abs=1e-11)
            # (1 - v, 1 - v) is as good; the degenerate vertices (1, 0) and (0, 1) are worthless.
            assert mutual_information([1 - v, 1 - v], p) == pytest.approx(design.mutual_information, abs=1e-10)
            assert mutual_information([1.0, 0.0], p) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("s", [3, 4, 7, 20])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_symmetric_closed_form_and_uniform_p(s, epsilon):
    a = math.exp(epsilon)
    v_a, v_minus = a / (a + s - 1), 1 / (1 + a * (s - 1))
    q = symmetric_keep_probability(s, epsilon)
    assert q == pytest.approx(v_a)  # uniform p: the upper end of the interval (k-RR)
    assert mutual_information(np.full(s, v_a), np.full(s, 1 / s)) > mutual_information(
        np.full(s, v_minus), np.full(s, 1 / s)
    )
    design = dp_pram_design(np.ones(s), epsilon)
    assert design.search == "symmetric" and design.q == pytest.approx(np.full(s, v_a), abs=1e-11)
    # Every symmetric q in the interval is feasible; an end is optimal (f is convex in q).
    grid = np.linspace(v_minus, v_a, 25)
    p = np.random.default_rng(s).dirichlet(np.ones(s))
    best = symmetric_keep_probability(s, epsilon, p)
    assert best in (pytest.approx(v_a), pytest.approx(v_minus))
    assert all(mutual_information(np.full(s, g), p) <= mutual_information(np.full(s, best), p) + 1e-12 for g in grid)


@pytest.mark.parametrize("s, epsilon", [(5, 0.5), (6, 1.0), (10, 0.5), (10, 2.0), (30, 1.0), (30, 3.3)])
def test_the_vertices_are_proposition_2s_when_it_applies(s, epsilon):
    assert proposition2_applies(s, epsilon)
    mine = vertex_candidates(s, epsilon)
    theirs = proposition2_vertices(s, epsilon)
    assert mine.shape == theirs.shape
    assert np.allclose(np.array(sorted(map(tuple, mine))), np.array(sorted(map(tuple, theirs))), atol=1e-12)


def test_proposition_2s_condition():
    assert not proposition2_applies(4, 0.01)  # log(4 + 0 - 2) - log 2 = 0
    assert proposition2_applies(10, 2.0) and not proposition2_applies(10, 2.1)  # bound 2.063
    assert not proposition2_applies(3, 0.1)


@pytest.mark.parametrize("s, epsilon", [(3, 0.5), (3, 2.0), (4, 1.0), (5, 2.0), (6, 3.0), (8, 5.0)])
def test_the_vertex_list_is_complete_by_linear_programming(s, epsilon):
    """For a linear objective c, the minimum over the polytope is at a vertex, and over the
    permutations of a vertex v it is sum(sorted(c) * sorted(v, reverse)) (rearrangement). So if the
    candidates are all the vertices, their best equals the LP optimum for every c."""
    from scipy.optimize import linprog

    a, n = math.exp(epsilon), s - 1
    rows, rhs = [], []
    for k, kp in itertools.permutations(range(s), 2):
        r = np.zeros(s)
        r[k], r[kp] = n, a
        rows.append(r.copy()), rhs.append(a)
        r = np.zeros(s)
        r[k], r[kp] = -1, -a * n
        rows.append(r.copy()), rhs.append(-1)
        r = np.zeros(s)
        r[k], r[kp] = -1, a
        rows.append(r.copy()), rhs.append(a - 1)
    vertices = vertex_candidates(s, epsilon)
    for v in vertices:
        assert np.all(np.array(rows) @ v <= np.array(rhs) + 1e-9) and np.all((v >= 0) & (v <= 1))
    rng = np.random.default_rng(s * 100 + int(epsilon * 10))
    for _ in range(200):
        c = rng.normal(size=s)
        lp = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=[(0, 1)] * s, method="highs")
        best = min(float(np.sort(c) @ np.sort(v)[::-1]) for v in vertices)
        assert best == pytest.approx(lp.fun, abs=1e-9)


def test_exhaustive_and_ordered_search_agree():
    rng = np.random.default_rng(2)
    for _ in range(40):
        s = int(rng.integers(3, 9))
        epsilon = float(rng.choice([0.1, 0.5, 1.0, 2.0, 4.0]))
        p = rng.dirichlet(np.ones(s) * float(rng.choice([0.1, 0.5, 2.0])))
        full = dp_pram_design(p, epsilon)
        fast = dp_pram_design(p, epsilon, exhaustive_up_to=0)
        assert full.exact and not fast.exact
        assert fast.mutual_information == pytest.approx(full.mutual_information, rel=1e-9, abs=1e-14)


def test_the_optimum_beats_other_feasible_points():
    rng = np.random.default_rng(4)
    s, epsilon = 6, 1.5
    p = np.array([0.55, 0.2, 0.1, 0.1, 0.04, 0.01])
    design = dp_pram_design(p, epsilon)
    vertices = vertex_candidates(s, epsilon)
    for _ in range(300):  # random points of the polytope: convex mixtures of permuted vertices
        picks = vertices[rng.integers(len(vertices), size=4)]
        points = np.array([rng.permutation(v) for v in picks])
        q = rng.dirichlet(np.ones(4)) @ points
        assert satisfies_dp(q, epsilon + 1e-9)
        assert mutual_information(q, p) <= design.mutual_information + 1e-12


def test_a_skewed_marginal_can_prefer_another_vertex():
    p = np.array([0.636, 1e-9, 0.078, 0.286])
    design = dp_pram_design(p, 1.0)
    k_rr = np.full(4, math.e / (math.e + 3))
    assert design.mutual_information > mutual_information(k_rr, p) * 1.1
    assert satisfies_dp(design.q, 1.0)


def test_sampling_follows_the_matrix_and_the_mle_recovers_p():
    rng = np.random.default_rng(9)
    p = np.array([0.3, 0.1, 0.2, 0.08, 0.02, 0.04, 0.06, 0.1, 0.01, 0.09])  # 004 sec. 4.1, scenario I
    design = dp_pram_design(p, 2.0)
    x = rng.choice(10, size=200_000, p=p)
    z = dp_pram(x, design.q, rng)
    mat = dp_pram_matrix(design.q)
    for k in (0, 4):
        freq = np.bincount(z[x == k], minlength=10) / np.count_nonzero(x == k)
        assert np.allclose(freq, mat[:, k], atol=4.5 * np.sqrt(mat[:, k].max() / np.count_nonzero(x == k)))
    mle = dp_pram_mle(np.bincount(z, minlength=10), design.q)
    assert mle.sum() == pytest.approx(1.0) and np.all(mle >= 0)
    assert np.allclose(mle, p, atol=0.01)


def test_the_mle_stays_a_distribution_at_the_boundary():
    q = np.full(4, math.exp(0.5) / (math.exp(0.5) + 3))
    counts = np.array([100, 0, 0, 0])  # the inverse gives negative entries: EM must be used
    direct = np.linalg.solve(dp_pram_matrix(q), counts / 100)
    assert direct.min() < 0
    mle = dp_pram_mle(counts, q)
    assert np.all(mle >= 0) and mle.sum() == pytest.approx(1.0)
    loglik = lambda r: float(counts @ np.log(dp_pram_matrix(q) @ r))  # noqa: E731
    rng = np.random.default_rng(1)
    for _ in range(50):
        other = rng.dirichlet(np.ones(4))
        assert loglik(other) <= loglik(mle) + 1e-9


def test_release_a_table_column(population):
    small = {k: v[:5000] for k, v in population.items()}
    domain = {"marital": ["married", "widowed", "divorced", "separated", "never married"]}
    rel = release_dp_pram(small, ["marital"], 1.0, domain=domain, rng=3)
    assert list(rel.table) == list(small) and set(rel.table["marital"]) <= set(domain["marital"])
    np.testing.assert_array_equal(rel.table["age"], small["age"])
    report = rel.report()["columns"]["marital"]
    assert report["parity"] <= report["e_epsilon"] and report["categories"] == domain["marital"]
    assert sum(report["released"]) == 5000 and sum(report["mle"]) == pytest.approx(5000)
    uniform = release_dp_pram(small, ["marital", "race"], 1.0, prior="uniform", rng=3)
    assert uniform.report()["epsilon_per_record"] == 2.0
    assert uniform.designs["race"].search == "symmetric"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"domain": {"marital": ["married", "widowed"]}},
            TableError,
            "column 'marital' holds the value 'never married', which is not in its domain",
        ),
        ({"domain": {"age": ["1"]}}, ReleaseError, "the domain names column 'age', which is not released"),
        ({"prior": "guess"}, ReleaseError, "prior must be 'data' or 'uniform'"),
    ],
)
def test_release_errors(population, kwargs, error, message):
    small = {k: v[:200] for k, v in population.items()}
    with pytest.raises(error, match=message):
        release_dp_pram(small, ["marital"], 1.0, **kwargs)
    with pytest.raises(ReleaseError, match="epsilon must be a finite number above 0"):
        release_dp_pram(small, ["marital"], 0.0)
