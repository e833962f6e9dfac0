"""`veil estimates`: the current estimates of a running aggregator, as a table or JSON.

The JSON has the shape of the HTTP listener's GET /v1/estimates, read here over gRPC.
"""

from __future__ import annotations

import argparse
import json
import math

from ._remote import add_address_argument, call, channel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_address_argument(parser)
    parser.add_argument("metric", nargs="?", default="", help="one metric (default: all)")
    parser.add_argument("--window", default="", help="one window, e.g. total or 1h (default: all)")
    parser.add_argument("--projection", action="store_true",
                        help="also show the projection onto the simplex (a distribution, but biased)")
    parser.add_argument("--json", action="store_true", help="print JSON (the shape of GET /v1/estimates)")


def to_json(window) -> dict[str, object]:
    """A WindowEstimate message as /v1/estimates shows it (undefined numbers as null)."""
    from veil.wire.v1 import veil_pb2

    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "metric": window.metric, "window": window.window, "start": window.start_unix, "end": window.end_unix,
        "n": window.n, "mechanism": veil_pb2.Mechanism.Name(window.mechanism).lower().replace("_", "-"),
        "epsilon": window.epsilon, "spec_fingerprint": window.spec_fingerprint, "withheld": window.withheld,
        "reason": window.reason, "estimand": window.estimand, "period": window.period_seconds,
        "reports_per_device": window.reports_per_device,
        "categories": [{"label": c.label, "estimate": number(c.estimate), "stderr": number(c.stderr),
                        "lower": number(c.lower), "upper": number(c.upper), "projected": number(c.projected)}
                       for c in window.categories],
    }


def run(args: argparse.Namespace) -> int:
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    from ..live import PROJECTION_NOTE

    with channel(args) as remote:
        response = call(args, veil_pb2_grpc.EstimatesStub(remote).Get,
                        veil_pb2.EstimatesRequest(metric=args.metric, window=args.window))
    windows = [to_json(w) for w in response.estimates]
    if args.json:
        print(json.dumps({"projection": PROJECTION_NOTE, "estimates": windows}, indent=2))
        return 0
    for w in windows:
        print(f"{w['metric']} / {w['window']}  ({w['mechanism']}, epsilon = {w['epsilon']:g})  n = {w['n']:,}")
        if w["estimand"]:
            print(f"  estimates the {w['estimand']}")
        if w["withheld"]:
            print(f"  withheld: {w['reason']}\n")
            continue
        head = f"  {'category':<24}{'estimate':>10}{'stderr':>10}{'95% interval':>24}"
        print(head + (f"{'projected*':>12}" if args.projection else ""))
        for c in w["categories"]:
            line = (f"  {c['label'][:23]:<24}{c['estimate']:>10.4f}{_f(c['stderr']):>10}"
                    f"   [{c['lower']:>8.4f}, {c['upper']:>8.4f}]")
            print(line + (f"{c['projected']:>12.4f}" if args.projection else ""))
        print()
    if args.projection:
        print(f"* {PROJECTION_NOTE}")
    return 0


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
