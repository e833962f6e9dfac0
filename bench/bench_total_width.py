"""How wide `total` is against an oracle after 6, 30, 90 and 365 daily periods under churn.

`total` pools every period since counting began. Its intervals allow for one device's c =
reports_per_device reports being alike, c = the periods with data (docs/math.md section 5):
with a fleet, every day has data, so c = the days counted. A device that reports every day,
its memoized response each time, reaches that bound; under churn (devices come and go, skip
days, change values) most report on few days, and the estimator's true spread is smaller. This
measures by how much.

The fleet: devices are installed at a steady rate (INSTALLS a day, from LIFETIME days before
counting began, so the fleet is in its steady state from day 0), each stays for a geometric
lifetime (mean LIFETIME days) and, while installed, uses the app on a day with its own
probability (Beta(1.2, 1.2): some daily, some rarely). On each day of use it sends one report
(the default rule): the response memoized for its current value, randomized once per (device,
value); its value is redrawn from the population (Zipf(1.1) over k = 8) with probability CHANGE
a day. The metric: `subset`, epsilon = 1. About 1,400 devices use the app on a given day.

Each of RUNS repetitions draws a fresh fleet and fresh randomization (seeded), counts every
report of the T days, and estimates `total` with Veil's estimator at c = T (veil.aggregator.
estimate). The oracle's standard error is the estimates' spread over the repetitions (the true
sampling SE of the estimator, fleet included); the table gives the ratio of Veil's interval
half-width to the oracle's 1.96 SE, Veil's standard error over the oracle's, and the coverage of
Veil's 95% intervals of the population's shares (their mean over categories with a share of at
least 5%). Mean reports per device ((sum c_i^2) / (sum c_i), the variance's own design effect,
beside c) says why.

Usage:  .venv/bin/python bench/bench_total_width.py [--runs R] [--update-docs]
Writes bench/results/total_width.json; --update-docs puts the table into docs/estimates.md between
its markers. Seeded: the same command gives the same table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, replace_marked, write_results
from veil_testing.data import zipf_shares

from veil.aggregator.counts import Counts
from veil.aggregator.estimate import estimate
from veil.aggregator.simulate import FastKeystream, simulate_reports
from veil.mechanism import spec_for

DAYS = (6, 30, 90, 365)
K, EPSILON = 8, 1.0
INSTALLS = 60  # devices installed a day
LIFETIME = 50  # mean days a device stays installed
CHANGE = 0.02  # chance a day that a device's value changes
RUNS = 300
SEED = 20251127
ESTIMATES_DOC = Path(__file__).resolve().parent.parent / "docs" / "estimates.md"
BEGIN, END = "<!-- bench/bench_total_width.py: begin -->", "<!-- bench/bench_total_width.py: end -->"


def fleet_counts(spec, shares: np.ndarray, days: int, rng: np.random.Generator, seed: int) -> tuple[Counts, float]:
    """The counts of every report of one fleet over `days` days, and its design effect
    (sum of c_i^2) / (sum of c_i) over (device, value) clusters of alike reports."""
    devices = INSTALLS * (days + 4 * LIFETIME)
    installed = rng.integers(-4 * LIFETIME, days, devices)
    left = installed + 1 + rng.geometric(1.0 / LIFETIME, devices)
    use = rng.beta(1.2, 1.2, devices)
    first, last = np.maximum(installed, 0), np.minimum(left, days)
    span = np.maximum(last - first, 0)
    device = np.repeat(np.arange(devices), span)  # one entry per (device, installed day in range)
    used = rng.random(device.size) < use[device]
    device = device[used]
    # Values: a new one (from the population) on a device's first day of use and on each change.
    new = np.ones(device.size, bool)
    new[1:] = (device[1:] != device[:-1]) | (rng.random(device.size - 1) < CHANGE)
    segment = np.cumsum(new) - 1
    value = rng.choice(K, int(new.sum()), p=shares)[segment]
    # A device's reports of one value share its memoized response: one cluster per (device, value).
    clusters, times = np.unique(device * K + value, return_counts=True)
    rows = simulate_reports(spec, clusters % K, keystream=FastKeystream(seed))  # (clusters, q) indexes
    v = np.bincount(rows.ravel().astype(np.int64), weights=np.repeat(times, rows.shape[1]), minlength=K)
    n = int(times.sum())
    counts = Counts(spec.weight_law().weights, np.array([n]), v.astype(np.int64)[None, :])
    by_device = np.bincount(device, minlength=devices)
    return counts, float((by_device.astype(np.float64) ** 2).sum() / by_device.sum())


def measure(runs: int) -> list[dict]:
    spec = spec_for("subset", K, EPSILON)
    shares = zipf_shares(K, 1.1)
    shown = shares >= 0.05
    rows = []
    for days in DAYS:
        started = time.perf_counter()
        rng = np.random.default_rng([SEED, days])
        estimates, stderrs, halves, covered, effects, ns = [], [], [], [], [], []
        for run in range(runs):
            counts, effect = fleet_counts(spec, shares, days, rng, seed=SEED * 1000 + days * 10_000 + run)
            e = estimate(spec, counts, reports_per_device=days)
            estimates.append(e.estimate)
            stderrs.append(e.stderr)
            halves.append((e.upper - e.lower) / 2)
            covered.append((e.lower <= shares) & (shares <= e.upper))
            effects.append(effect)
            ns.append(counts.total)
        oracle = np.std(estimates, axis=0, ddof=1)
        oracle_covered = np.abs(np.array(estimates) - shares) <= 1.96 * oracle
        row = {
            "days": days,
            "runs": runs,
            "reports": round(float(np.mean(ns))),
            "c": days,
            "design_effect": round(float(np.mean(effects)), 2),
            "width_ratio": round(float(np.mean(np.mean(halves, axis=0)[shown] / (1.96 * oracle[shown]))), 2),
            "stderr_ratio": round(float(np.mean(np.mean(stderrs, axis=0)[shown] / oracle[shown])), 2),
            "coverage": round(float(np.mean(np.array(covered)[:, shown])), 4),
            "oracle_coverage": round(float(np.mean(oracle_covered[:, shown])), 4),
            "seconds": round(time.perf_counter() - started, 1),
        }
        progress(f"{days} days: {row}")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| daily periods | reports (mean) | c | reports per device, sum c_i² / sum c_i | "
        "interval width / oracle's | coverage |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['days']} | {r['reports']:,} | {r['c']} | {r['design_effect']:.1f} | "
            f"{r['width_ratio']:.2f}x | {100 * r['coverage']:.1f}% |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="repetitions per number of days")
    parser.add_argument("--update-docs", action="store_true", help="put the table into docs/estimates.md")
    args = parser.parse_args()
    rows = measure(args.runs)
    write_results(
        RESULTS_DIR / "total_width.json",
        {
            "what": "width of total's 95% intervals against an oracle under churn (bench/bench_total_width.py)",
            "command": " ".join(["bench/bench_total_width.py", *sys.argv[1:]]),
            "design": {"mechanism": "subset", "k": K, "epsilon": EPSILON, "population": "Zipf(1.1)"},
            "fleet": {"installs_per_day": INSTALLS, "mean_lifetime_days": LIFETIME, "value_change_per_day": CHANGE},
            "seed": SEED,
            "machine": machine_info(("numpy", "numba")),
            "rows": rows,
        },
    )
    text = table(rows)
    print(text)
    if args.update_docs:
        replace_marked(ESTIMATES_DOC, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
