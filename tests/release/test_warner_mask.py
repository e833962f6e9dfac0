"""Warner masking (paper 002): Kim's formulas, and unbiasedness of the estimators in simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from veil.release import (
    Masking,
    ReleaseError,
    TableError,
    masked_correlation,
    masked_covariance,
    masked_joint,
    masked_variance,
    masking_variance,
    release_mask,
    warner_covariance,
    warner_estimator_correlation,
    warner_mask,
    warner_proportion,
    warner_variance,
)

# 002 Table 1 (n = 1,000, a shared slip): pi1, pi2, pi12, p, Warner's correlation, the proposed one.
TABLE_1 = [
    (0.5, 0.3, 0.2, 0.6, 0.2006, 0.2182),
    (0.5, 0.3, 0.2, 0.7, 0.2026, 0.2182),
    (0.4, 0.3, 0.2, 0.6, 0.3984, 0.3563),
    (0.4, 0.3, 0.2, 0.7, 0.3935, 0.3563),
    (0.3, 0.5, 0.1, 0.6, -0.2006, -0.2182),
    (0.3, 0.5, 0.1, 0.7, -0.2026, -0.2182),
    (0.3, 0.4, 0.1, 0.6, -0.0032, -0.0891),
    (0.3, 0.4, 0.1, 0.7, -0.0130, -0.0891),
]


@pytest.mark.parametrize("pi1, pi2, pi12, p, warner, proposed", TABLE_1)
def test_kim_table_1(pi1, pi2, pi12, p, warner, proposed):
    assert round(warner_estimator_correlation(pi1, pi2, pi12, p, 1000), 4) == warner  # eqs. 4, 7
    assert round(warner_estimator_correlation(pi1, pi2, pi12, p, 1000, population=10_000, slips=1000), 4) == proposed
    # The proposed correlation is the attributes' own correlation, whatever N.
    own = (pi12 - pi1 * pi2) / math.sqrt(pi1 * (1 - pi1) * pi2 * (1 - pi2))
    assert warner_estimator_correlation(pi1, pi2, pi12, p, 1000, population=1500, slips=1000) == pytest.approx(own)
    # The text's example: -.0891 proposed against -.00321 Warner's.
    if (pi1, pi2, pi12, p) == (0.3, 0.4, 0.1, 0.6):
        assert round(warner_estimator_correlation(pi1, pi2, pi12, p, 1000), 5) == -0.00321


@pytest.mark.parametrize(
    "pi1, pi2, pi12, p1, p2, n, N",
    [
        (0.3, 0.4, 0.1, 0.2, 0.35, 500, 10_000),
        (0.7, 0.5, 0.45, 0.9, 0.15, 1000, 1_000_000),
        (0.1, 0.2, 0.05, 0.3, 0.3, 50, 60),
    ],
)
def test_the_general_formulas_reduce_to_kims_equations(pi1, pi2, pi12, p1, p2, n, N):
    c1 = 1 - 2 * p1
    fpc = (N - n) / (N - 1)
    eq3 = pi1 * (1 - pi1) / (n * c1**2) * (N - n * c1**2) / (N - 1)
    eq4 = pi1 * (1 - pi1) / n + p1 * (1 - p1) / (n * c1**2)
    eq5 = (pi12 - pi1 * pi2) / n * fpc
    eq6 = (pi12 - pi1 * pi2) / (n * c1**2) * (N - n * c1**2) / (N - 1)
    eq7 = (pi12 - pi1 * pi2) / n + p1 * (1 - p1) / (n * c1**2) * (1 - 2 * pi1 - 2 * pi2 + 4 * pi12)
    assert warner_variance(pi1, p1, n, population=N, slips=n) == pytest.approx(eq3, rel=1e-12)
    assert warner_variance(pi1, p1, n) == pytest.approx(eq4, rel=1e-12)
    for slips in (None, n, 3 * n):
        assert warner_covariance(pi1, pi2, pi12, p1, p2, n, population=N, slips=slips) == pytest.approx(eq5, rel=1e-12)
        assert warner_covariance(pi1, pi2, pi12, p1, None, n, population=N) == pytest.approx(eq5, rel=1e-12)  # eq. 8
    shared = warner_covariance(pi1, pi2, pi12, p1, p1, n, shared=True, population=N, slips=n)
    assert shared == pytest.approx(eq6, rel=1e-12)
    assert warner_covariance(pi1, pi2, pi12, p1, p1, n, shared=True) == pytest.approx(eq7, rel=1e-12)
    # The variance is the covariance of an attribute with itself.
    assert warner_variance(pi1, p1, n, population=N, slips=n) == pytest.approx(
        warner_covariance(pi1, pi1, pi1, p1, p1, n, shared=True, population=N, slips=n)
    )
    # Masking alone (N = n): 4p(1-p) pi(1-pi) / ((n-1) c^2) without replacement, p(1-p)/(n c^2) with.
    without = 4 * p1 * (1 - p1) * pi1 * (1 - pi1) / ((n - 1) * c1**2)
    assert masking_variance(pi1, n, Masking(p1)) == pytest.approx(without)
    assert masking_variance(pi1, n, Masking(p1, replacement=True)) == pytest.approx(p1 * (1 - p1) / (n * c1**2))


def correlated_table(n, rng):
    x1 = (rng.random(n) < 0.35).astype(np.int64)
    x2 = np.where(x1 == 1, rng.random(n) < 0.6, rng.random(n) < 0.25).astype(np.int64)
    return x1, x2


def slip(n, p, replacement, rng):
    return warner_mask(np.zeros(n, dtype=np.int64), p, replacement=replacement, rng=rng)


# 2,000 repetitions by default (the tolerances follow reps), 6,000 under -m slow.
@pytest.mark.parametrize("reps", [2000, pytest.param(6000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("scheme", ["separate", "shared", "one clear"])
def test_estimators_are_unbiased_given_the_table_and_match_the_formulas(scheme, replacement, reps):
    rng = np.random.default_rng(21 + replacement + 10 * len(scheme))
    n = 300
    x1, x2 = correlated_table(n, rng)
    pi1, pi2, pi12 = x1.mean(), x2.mean(), (x1 * x2).mean()
    truth_cov = pi12 - pi1 * pi2
    truth_corr = truth_cov / math.sqrt(x1.var() * x2.var())
    p1, p2 = (0.2, 0.2) if scheme == "shared" else (0.2, 0.3)
    est = {k: [] for k in ("pi1", "pi2", "pi12", "cov", "var1", "corr")}
    for _ in range(reps):
        y1, m1 = slip(n, p1, replacement, rng)
        if scheme == "shared":
            y2, m2 = y1, m1
            m1 = m2 = Masking(m1.p, replacement, "s")
        else:
            y2, m2 = slip(n, p2, replacement, rng)
        z1 = x1 ^ y1
        z2, m2 = (x2, None) if scheme == "one clear" else (x2 ^ y2, m2)
        est["pi1"].append(warner_proportion(z1, m1.p))
        est["pi2"].append(float(z2.mean()) if m2 is None else warner_proportion(z2, m2.p))
        est["pi12"].append(masked_joint(z1, z2, m1, m2))
        est["cov"].append(masked_covariance(z1, z2, m1, m2))
        est["var1"].append(masked_variance(z1, m1))
        est["corr"].append(masked_correlation(z1, z2, m1, m2))
    e = {k: np.array(v) for k, v in est.items()}
    for name, truth in (("pi1", pi1), ("pi2", pi2), ("pi12", pi12), ("cov", truth_cov), ("var1", x1.var())):
        se = e[name].std() / math.sqrt(reps)
        assert abs(e[name].mean() - truth) <= 4.5 * se + 1e-12, name
    # The variance and covariance of the estimates given the table: the formulas with N = n.
    slips = None if replacement else n
    p2m = None if m2 is None else m2.p
    v1 = warner_variance(pi1, m1.p, n, population=n, slips=slips)
    cov = warner_covariance(pi1, pi2, pi12, m1.p, p2m, n, shared=scheme == "shared", population=n, slips=slips)
    tol = 4.5 * math.sqrt(2 / reps)
    assert e["pi1"].var() == pytest.approx(v1, rel=tol)
    assert np.cov(e["pi1"], e["pi2"])[0, 1] == pytest.approx(cov, abs=tol * math.sqrt(v1 * max(e["pi2"].var(), 1e-12)))
    # The correlation estimate is a ratio: consistent, nearly unbiased at this size.
    assert abs(np.nanmean(e["corr"]) - truth_corr) <= 0.03


def test_with_sampling_from_a_finite_population_eqs_3_and_6():
    rng = np.random.default_rng(8)
    big_n, n, p, reps = 2000, 400, 0.25, 6000
    x1, x2 = correlated_table(big_n, rng)
    pi1, pi2, pi12 = x1.mean(), x2.mean(), (x1 * x2).mean()
    a, b = [], []
    for _ in range(reps):
        rows = rng.choice(big_n, size=n, replace=False)
        y, m = slip(n, p, False, rng)
        a.append(warner_proportion(x1[rows] ^ y, m.p))
        b.append(warner_proportion(x2[rows] ^ y, m.p))
    a, b = np.array(a), np.array(b)
    tol = 4.5 * math.sqrt(2 / reps)
    assert a.var() == pytest.approx(warner_variance(pi1, p, n, population=big_n, slips=n), rel=tol)  # eq. 3
    eq6 = warner_covariance(pi1, pi2, pi12, p, p, n, shared=True, population=big_n, slips=n)
    assert np.cov(a, b)[0, 1] == pytest.approx(eq6, rel=3 * tol)


def test_release_mask_on_the_population(population):
    rel = release_mask(population, ["smoker", "insured"], 0.1, rng=4)
    report = rel.report()
    n = 60_000
    assert report["columns"]["smoker"]["p"] == round(0.1 * n) / n
    for c in ("smoker", "insured"):
        col = report["columns"][c]
        assert abs(col["estimate"] - col["original_share"]) <= 4.5 * col["masking_se"]
        assert col["records_changed"] == pytest.approx(0.1 * n, abs=1)  # exactly round(n p) slips are 1
    pair = report["pairs"][0]
    assert not pair["shared_slip"]
    # The correlation estimate's SD here is about 0.0085 (simulated); the original is -0.056.
    assert abs(pair["estimated_correlation"] - pair["original_correlation"]) < 0.05
    assert abs(pair["naive_correlation_of_released"]) < abs(pair["original_correlation"])  # masking attenuates
    np.testing.assert_array_equal(rel.table["age"], population["age"])
    shared = release_mask(population, ["smoker", "insured"], 0.1, shared=True, replacement=True, rng=4)
    assert shared.report()["pairs"][0]["shared_slip"]
    flips = [shared.table[c] != population[c] for c in ("smoker", "insured")]
    np.testing.assert_array_equal(flips[0], flips[1])  # one slip per record for both


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda t: release_mask(t, ["b"], 0.5), ReleaseError, "not 1/2"),
        (lambda t: release_mask(t, ["b", "c"], {"b": 0.2, "c": 0.3}, shared=True), ReleaseError, "need one p"),
        (lambda t: release_mask(t, ["b"], {"b": 0.2, "x": 0.1}), ReleaseError, "p is given for column 'x'"),
        (lambda t: release_mask(t, ["bad"], 0.2), TableError, "column 'bad', record 3: value 'yes' is not 0 or 1"),
        (lambda t: release_mask(t, ["b"], 0.01), ReleaseError, "gives 0 slips of 1"),
    ],
)
def test_errors_name_the_column_and_value(call, error, message):
    table = {"b": ["0", "1", "1", "0"], "c": ["1", "1", "0", "0"], "bad": ["0", "1", "yes", "0"]}
    with pytest.raises(error, match=message):
        call(table)
