"""`veil demo`: the whole system on one machine.

An aggregator on the embedded SQLite store (in a temporary directory removed at exit, or
--data-dir to keep the counts; Redis with --redis), simulated devices that
report through the real SDK over gRPC, the dashboard on the HTTP listener, and a terminal table
of live estimates (read over gRPC) with their 95% intervals beside the truth. Ctrl-C stops
everything cleanly.

Each simulated device is a Reporter with the SDK's defaults (memoization on, the privacy
ledger, the metric's reporting period) and holds its own true value of each metric, drawn from a
hidden distribution; at every period's turn a few devices draw a new value. The app calls
report() again and again; what leaves the device is the metric's rule: the first report of each
period. So the estimates are of the share of devices, as the README's "What the numbers mean"
describes, and the all-time window's intervals allow for each device reporting in every period.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_ROWS_SHOWN = 6


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
    DemoMetric(
        "browser",
        ("chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "yandex", "brave", "other"),
        "subset",
        1.0,
        _zipf(10, 1.2),
    ),
    DemoMetric("country", tuple(f"country-{i:03d}" for i in range(100)), "subset", 2.0, _zipf(100, 1.1)),
    DemoMetric("crash_screen", tuple(f"screen-{i:02d}" for i in range(16)), "rappor", 2.0, _zipf(16, 0.8)),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop after this long and exit 0 (default 0: run until Ctrl-C)",
    )
    parser.add_argument(
        "--devices", type=int, default=500, help="simulated devices, each a Reporter with its own values (default 500)"
    )
    parser.add_argument(
        "--period",
        default="10s",
        metavar="DURATION",
        help="the demo metrics' reporting period: each device sends one report of each metric per "
        "period (default 10s, so that periods turn while you watch; real metrics use 1d)",
    )
    parser.add_argument(
        "--calls",
        type=float,
        default=5.0,
        metavar="N",
        help="report() calls of each metric per device and period, as an app makes them; all but "
        "the first are kept on the device (default 5)",
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.05,
        metavar="P",
        help="share of devices that draw a new value at each period's turn (default 0.05)",
    )
    parser.add_argument("--redis", metavar="URL", help="count in this Redis instead of the embedded SQLite store")
    parser.add_argument(
        "--data-dir",
        metavar="PATH",
        help="keep the SQLite store (veil.db) in this directory, and its counts across runs "
        "(default: a temporary directory, removed at exit)",
    )
    parser.add_argument(
        "--grpc",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="gRPC listener (default 127.0.0.1:50051; a free port if taken)",
    )
    parser.add_argument(
        "--http",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="HTTP listener with the dashboard (default 127.0.0.1:8080; a free port if taken)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between table refreshes (default 1)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed the hidden population's draws")


def _config(args: argparse.Namespace, store_url: str, grpc_address: str, http_address: str):
    from veil.aggregator.config import parse_config

    return parse_config(
        {
            "server": {
                "grpc": grpc_address,
                "http": http_address,
                "min_n": 100,
                "watch_interval": 0.5,
                "grace_period": 2.0,
            },
            "store": {"url": store_url},
            "metrics": [
                {
                    "name": m.name,
                    "labels": list(m.labels),
                    "mechanism": m.mechanism,
                    "epsilon": m.epsilon,
                    "period": args.period,
                    "windows": ["total", args.period, "1h"],
                }
                for m in DEMO_METRICS
            ],
        }
    )


def _start_aggregator(args: argparse.Namespace, store_url: str):
    """The aggregator on the asked-for ports, or free ones where those are taken."""
    from veil.aggregator.daemon import Aggregator
    from veil.aggregator.errors import ConfigError

    for grpc_address, http_address in ((args.grpc, args.http), ("127.0.0.1:0", "127.0.0.1:0")):
        try:
            aggregator = Aggregator(_config(args, store_url, grpc_address, http_address))
        except ConfigError as err:
            if "cannot listen" not in str(err):
                raise
            print(f"({err} Using free ports.)", file=sys.stderr)
            continue
        aggregator.start()
        return aggregator
    raise ConfigError("Cannot find free ports for the demo.")


def _devices(endpoint: str, args: argparse.Namespace, period: int, stop: threading.Event) -> threading.Thread:
    """The simulated devices, driven by one thread: every tick each device calls report() for
    each metric with the chance that makes --calls calls a period, with the value it holds."""
    from veil.client import Reporter

    rng = random.Random(args.seed)
    # The simulated devices live in one process, so gRPC gives them one HTTP/2 connection, and the
    # aggregator allows 100 streams on a connection: at a period's turn the rest are refused and
    # retried (with the same batch ids), as the SDK should. That is no news in a demo: its log
    # lines would only bury the table.
    logging.getLogger("veil.client").setLevel(logging.ERROR)
    reporters = [Reporter(endpoint, tls=False, schedule_delay_ms=250) for _ in range(args.devices)]
    values = [[_draw(rng, m) for m in DEMO_METRICS] for _ in reporters]
    tick = 0.1
    chance = min(1.0, args.calls * tick / period)

    def drive() -> None:
        try:
            for reporter in reporters:
                reporter.wait_for_specs(10)
            turn = int(time.time() // period)
            while not stop.wait(tick):
                if int(time.time() // period) != turn:  # a period's turn: some devices change
                    turn = int(time.time() // period)
                    for held in values:
                        if rng.random() < args.churn:
                            held[:] = [_draw(rng, m) for m in DEMO_METRICS]
                for reporter, held in zip(reporters, values):
                    for metric, value in zip(DEMO_METRICS, held):
                        if rng.random() < chance:
                            reporter.report(metric.name, value)
        finally:
            for reporter in reporters:
                reporter.shutdown(0.5)

    thread = threading.Thread(target=drive, name="veil-demo-devices", daemon=True)
    thread.start()
    return thread


def _draw(rng: random.Random, metric: DemoMetric) -> int:
    return rng.choices(range(len(metric.labels)), metric.truth)[0]


def render(metric: DemoMetric, window) -> tuple[list[str], int, int]:
    """The table of one metric (a WindowEstimate message), and how many categories' truths
    lie inside their 95% intervals, out of how many."""
    head = (
        f"{metric.name}  ({metric.mechanism}, k = {len(metric.labels)}, epsilon = {metric.epsilon:g})  n = {window.n:,}"
    )
    if window.withheld:
        return [head, f"  withheld: {window.reason}"], 0, 0
    inside = [c.lower <= t <= c.upper for c, t in zip(window.categories, metric.truth)]
    lines = [
        f"{head}  truth inside its 95% interval: {sum(inside)}/{len(inside)}",
        f"  estimates the {window.estimand}",
        f"  {'category':<14}{'truth':>8}{'estimate':>10}{'95% interval':>22}",
    ]
    order = sorted(range(len(metric.labels)), key=lambda j: -metric.truth[j])
    for j in order[:_ROWS_SHOWN]:
        c = window.categories[j]
        lines.append(
            f"  {c.label:<14}{metric.truth[j]:>8.4f}{c.estimate:>10.4f}   [{c.lower:>8.4f}, {c.upper:>8.4f}]"
            + ("" if inside[j] else "  outside")
        )
    if len(order) > _ROWS_SHOWN:
        lines.append(f"  ... and {len(order) - _ROWS_SHOWN} more categories")
    return lines, sum(inside), len(inside)


def run(args: argparse.Namespace) -> int:
    from veil.mechanism import MechanismError, parse_duration

    from . import CliError

    if args.calls <= 0 or args.devices < 1 or args.interval <= 0 or args.duration < 0 or not 0 <= args.churn <= 1:
        raise CliError(
            "--calls and --interval must be above 0, --devices at least 1, --duration at least 0, --churn from 0 to 1."
        )
    try:
        period = parse_duration(args.period)
    except MechanismError as err:
        raise CliError(f"--period: {err}") from None
    temporary = None
    if args.redis:
        store_url, where = args.redis, "Redis"
    else:
        directory = Path(args.data_dir or tempfile.mkdtemp(prefix="veil-demo-")).absolute()
        temporary = None if args.data_dir else directory
        store_url, where = f"sqlite://{directory.as_posix()}/veil.db", f"SQLite ({directory}/veil.db"
        where += ", removed at exit)" if temporary else ")"
    try:
        return _run(args, store_url, where, period)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _run(args: argparse.Namespace, store_url: str, where: str, period: int) -> int:
    import grpc

    from veil.aggregator.errors import StoreError
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    from . import CliError

    aggregator = _start_aggregator(args, store_url)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    if args.redis:
        try:  # at once, in one line: not an UNAVAILABLE from the first estimates read 10 s later
            aggregator.store.ping()
        except StoreError as err:
            aggregator.stop(grace=0)
            raise CliError(f"--redis: {err}.") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    devices = [_devices(endpoint, args, period, stop)]
    live = sys.stdout.isatty()
    dashboard = f"http://127.0.0.1:{aggregator.http_port}/"
    print(f"Veil demo: aggregator on {where}, gRPC {endpoint}.")
    print(f"Dashboard: {dashboard}   (JSON: /v1/estimates, Prometheus: /metrics)")
    print(
        f"{args.devices} simulated devices, each a Reporter with the SDK's defaults, call report() about "
        f"{args.calls:g} times per metric and {args.period} period; each sends one randomized report per period. "
        + ("Ctrl-C stops." if not args.duration else "")
    )
    deadline = time.monotonic() + args.duration if args.duration else None
    inside = total = 0
    try:
        with grpc.insecure_channel(endpoint) as channel:
            stub = veil_pb2_grpc.EstimatesStub(channel)
            while not stop.wait(args.interval):
                # The redrawn screen keeps where everything is (the ports may not be the defaults).
                lines = [
                    f"{time.strftime('%H:%M:%S')}  Veil demo: dashboard {dashboard}  gRPC {endpoint}"
                    + ("  (Ctrl-C stops)" if not args.duration else ""),
                    "",
                ]
                try:
                    response = stub.Get(veil_pb2.EstimatesRequest(window="total"), timeout=10)
                except grpc.RpcError as err:  # e.g. Redis went away: say so and keep going
                    lines.append(f"estimates unavailable: {err.code().name} ({err.details()})")
                    response = None
                if response is not None:
                    by_name = {w.metric: w for w in response.estimates}
                    lines.append("estimates over all reports so far")
                    inside, total = 0, 0
                    for metric in DEMO_METRICS:
                        table, hits, count = render(metric, by_name[metric.name])
                        lines += table + [""]
                        inside, total = inside + hits, total + count
                if live:
                    print("\x1b[H\x1b[2J", end="")  # redraw in place on a terminal
                print("\n".join(lines), flush=True)
                if deadline and time.monotonic() >= deadline:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for t in devices:
            t.join(timeout=5)
        aggregator.stop(grace=1.0)
    if total:
        print(f"final: {inside} of {total} categories' truths inside their 95% intervals.")
    return 0
