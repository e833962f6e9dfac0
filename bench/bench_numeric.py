"""Numeric metrics measured against their theory and against the published mean mechanisms.

For each epsilon (the part's own) x n x true distribution, on a metric with range [0, 10000]
(a page load time in ms) and realistic buckets (BUCKETS):

- **the mean part** (k-RR over mean_levels(epsilon) rounding points, alpha-point rounding): R
  repetitions of the n devices' reports, estimated by veil.aggregator.estimate and
  veil.aggregator.numeric.mean_estimate. n x MSE against the exact n x Var (the average of
  veil.mechanism.mean_variance over the devices), and the coverage of the 95% interval. The
  draws are exact in law and vectorized: a device's point is j + 1 with probability
  P(alpha < f) = ceil(f 2^53) / 2^53 (alpha is a multiple of 2^-53), the devices at one value
  rounded up are binomial; each point's reports keep it with the spec's integer keep threshold
  over 2^64, and the rest spread uniformly over the other points (multinomial), as
  KrrSpec.randomize does. One cell is checked against reports drawn one by one through
  KrrSpec.randomize and NumericSpec.category (--no-crosscheck skips it).
- **the distribution part** (the minimax q-subset design over the buckets, the default): R'
  repetitions drawn report by report by veil.aggregator.simulate (the device's randomization on a
  seeded keystream), veil.aggregator.numeric.quantile_estimates; the coverage of each quantile's
  interval (q = 0.5, 0.9, 0.99) of the population's quantile, inf {x : F(x) >= q}.
- **peers on the same populations**, implemented from the papers, values mapped to [-1, 1]:
  Duchi et al. (JASA 2018; = Ding et al.'s 1BitMean), the Piecewise Mechanism (PM) and the
  Hybrid Mechanism (HM) of Wang et al. (ICDE 2019): their n x MSE simulated (report by report;
  fewer repetitions at large n) beside their exact n x Var. multi-freq-ldpy and pure-ldp (in the
  dev group) estimate frequencies only, no mean of a number, so they have nothing to compare.

All n x MSE are on the [-1, 1] scale (the range mapped onto it), the scale of the papers'
tables. A population is M = min(n, 250) distinct values, the distribution's quantiles at
(i + 1/2) / M, each held by n / M devices (point masses: one value).

Usage:  .venv/bin/python bench/bench_numeric.py [--quick] [--reps R] [--update-docs]
Writes bench/results/numeric.json (--quick: bench/results/quick/numeric.json, smaller reps and
grid); --update-docs puts the levels table into docs/math.md 9.2 and the measured table into
bench/README.md, each between its markers. Seeded: the same command gives the same tables.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
from veil_testing.benchlib import (
    QUICK_RESULTS_DIR,
    RESULTS_DIR,
    machine_info,
    progress,
    replace_marked,
    write_results,
)

from veil.aggregator.counts import Counts
from veil.aggregator.estimate import Estimate, estimate_many
from veil.aggregator.numeric import QUANTILES, mean_estimate, quantile_estimates
from veil.aggregator.simulate import FastKeystream, simulate_counts
from veil.mechanism import (
    DISTRIBUTION,
    MEAN,
    MetricSpec,
    NumericSpec,
    WordRandomSource,
    mean_levels,
    mean_variance,
    worst_mean_variance,
)

LOW, HIGH = 0.0, 10_000.0
BUCKETS = (100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 7500.0)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
NS = (1_000, 100_000)
DISTINCT = 250  # distinct values in a population at most (each a binomial draw per repetition)
REPS = 10_000  # repetitions of the mean part per cell: n x MSE to about 1.4% (sqrt(2 / R))
QUANTILE_REPS = 500  # repetitions of the distribution part: coverage to about 1%
PEER_DRAWS = 2_000_000  # report draws per peer and cell (repetitions = this / n, at least 100)
LEVEL_EPSILONS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
SEED = 20261127
ROOT = Path(__file__).resolve().parent.parent
MATH_DOC, README = ROOT / "docs" / "math.md", ROOT / "bench" / "README.md"
LEVELS_MARKS = ("<!-- bench/bench_numeric.py levels: begin -->", "<!-- bench/bench_numeric.py levels: end -->")
TABLE_MARKS = ("<!-- bench/bench_numeric.py: begin -->", "<!-- bench/bench_numeric.py: end -->")


# --- true distributions (on the metric's range) ----------------------------------------------


def _quantile_function(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The distribution's quantile function on (0, 1), clipped to the range."""
    if name == "point-low":
        return lambda p: np.full(p.shape, LOW)
    if name == "point-high":
        return lambda p: np.full(p.shape, HIGH)
    if name == "uniform":
        return lambda p: LOW + (HIGH - LOW) * p
    if name == "exponential":  # mean 1000 ms, clipped at the top: skewed, a long tail
        return lambda p: np.minimum(-1000.0 * np.log1p(-p), HIGH)
    if name == "bimodal":  # 60% around 400 ms, 40% around 3000 ms (uniform lumps)
        return lambda p: np.where(p < 0.6, 200.0 + 400.0 * p / 0.6, 2000.0 + 2000.0 * (p - 0.6) / 0.4)
    raise ValueError(name)


DISTRIBUTIONS = ("point-low", "point-high", "uniform", "exponential", "bimodal")


def population(name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, devices holding each): n devices in all."""
    if name.startswith("point"):
        return _quantile_function(name)(np.zeros(1)), np.array([n], np.int64)
    m = min(n, DISTINCT)
    if n % m:
        raise ValueError(f"n = {n} is not a multiple of {m}")
    return _quantile_function(name)((np.arange(m) + 0.5) / m), np.full(m, n // m, np.int64)


def true_quantile(values: np.ndarray, devices: np.ndarray, q: float) -> float:
    """inf {x : F(x) >= q}, F the population's distribution function (exactly: q as written)."""
    order = np.argsort(values, kind="stable")
    frac = Fraction(str(q))
    reached = np.cumsum(devices[order]) * frac.denominator >= frac.numerator * int(devices.sum())
    return float(values[order][int(np.argmax(reached))])


# --- Veil's mean part ------------------------------------------------------------------------


def mean_spec(epsilon: float) -> MetricSpec:
    return MetricSpec.numeric_part(NumericSpec("load_ms", MEAN, LOW, HIGH, (), mean_levels(epsilon)), epsilon=epsilon)


def distribution_spec(epsilon: float) -> MetricSpec:
    return MetricSpec.numeric_part(NumericSpec("load_ms", DISTRIBUTION, LOW, HIGH, BUCKETS), "subset", epsilon)


def positions(numeric: NumericSpec, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's lower point j and fraction f, computed as NumericSpec.category does."""
    steps = numeric.levels - 1
    t = (values - numeric.low) / (numeric.high - numeric.low) * steps
    j = np.minimum(np.floor(t), steps - 1).astype(np.int64)
    return j, t - j


def exact_mean_variance(spec: MetricSpec, values: np.ndarray, devices: np.ndarray) -> float:
    """n x Var of the mean part's estimate on the [-1, 1] scale: the devices' mean_variance."""
    numeric = spec.numeric
    assert numeric is not None
    u = (values - numeric.low) / (numeric.high - numeric.low)
    each = np.array([mean_variance(spec.mechanism.epsilon, numeric.levels, float(x)) for x in u])
    return 4.0 * float(each @ devices) / float(devices.sum())


def mean_part_counts(
    spec: MetricSpec, values: np.ndarray, devices: np.ndarray, reps: int, rng: np.random.Generator
) -> np.ndarray:
    """(reps, levels) report counts of the n devices, each repetition a fresh draw of the devices'
    alphas and responses (see the module docstring: exact in law)."""
    numeric = spec.numeric
    assert numeric is not None
    levels = numeric.levels
    j, f = positions(numeric, values)
    up_probability = np.ceil(f * 2.0**53) / 2.0**53  # P(alpha < f), alpha on the 2^-53 grid
    up = rng.binomial(devices, up_probability, size=(reps, values.size))
    # Devices rounded to each point: a product with the values' one-hot points (exact in doubles).
    lower, upper = np.eye(levels)[j], np.eye(levels)[j + 1]
    at = np.rint((devices - up) @ lower + up @ upper).astype(np.int64)
    keep = spec.mechanism.keep_threshold / 2.0**64  # type: ignore[attr-defined]
    kept = rng.binomial(at, keep)
    counts = kept.copy()
    others = np.full(levels - 1, 1.0 / (levels - 1))
    for i in range(levels):
        spread = rng.multinomial(at[:, i] - kept[:, i], others)  # (reps, levels - 1)
        counts[:, :i] += spread[:, :i]
        counts[:, i + 1 :] += spread[:, i:]
    return counts


def randomized_counts(
    spec: MetricSpec, values: np.ndarray, devices: np.ndarray, reps: int, rng: np.random.Generator
) -> np.ndarray:
    """The same as mean_part_counts, report by report through NumericSpec.category and
    KrrSpec.randomize on seeded words (slow: the cross-check)."""
    numeric = spec.numeric
    assert numeric is not None
    device_values = np.repeat(values, devices)
    counts = np.zeros((reps, numeric.levels), np.int64)
    for r in range(reps):
        alphas = rng.integers(0, 2**53, device_values.size) / 2.0**53
        source = WordRandomSource(rng.integers(0, 2**32, 8 * device_values.size, dtype=np.uint64).tolist())
        for x, alpha in zip(device_values.tolist(), alphas.tolist()):
            (report,) = spec.mechanism.randomize(numeric.category(x, alpha), source)
            counts[r, report] += 1
    return counts


def estimates(spec: MetricSpec, counts: list[Counts]) -> list[Estimate]:
    return estimate_many(spec.mechanism, counts)


def mean_cell(
    spec: MetricSpec, values: np.ndarray, devices: np.ndarray, reps: int, rng: np.random.Generator
) -> dict[str, float]:
    """n x MSE (on [-1, 1]), its ratio to the exact n x Var, and the 95% interval's coverage."""
    n = int(devices.sum())
    truth = float(values @ devices) / n
    v = mean_part_counts(spec, values, devices, reps, rng)
    found = [mean_estimate(spec, e) for e in estimates(spec, [Counts((1,), [n], row[None, :]) for row in v])]
    got = np.array([m.estimate for m in found])
    width = HIGH - LOW
    mse = n * float(np.mean(((got - truth) * 2.0 / width) ** 2))
    exact = exact_mean_variance(spec, values, devices)
    covered = np.mean([m.lower <= truth <= m.upper for m in found])
    # The standard error served against the true one (sqrt of the MSE): above 1 where the spread
    # of the contributions includes the values' own spread (docs/math.md 9.4).
    stderr = math.sqrt(float(np.mean([m.stderr**2 for m in found])) / float(np.mean((got - truth) ** 2)))
    return {"n_mse": mse, "n_var": exact, "ratio": mse / exact, "coverage": float(covered), "stderr_ratio": stderr}


# --- Veil's distribution part ----------------------------------------------------------------


def quantile_cell(spec: MetricSpec, values: np.ndarray, devices: np.ndarray, reps: int, seed: int) -> dict[str, float]:
    """The coverage of each quantile's 95% interval, over reps repetitions."""
    numeric = spec.numeric
    assert numeric is not None
    buckets = np.searchsorted(np.array(numeric.boundaries), values, side="right")  # boundaries <= value
    device_buckets = np.repeat(buckets, devices).astype(np.uint32)
    truths = [true_quantile(values, devices, q) for q in QUANTILES]
    counts = [simulate_counts(spec.mechanism, device_buckets, keystream=FastKeystream(seed + r)) for r in range(reps)]
    hits = np.zeros(len(QUANTILES))
    for e in estimates(spec, counts):
        for i, (found, truth) in enumerate(zip(quantile_estimates(spec, e), truths)):
            hits[i] += found.lower <= truth <= found.upper
    return {f"coverage_q{q}": float(h / reps) for q, h in zip(QUANTILES, hits)}


# --- peers (values on [-1, 1]) -----------------------------------------------------------------


def duchi_bound(epsilon: float) -> float:
    """Duchi et al.'s output magnitude (e^eps + 1) / (e^eps - 1): the worst n x Var is its square."""
    return (math.exp(epsilon) + 1.0) / math.expm1(epsilon)


def duchi_variance(epsilon: float, t: np.ndarray) -> np.ndarray:
    return duchi_bound(epsilon) ** 2 - t * t


def pm_variance(epsilon: float, t: np.ndarray) -> np.ndarray:
    """Wang et al.'s Piecewise Mechanism: t^2 / (e^(eps/2) - 1) + (e^(eps/2) + 3) / (3 (e^(eps/2) - 1)^2)."""
    h = math.exp(epsilon / 2.0)
    return t * t / (h - 1.0) + (h + 3.0) / (3.0 * (h - 1.0) ** 2)


def hm_share(epsilon: float) -> float:
    """HM's probability of using PM: 1 - e^(-eps/2) above eps* (about 0.61), else 0 (Duchi):
    the choice with the smaller worst case (Wang et al., ICDE 2019)."""
    beta = -math.expm1(-epsilon / 2.0)
    worst = beta * float(pm_variance(epsilon, np.ones(1))[0]) + (1.0 - beta) * (duchi_bound(epsilon) ** 2 - 1.0)
    return beta if worst < duchi_bound(epsilon) ** 2 else 0.0


def hm_variance(epsilon: float, t: np.ndarray) -> np.ndarray:
    beta = hm_share(epsilon)  # both unbiased: the mixture's variance is the mixture of variances
    return beta * pm_variance(epsilon, t) + (1.0 - beta) * duchi_variance(epsilon, t)


def duchi_draw(epsilon: float, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    b = duchi_bound(epsilon)
    up = rng.random(t.shape) < 0.5 + t / (2.0 * b)
    return np.where(up, b, -b)


def pm_draw(epsilon: float, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h = math.exp(epsilon / 2.0)
    c = (h + 1.0) / (h - 1.0)
    left = (c + 1.0) / 2.0 * t - (c - 1.0) / 2.0
    right = left + c - 1.0
    inner = rng.random(t.shape) < h / (h + 1.0)
    middle = left + (right - left) * rng.random(t.shape)
    w = (c + 1.0) * rng.random(t.shape)  # the outer pieces [-c, left) and (right, c], length c + 1
    outer = np.where(w < left + c, -c + w, right + (w - (left + c)))
    return np.where(inner, middle, outer)


def hm_draw(epsilon: float, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    use_pm = rng.random(t.shape) < hm_share(epsilon)
    return np.where(use_pm, pm_draw(epsilon, t, rng), duchi_draw(epsilon, t, rng))


PEERS = {
    "duchi": (duchi_draw, duchi_variance),
    "pm": (pm_draw, pm_variance),
    "hm": (hm_draw, hm_variance),
}


def peer_cell(
    name: str, epsilon: float, values: np.ndarray, devices: np.ndarray, draws: int, rng: np.random.Generator
) -> dict[str, float]:
    draw, variance = PEERS[name]
    t = 2.0 * (values - LOW) / (HIGH - LOW) - 1.0
    n = int(devices.sum())
    reps = max(100, draws // n)
    per_device = np.repeat(t, devices)
    errors = np.array([draw(epsilon, per_device, rng).mean() for _ in range(reps)]) - per_device.mean()
    exact = float(variance(epsilon, t) @ devices) / n
    return {"n_mse": n * float(np.mean(errors**2)), "n_var": exact, "reps": reps}


# --- the levels table (docs/math.md 9.2) ----------------------------------------------------


def levels_rows() -> list[dict[str, float]]:
    """Per epsilon: Veil's levels and worst-case n x Var on [-1, 1], Duchi's, PM's and HM's."""
    rows = []
    ends = np.array([1.0])
    for epsilon in LEVEL_EPSILONS:
        levels = mean_levels(epsilon)
        rows.append(
            {
                "epsilon": epsilon,
                "levels": levels,
                "veil": 4.0 * worst_mean_variance(epsilon, levels),
                "duchi": duchi_bound(epsilon) ** 2,
                "pm": float(pm_variance(epsilon, ends)[0]),
                "hm": float(np.max(hm_variance(epsilon, np.array([0.0, 1.0])))),
            }
        )
    return rows


def crossover() -> float:
    """The epsilon (to 0.01) above which Veil's worst case is below HM's: scanned down from 8 in
    steps of 0.1 to the first epsilon where it is not, then in steps of 0.01 above it."""

    def worse(e: float) -> bool:
        return 4.0 * worst_mean_variance(e, mean_levels(e)) >= float(np.max(hm_variance(e, np.array([0.0, 1.0]))))

    coarse = next(round(8.0 - 0.1 * i, 2) for i in range(76) if worse(8.0 - 0.1 * i))
    return next(round(coarse + 0.01 * i, 2) for i in range(1, 11) if not worse(coarse + 0.01 * i))


def levels_table(rows: list[dict[str, float]], cross: float) -> str:
    lines = [
        "| epsilon | levels | Veil | Duchi / 1BitMean | PM | HM | Veil / HM |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['epsilon']:g} | {r['levels']} | {_num(r['veil'])} | {_num(r['duchi'])} | "
            f"{_num(r['pm'])} | {_num(r['hm'])} | {r['veil'] / r['hm']:.2f} |"
        )
    lines.append("")
    lines.append(f"Veil's worst case is below HM's from epsilon {cross:g} up (computed to 0.01).")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.2f}"


# --- the grid ---------------------------------------------------------------------------------


def measure(
    epsilons: tuple[float, ...],
    ns: tuple[int, ...],
    reps: int,
    quantile_reps: int,
    peer_draws: int,
    distributions: tuple[str, ...] = DISTRIBUTIONS,
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for ei, epsilon in enumerate(epsilons):
        spec, dist_spec = mean_spec(epsilon), distribution_spec(epsilon)
        for ni, n in enumerate(ns):
            for di, name in enumerate(distributions):
                started = time.perf_counter()
                rng = np.random.default_rng([SEED, ei, ni, di])
                values, devices = population(name, n)
                row: dict[str, object] = {"epsilon": epsilon, "n": n, "distribution": name}
                row["levels"] = spec.k
                row["veil"] = mean_cell(spec, values, devices, reps, rng)
                row["quantiles"] = quantile_cell(
                    dist_spec, values, devices, quantile_reps, SEED + 7919 * (ei * 100 + ni * 10 + di)
                )
                row["peers"] = {peer: peer_cell(peer, epsilon, values, devices, peer_draws, rng) for peer in PEERS}
                row["seconds"] = round(time.perf_counter() - started, 1)
                progress(f"eps {epsilon:g} n {n} {name}: {row}")
                rows.append(row)
    return rows


def crosscheck(reps: int) -> dict[str, float]:
    """One small cell (epsilon 4, uniform, n = 200) drawn both ways: the counts' means per point
    and the n x MSE of each, beside the exact n x Var."""
    spec = mean_spec(4.0)
    values, devices = population("uniform", 200)
    rng = np.random.default_rng([SEED, 99])
    fast = mean_part_counts(spec, values, devices, reps, rng)
    slow = randomized_counts(spec, values, devices, reps, rng)
    exact = exact_mean_variance(spec, values, devices)
    truth = float(values @ devices) / 200

    def n_mse(v: np.ndarray) -> float:
        got = np.array(
            [mean_estimate(spec, e).estimate for e in estimates(spec, [Counts((1,), [200], r[None, :]) for r in v])]
        )
        return 200 * float(np.mean(((got - truth) * 2.0 / (HIGH - LOW)) ** 2))

    return {
        "reps": reps,
        "n_var": exact,
        "vectorized_n_mse": n_mse(fast),
        "randomize_n_mse": n_mse(slow),
        "vectorized_counts_mean": fast.mean(axis=0).round(2).tolist(),
        "randomize_counts_mean": slow.mean(axis=0).round(2).tolist(),
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| eps | n | distribution | levels | Veil n·MSE | exact n·Var | ratio | Duchi | PM | HM | "
        "stderr / true | mean covered | q0.5 | q0.9 | q0.99 |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        veil, quant, peers = r["veil"], r["quantiles"], r["peers"]
        assert isinstance(veil, dict) and isinstance(quant, dict) and isinstance(peers, dict)
        lines.append(
            f"| {r['epsilon']:g} | {r['n']:,} | {r['distribution']} | {r['levels']} | {_num(veil['n_mse'])} | "
            f"{_num(veil['n_var'])} | {veil['ratio']:.3f} | "
            + " | ".join(f"{_num(peers[p]['n_mse'])} ({_num(peers[p]['n_var'])})" for p in PEERS)
            + f" | {veil['stderr_ratio']:.2f} | {100 * veil['coverage']:.1f}% | "
            + " | ".join(f"{100 * quant[f'coverage_q{q}']:.1f}%" for q in QUANTILES)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small grid and reps, into results/quick/")
    parser.add_argument("--reps", type=int, help=f"repetitions of the mean part per cell (default {REPS})")
    parser.add_argument("--quantile-reps", type=int, help=f"repetitions of the distribution part ({QUANTILE_REPS})")
    parser.add_argument("--no-crosscheck", action="store_true", help="skip the report-by-report cross-check")
    parser.add_argument(
        "--update-docs", action="store_true", help="put the tables into docs/math.md and bench/README.md"
    )
    parser.add_argument("--output", type=Path, help="the results file (default bench/results/numeric.json)")
    args = parser.parse_args(argv)
    if args.quick:
        epsilons, ns, reps, quantile_reps, peer_draws = (1.0, 4.0), (1_000,), 500, 100, 200_000
    else:
        epsilons, ns, reps, quantile_reps, peer_draws = EPSILONS, NS, REPS, QUANTILE_REPS, PEER_DRAWS
    reps = args.reps or reps
    quantile_reps = args.quantile_reps or quantile_reps
    output = args.output or (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR) / "numeric.json"
    started = time.perf_counter()
    levels = levels_rows()
    cross = crossover()
    rows = measure(epsilons, ns, reps, quantile_reps, peer_draws)
    check = None if args.no_crosscheck else crosscheck(50 if args.quick else 500)
    write_results(
        output,
        {
            "what": "numeric metrics: the mean's n x MSE against its exact variance and against Duchi, PM and HM; "
            "coverage of the mean's and the quantiles' 95% intervals (bench/bench_numeric.py)",
            "command": " ".join(["bench/bench_numeric.py", *(sys.argv[1:] if argv is None else argv)]),
            "design": {"range": [LOW, HIGH], "buckets": list(BUCKETS), "distribution_mechanism": "subset"},
            "reps": {"mean": reps, "quantiles": quantile_reps, "peer_draws": peer_draws},
            "seed": SEED,
            "machine": machine_info(("numpy", "numba")),
            "levels": levels,
            "veil_below_hm_from_epsilon": cross,
            "crosscheck": check,
            "rows": rows,
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    text = table(rows)
    print(levels_table(levels, cross))
    print()
    print(text)
    if check is not None:
        print()
        print(
            f"cross-check (epsilon 4, uniform, n = 200, {check['reps']} reps): n·Var {check['n_var']:.4f}, "
            f"vectorized n·MSE {check['vectorized_n_mse']:.4f}, "
            f"through KrrSpec.randomize {check['randomize_n_mse']:.4f}"
        )
    if args.update_docs:
        replace_marked(MATH_DOC, *LEVELS_MARKS, levels_table(levels, cross))
        replace_marked(README, *TABLE_MARKS, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
