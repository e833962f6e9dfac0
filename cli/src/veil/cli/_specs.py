"""`veil specs`: the metric specs a running aggregator serves."""

from __future__ import annotations

import argparse
import json

from ._remote import add_address_argument, address, call, channel, text_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_address_argument(parser)
    parser.add_argument("metrics", nargs="*", metavar="METRIC", help="only these metrics (default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from veil.client import spec_from_proto
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    from . import CliError

    wanted = [text_argument(m, "METRIC") for m in args.metrics]
    with channel(args) as remote:
        response = call(
            args, veil_pb2_grpc.CollectorStub(remote).GetMetricSpecs, veil_pb2.GetMetricSpecsRequest(metrics=wanted)
        )
    missing = sorted(set(wanted) - {s.name for s in response.specs})
    if missing:
        raise CliError(
            f"The aggregator at {address(args)} declares no metric "
            f"{', '.join(repr(m) for m in missing)} (or this token may not see it)."
        )
    specs = [spec_from_proto(s) for s in response.specs]
    rows = [
        {
            "name": s.name,
            "mechanism": s.mechanism.name,
            "k": s.k,
            "epsilon": s.mechanism.epsilon,
            "q": s.mechanism.q,
            "fingerprint": s.fingerprint,
            "labels": list(s.labels),
        }
        for s in specs
    ]
    if args.json:
        print(json.dumps({"specs": rows}, indent=2))
        return 0
    print(f"{'metric':<20}{'mechanism':<19}{'k':>6}{'epsilon':>9}{'q':>6}  fingerprint")
    for r in rows:
        q = "-" if r["q"] is None else r["q"]
        print(f"{r['name']:<20}{r['mechanism']:<19}{r['k']:>6}{r['epsilon']:>9g}{q:>6}  {r['fingerprint']}")
    return 0
