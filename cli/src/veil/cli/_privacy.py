"""`veil privacy`: the cost and guarantee of every mechanism at one k and epsilon, or what a
numeric metric costs (--range: _numeric_privacy)."""

from __future__ import annotations

import argparse
import json
import math
from typing import TypedDict

from veil.mechanism import EPSILON_RANGE, MECHANISMS, MechanismSpec, epsilon_to_gamma, posterior_bounds, spec_for

from . import CliError
from ._numeric_privacy import add_numeric_arguments, run_numeric

PRIORS = (0.01, 0.1, 0.5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, help="number of categories (at least 2)")
    parser.add_argument(
        "--epsilon",
        type=float,
        required=True,
        help=f"privacy level of one report (from {EPSILON_RANGE[0]:g} to {EPSILON_RANGE[1]:g})",
    )
    parser.add_argument(
        "--mechanism", choices=MECHANISMS, help="one mechanism only (default: every mechanism that applies to k)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_numeric_arguments(parser)
    parser.epilog = (
        "n*risk is n times the sum over categories of the minimax estimator's variance: divide by "
        "the number of reports n for the expected squared error. Every mechanism here treats "
        "categories alike, so the worst case is the uniform distribution. The posterior bound is "
        "the most an observer of one report can come to believe a property of a person that they "
        "believed with the given prior."
    )


class MechanismRow(TypedDict):
    """One mechanism's row of `veil privacy` (the keys of --json)."""

    name: str
    q: int | None
    outputs: int
    parity: float
    admissible: bool
    parity_equals_gamma: bool
    risk_uniform: float
    risk_worst: float
    posterior_upper: dict[str, float]  # by prior, as text


def describe(spec: MechanismSpec) -> MechanismRow:
    """One mechanism's row, with the stable keys of `veil privacy --json`."""
    return {
        "name": spec.name,
        "q": spec.q,
        "outputs": spec.outputs,
        "parity": spec.parity,
        "admissible": spec.admissible,
        "parity_equals_gamma": math.isclose(spec.parity, spec.gamma, rel_tol=1e-9),
        "risk_uniform": spec.risk_uniform(),
        "risk_worst": spec.risk_worst(),
        "posterior_upper": {str(a): posterior_bounds(spec.parity, a)[1] for a in PRIORS},
    }


def _size(count: int) -> str:
    if count < 10**12:
        return f"{count:,}"
    return f"~10^{math.log10(count):.0f}"  # log10 takes arbitrarily large ints


def run(args: argparse.Namespace) -> int:
    if args.range is not None:
        return run_numeric(args)
    if args.k is None:
        raise CliError("--k: the number of categories is needed (or --range for a numeric metric).")
    names = [args.mechanism] if args.mechanism else [m for m in MECHANISMS if m != "warner" or args.k == 2]
    # spec_for checks k and epsilon (the range every spec accepts) before anything is printed.
    rows = [describe(spec_for(name, args.k, args.epsilon)) for name in names]
    gamma = epsilon_to_gamma(args.epsilon)
    if args.json:
        print(json.dumps({"k": args.k, "epsilon": args.epsilon, "gamma": gamma, "mechanisms": rows}, indent=2))
        return 0
    print(f"k = {args.k}, epsilon = {args.epsilon:g}, gamma = e^epsilon = {gamma:.6g}\n")
    head = ["mechanism", "q", "outputs", "parity", "n*risk uniform", "n*risk worst"]
    head += [f"posterior<= @{a:g}" for a in PRIORS]
    table = [head]
    for row in rows:
        parity = f"{row['parity']:.6g}" + (" =gamma" if row["parity_equals_gamma"] and row["admissible"] else "")
        table.append(
            [
                row["name"] + ("" if row["admissible"] else " (not admissible)"),
                "-" if row["q"] is None else str(row["q"]),
                _size(row["outputs"]),
                parity,
                f"{row['risk_uniform']:.4g}",
                f"{row['risk_worst']:.4g}",
                *(f"{row['posterior_upper'][str(a)]:.4f}" for a in PRIORS),
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))
    best = min(rows, key=lambda r: r["risk_worst"])
    print(f"\nLowest worst-case risk: {best['name']}. Expected squared error with n reports = n*risk / n.")
    if args.k != 2 and not args.mechanism:
        print("warner applies to k = 2 only.")
    return 0
