"""`veil demo`: a simulated population reports through the real randomizers; the estimates,
with 95% intervals, converge on the hidden truth while you watch.

This runs everything in one process (randomization by the batch kernels, counting, estimating).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

_ROWS_SHOWN = 8


@dataclass(frozen=True)
class DemoMetric:
    name: str
    labels: tuple[str, ...]
    mechanism: str
    epsilon: float
    truth: tuple[float, ...]  # the hidden distribution the simulated devices draw from


def _zipf(k: int, s: float) -> tuple[float, ...]:
    weights = [1.0 / (i + 1) ** s for i in range(k)]
    total = sum(weights)
    return tuple(w / total for w in weights)


DEMO_METRICS = (
    DemoMetric("browser", ("chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "other"),
               "subset", 1.0, (0.45, 0.2, 0.12, 0.08, 0.06, 0.04, 0.03, 0.02)),
    DemoMetric("country", tuple(f"country-{i:03d}" for i in range(100)), "subset", 2.0, _zipf(100, 1.1)),
    DemoMetric("crash_site", tuple(f"screen-{i:02d}" for i in range(16)), "rappor", 2.0, _zipf(16, 0.8)),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=20, help="rounds of reports to simulate (default 20)")
    parser.add_argument("--per-round", type=int, default=50_000, metavar="N",
                        help="reports per metric per round (default 50000)")
    parser.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                        help="pause between rounds (default 0.5)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the population and use the fast seeded generator (simulation only); "
                             "default: a random population and the AES-CTR keystream")


def _render(metric: DemoMetric, estimate) -> list[str]:
    order = sorted(range(len(metric.labels)), key=lambda j: -metric.truth[j])
    covered = sum(estimate.lower[j] <= metric.truth[j] <= estimate.upper[j] for j in range(len(metric.labels)))
    lines = [
        f"{metric.name}  ({metric.mechanism}, k = {len(metric.labels)}, epsilon = {metric.epsilon:g})  "
        f"n = {estimate.n:,}  truth inside its 95% interval: {covered}/{len(metric.labels)}",
        f"  {'category':<14}{'truth':>8}{'estimate':>10}{'95% interval':>22}",
    ]
    for j in order[:_ROWS_SHOWN]:
        inside = "" if estimate.lower[j] <= metric.truth[j] <= estimate.upper[j] else "  outside"
        lines.append(
            f"  {metric.labels[j]:<14}{metric.truth[j]:>8.4f}{estimate.estimate[j]:>10.4f}"
            f"   [{estimate.lower[j]:>8.4f}, {estimate.upper[j]:>8.4f}]{inside}"
        )
    if len(order) > _ROWS_SHOWN:
        lines.append(f"  ... and {len(order) - _ROWS_SHOWN} more categories")
    return lines


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from veil.mechanism import spec_for

    from ..counts import Counts
    from ..estimate import estimate
    from ..simulate import AesCtrKeystream, FastKeystream, simulate_counts
    from . import CliError

    if args.rounds < 1 or args.per_round < 1 or args.interval < 0:
        raise CliError("--rounds and --per-round must be at least 1 and --interval at least 0.")
    population = np.random.default_rng(args.seed)
    keystream = FastKeystream(args.seed) if args.seed is not None else AesCtrKeystream()
    specs = {m.name: spec_for(m.mechanism, len(m.labels), m.epsilon) for m in DEMO_METRICS}
    counts = {name: Counts.zeros(spec) for name, spec in specs.items()}
    live = sys.stdout.isatty()
    print("Simulated devices randomize each true value on the device; only reports are counted.")
    print(f"Randomness: {'seeded fast generator (simulation only)' if args.seed is not None else 'AES-CTR keystream'}.")
    for round_number in range(1, args.rounds + 1):
        for metric in DEMO_METRICS:
            values = population.choice(len(metric.labels), size=args.per_round, p=metric.truth)
            simulate_counts(specs[metric.name], values, keystream=keystream, out=counts[metric.name])
        lines = [f"round {round_number}/{args.rounds}", ""]
        for metric in DEMO_METRICS:
            lines += _render(metric, estimate(specs[metric.name], counts[metric.name])) + [""]
        if live:
            print("\x1b[H\x1b[2J", end="")  # redraw in place on a terminal
        print("\n".join(lines), flush=True)
        if round_number < args.rounds:
            time.sleep(args.interval)
    return 0
