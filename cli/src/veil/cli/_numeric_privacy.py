"""`veil privacy --range LOW,HIGH ...`: what a numeric metric costs (docs/math.md 9).

A numeric metric's parts are metrics of categories, each with its share of the metric's epsilon
(veil.mechanism.numeric_parts, as the aggregator's config makes them). Both keep a memoized
response per category: a device whose value stays put (same rounding point, same bucket) sends
its memoized responses again and spends nothing new, so a steady value costs the metric's
epsilon once. Each new point or bucket a device's value reaches costs that part's epsilon once,
so without a lifetime budget the most a device can spend on the metric in its lifetime is
levels x epsilon_mean + buckets x epsilon_distribution.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from typing import Any

from veil.mechanism import (
    DEFAULT_MEAN_SHARE,
    DEFAULT_MECHANISM,
    DISTRIBUTION,
    MEAN,
    NumericSpec,
    number_text,
    numeric_parts,
    spec_for,
    worst_mean_variance,
)

from . import CliError

__all__ = ["add_numeric_arguments", "run_numeric"]

_SIZES = (10**4, 10**6)  # n at which the mean's 95% half-width is shown


def add_numeric_arguments(parser: argparse.ArgumentParser) -> None:
    numeric = parser.add_argument_group("a numeric metric (instead of --k)")
    numeric.add_argument("--range", metavar="LOW,HIGH", help="the metric's range, e.g. 0,10000")
    numeric.add_argument("--buckets", default="", metavar="B1,B2,...", help="bucket boundaries, e.g. 100,250,500")
    numeric.add_argument(
        "--estimate",
        default="",
        metavar="PARTS",
        help="mean, distribution or both (default: the mean, and the distribution when buckets are given)",
    )
    numeric.add_argument(
        "--mean-share", type=float, default=None, help=f"with both: the mean's share of epsilon ({DEFAULT_MEAN_SHARE})"
    )


def _numbers(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name}: expected numbers separated by commas, got {text!r}.") from None
    if not all(math.isfinite(x) for x in values):
        raise CliError(f"{name}: expected finite numbers, got {text!r}.")
    return values


def parts(args: argparse.Namespace) -> list[tuple[NumericSpec, float]]:
    """The metric's parts with their shares of epsilon, as the aggregator's config makes them;
    CliError (or MechanismError) with one sentence for what cannot be."""
    bounds = _numbers(args.range, "--range")
    if len(bounds) != 2:
        raise CliError(f"--range: expected LOW,HIGH, got {args.range!r}.")
    buckets = _numbers(args.buckets, "--buckets")
    wanted = [x.strip() for x in args.estimate.split(",") if x.strip()] or ([MEAN, DISTRIBUTION] if buckets else [MEAN])
    if not set(wanted) <= {MEAN, DISTRIBUTION} or len(set(wanted)) != len(wanted):
        raise CliError(f"--estimate: expected mean, distribution or both, got {args.estimate!r}.")
    if DISTRIBUTION in wanted and not buckets:
        raise CliError("--buckets: the distribution needs bucket boundaries, e.g. 100,250,500,1000.")
    share = DEFAULT_MEAN_SHARE if args.mean_share is None else args.mean_share
    if len(wanted) == 2 and not 0 < share < 1:
        raise CliError(f"--mean-share: expected a share above 0 and below 1, got {share!r}.")
    low, high = bounds
    return numeric_parts("metric", low, high, tuple(buckets), tuple(wanted), args.epsilon, share)


def describe(args: argparse.Namespace) -> dict[str, Any]:
    """The stable keys of `veil privacy --range ... --json`."""
    rows = []
    found = parts(args)
    for numeric, share in found:
        epsilon = share * args.epsilon
        row: dict[str, Any] = {
            "part": numeric.part,
            "share": share,
            "epsilon": epsilon,
            "k": numeric.k,
            "labels": list(numeric.labels),
            "worst_lifetime_epsilon": numeric.k * epsilon,
        }
        if numeric.part == MEAN:
            # n * Var of the mean in the metric's units squared, at its worst value.
            worst = worst_mean_variance(epsilon, numeric.levels) * (numeric.high - numeric.low) ** 2
            row.update(mechanism="krr", levels=numeric.levels, mean_worst_n_variance=worst)
            row["mean_half_width_95"] = {str(n): 1.96 * math.sqrt(worst / n) for n in _SIZES}
        else:
            mechanism = spec_for(args.mechanism or DEFAULT_MECHANISM, numeric.k, epsilon)
            row.update(mechanism=mechanism.name, boundaries=list(numeric.boundaries), risk_worst=mechanism.risk_worst())
        rows.append(row)
    return {
        "low": found[0][0].low,
        "high": found[0][0].high,
        "epsilon": args.epsilon,
        "parts": rows,
        "steady_epsilon": sum(r["epsilon"] for r in rows),
        "worst_lifetime_epsilon": sum(r["worst_lifetime_epsilon"] for r in rows),
    }


def run_numeric(args: argparse.Namespace) -> int:
    report = describe(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    low, high = number_text(report["low"]), number_text(report["high"])
    print(f"numeric metric, range [{low}, {high}], epsilon = {args.epsilon:g} per report (its parts together)\n")
    for row in report["parts"]:
        print(f"<metric>.{row['part']}: epsilon {row['epsilon']:g} ({row['share']:g} of it), {row['mechanism']}")
        if row["part"] == MEAN:
            print(f"  {row['k']} rounding points: {', '.join(row['labels'])}")
            widths = ", ".join(
                f"+-{number_text(float(f'{w:.4g}'))} at n = {int(n):,}" for n, w in row["mean_half_width_95"].items()
            )
            print(f"  the mean's 95% interval at worst: {widths}")
        else:
            print(f"  {row['k']} buckets: {' '.join(row['labels'])}")
            print(
                f"  n*risk of the bucket shares at worst: {row['risk_worst']:.4g} "
                "(the quantiles follow from their cumulative shares)"
            )
        print(f"  at most {row['k']} x {row['epsilon']:g} = {row['worst_lifetime_epsilon']:g} over a device's lifetime")
    terms = " + ".join(f"{r['k']} x {r['epsilon']:g}" for r in report["parts"])
    print()
    for paragraph in (
        f"A steady value costs epsilon {report['steady_epsilon']:g} once: a device whose value keeps its rounding "
        "point and bucket resends its memoized responses and spends nothing new (alpha-point rounding).",
        f"Without a lifetime budget, a device whose value reaches every point and bucket spends at most "
        f"{terms} = {report['worst_lifetime_epsilon']:g} in its lifetime; lifetime_budget caps it.",
    ):
        print(textwrap.fill(paragraph, 100))
    return 0
