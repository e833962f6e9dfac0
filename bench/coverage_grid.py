"""Coverage of the 95% intervals over the grid of the device-guarantees issue, by simulation.

Every mechanism (Warner at k = 2 only) x k in {2, 16, 128, 1024} x epsilon in {0.1, 1, 4, 8} x
n in {200, 1000, 10^5}: R runs of n values drawn from a Zipf(1.1) population over the k
categories (so rare categories are in every cell), randomized and counted by the numba kernels
on a seeded keystream, estimated by veil.aggregator.estimate; a cell's coverage is the share of
(run, category) intervals holding the true share, and beside it the mean squared z-score
((estimate - truth) / stderr)^2. Runs are independent reports (reports_per_device = 1): the
repeated-report case is the population test's (tests/aggregator/test_device_population.py).

Within a run the k estimates are tied (they sum to about 1), so a cell counts R (k - 1)
independent-ish trials; R is chosen so that every cell has at least 2,000 (k = 2: R = 2,000).

Usage:  .venv/bin/python bench/coverage_grid.py [--runs R] [--update-docs] [--from-results]
Writes bench/results/coverage.json; --update-docs puts the table into docs/estimates.md between the
markers of the "What the numbers mean" section. Seeded: the same command gives the same table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, replace_marked, write_results
from veil_testing.data import zipf_shares

MECHANISMS = ("subset", "krr", "warner", "rappor", "rappor-admissible")
KS = (2, 16, 128, 1024)
EPSILONS = (0.1, 1.0, 4.0, 8.0)
NS = (200, 1000, 100_000)
TRIALS = 2_000  # (k - 1) * runs per cell, at least
ESTIMATES_DOC = Path(__file__).resolve().parent.parent / "docs" / "estimates.md"
BEGIN, END = "<!-- bench/coverage_grid.py: begin -->", "<!-- bench/coverage_grid.py: end -->"


def cell(mechanism: str, k: int, epsilon: float, n: int, runs: int, seed: int) -> dict:
    from veil.aggregator._keystream import FastKeystream
    from veil.aggregator.estimate import estimate
    from veil.aggregator.simulate import simulate_counts
    from veil.mechanism import spec_for

    spec = spec_for(mechanism, k, epsilon)
    pi = zipf_shares(k, 1.1)
    rng = np.random.default_rng(seed)
    covered = 0
    z2 = 0.0
    for _ in range(runs):
        values = np.repeat(np.arange(k), rng.multinomial(n, pi))
        counts = simulate_counts(spec, values, keystream=FastKeystream(int(rng.integers(2**63))))
        result = estimate(spec, counts)
        covered += int(np.sum((result.lower <= pi) & (pi <= result.upper)))
        z2 += float(np.sum(((result.estimate - pi) / result.stderr) ** 2))
    return {
        "mechanism": mechanism,
        "k": k,
        "epsilon": epsilon,
        "n": n,
        "runs": runs,
        "intervals": runs * k,
        "coverage": covered / (runs * k),
        "mean_z2": z2 / (runs * k),
    }


def runs_for(k: int, n: int, base: int) -> int:
    runs = max(base, math.ceil(TRIALS / (k - 1)))
    if n >= 100_000 and k >= 1024:  # the costliest cells: the trials bound alone
        runs = math.ceil(TRIALS / (k - 1))
    return runs


def markdown(cells: list[dict]) -> str:
    columns = [(e, n) for e in EPSILONS for n in NS]
    head = "| mechanism | k | " + " | ".join(f"eps {e:g}, n {n:,}" for e, n in columns) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(columns)]
    by_key = {(c["mechanism"], c["k"], c["epsilon"], c["n"]): c for c in cells}
    for mechanism in MECHANISMS:
        for k in KS:
            if (mechanism, k, EPSILONS[0], NS[0]) not in by_key:
                continue
            row = [f"{100 * by_key[mechanism, k, e, n]['coverage']:.1f}" for e, n in columns]
            lines.append(f"| {mechanism} | {k} | " + " | ".join(row) + " |")
    worst = min(cells, key=lambda c: c["coverage"])
    z2 = [c["mean_z2"] for c in cells]
    lines += [
        "",
        f"Coverage in percent, {len(cells)} cells, at least {TRIALS:,} trials each (`bench/results/"
        f"coverage.json` has runs, intervals and the mean squared z-score of every cell). Lowest: "
        f"{100 * worst['coverage']:.1f}% ({worst['mechanism']}, k = {worst['k']}, epsilon = "
        f"{worst['epsilon']:g}, n = {worst['n']:,}); cells below 93%: "
        f"{sum(c['coverage'] < 0.93 for c in cells)}. Mean squared z-scores, with the standard error at "
        f"the estimate: {min(z2):.2f} to {max(z2):.2f}; near 1 wherever counts are large, far from it where a "
        f"category's reports number a handful (k-RR at epsilon = 8 and n = 200, say): there one point's "
        f"standard error says little, and the score interval is the one to read.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per cell, at least (default 100)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--update-docs", action="store_true", help="put the table into docs/estimates.md")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "coverage.json")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="print (and --update-docs) the table of the results on disk, without simulating",
    )
    args = parser.parse_args()
    if args.from_results:
        table = markdown(json.loads(args.output.read_text())["cells"])
        print(table)
        if args.update_docs:
            replace_marked(ESTIMATES_DOC, BEGIN, END, table)
        return 0
    started = time.monotonic()
    cells = []
    for i, (mechanism, k, epsilon, n) in enumerate(
        (m, k, e, n) for m in MECHANISMS for k in KS for e in EPSILONS for n in NS if m != "warner" or k == 2
    ):
        result = cell(mechanism, k, epsilon, n, runs_for(k, n, args.runs), args.seed * 100_003 + i)
        cells.append(result)
        progress(
            f"  {mechanism:18} k={k:<5} eps={epsilon:<4g} n={n:<7} coverage {100 * result['coverage']:5.1f}% "
            f"mean z^2 {result['mean_z2']:.3f}  ({time.monotonic() - started:.0f} s)"
        )
    write_results(
        args.output,
        {
            "benchmark": "coverage",
            "command": " ".join(sys.argv),
            "machine": machine_info(()),
            "settings": {"runs": args.runs, "seed": args.seed, "trials": TRIALS, "population": "zipf:1.1"},
            "cells": cells,
        },
    )
    table = markdown(cells)
    print(table)
    if args.update_docs:
        replace_marked(ESTIMATES_DOC, BEGIN, END, table)
        progress("updated docs/estimates.md")
    return 0 if all(c["coverage"] >= 0.93 for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
