"""Aggregator ingest throughput and estimate-read latency, on the memory, SQLite and Redis stores.

Ingest: subset-mechanism reports are uploaded through real gRPC over loopback into an aggregator
running as a separate process (the daemon's own Aggregator class, config file and logging, as
`python -m veil.aggregator --config FILE` runs it; more under --help), for every cell
k in {16, 128, 1024} x epsilon in {1, 4}, on three stores: the in-process memory store, SQLite (a
file in a temporary directory on the disk of --sqlite-dir, every commit fsynced) and a real
redis-server this benchmark starts (no persistence). Two load shapes:

  large   1000-report uploads, 16 calls in flight  (busy clients; with 4 in flight a Redis
          script's ~5-8 ms at k = 1024 bounds throughput, since a group holds at most 4 batches)
  small   10-report uploads, 64 calls in flight    (many small clients)

The load generator runs in separate processes (--load-processes, default 2), each a grpc.aio
event loop with one channel (its own HTTP/2 connection) per in-flight call, sending uploads that
were randomized (seeded FastKeystream, simulation only), packed and serialized before the clock
starts; each run gets fresh 16-byte batch ids. A generic unary-unary call sends the serialized
bytes as they are (no message objects on the timed path). Throughput is all reports acknowledged
divided by the wall time from the first process's start to the last one's end; CPU use of the
aggregator, redis-server and the load processes over the same interval is recorded beside it.

Exactness: after every run, including warm-up and sizing runs, the store is read back (Redis
directly, the memory and SQLite stores through the aggregator) and every window of the metric must hold
exactly n = the reports sent, and per category V = the sum of count_reports over the sent
batches' own report arrays. A mismatch, a refused upload or a duplicate makes the exit status 1.

Latency: Estimates.Get over gRPC and GET /v1/estimates/{metric} over HTTP, one call at a time,
for the largest k (3 windows: total, 1h, 1d, all holding counts), every store; median and p99.
"cached" calls find the counts unchanged since the last call; "fresh" calls each follow an
(untimed) upload, so the aggregator reads the counts and recomputes three estimates first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from _aggregator import (
    CALL_TIMEOUT,
    MECHANISM,
    WINDOWS,
    AggregatorProcess,
    config_dict,
    http_get,
    labels,
    metric_name,
)
from _goals import LARGE_1024_GOAL, SMALL_UPLOADS_GOAL  # for information only: a benchmark never fails on a time
from _load import GRAIN, SHAPES, UPLOAD_PATH, ZIPF_EXPONENT, Ledger, LoadProcesses, ReportPool, run_once
from veil_testing.benchlib import RESULTS_DIR, machine_info, median, progress, write_results
from veil_testing.redis_server import RedisServer

KS = (16, 128, 1024)
EPSILONS = (1.0, 4.0)
STORES = ("memory", "sqlite", "redis")

GET_PATH = "/veil.wire.v1.Estimates/Get"


# --- ingest ---------------------------------------------------------------------------------


def measure_cell(
    k: int,
    epsilon: float,
    load: LoadProcesses,
    aggregators: dict[str, AggregatorProcess],
    ledger: Ledger,
    args: argparse.Namespace,
    tag: str,
) -> dict[str, Any]:
    metric = metric_name(k, epsilon)
    watches = {store: {"aggregator": a.pids, "redis": a.redis_pid} for store, a in aggregators.items()}
    combos = [(store, args.shape_table[shape]) for shape in args.shapes for store in aggregators]
    load.command("cell", {"k": k, "epsilon": epsilon, "seed": args.seed})
    processes = len(load.pipes)

    sizes: dict[tuple[str, str], int] = {}
    pilots: dict[tuple[str, str], dict[str, Any]] = {}
    if args.quick:
        sizes = {(store, shape.name): shape.quick for store, shape in combos}
    else:
        made = load.command("extend", max(s.pilot for s in SHAPES.values()))
        progress(
            f"{tag} randomized {made[0]['size'] * processes} reports in {made[0]['seconds']:.1f}s (untimed); "
            "warm-up and sizing runs"
        )
        for store, shape in combos:
            # Warm-up: the first uploads of a layout may compile a kernel in the aggregator.
            run_once(load, aggregators[store], shape, metric, GRAIN, watches[store], ledger)
            pilot = run_once(load, aggregators[store], shape, metric, shape.pilot, watches[store], ledger)
            pilots[store, shape.name] = pilot
            wanted = pilot["reports_per_second"] * args.seconds / processes
            low, high = shape.bounds
            sizes[store, shape.name] = int(min(high, max(low, -(-wanted // GRAIN) * GRAIN)))
    made = load.command("extend", max(sizes.values()))
    progress(
        f"{tag} pool of {made[0]['size'] * processes} reports ready ({made[0]['seconds']:.1f}s, untimed); "
        f"encoding checked against encode_batch for batches of {made[0]['encoding_checked']}"
    )

    samples: dict[tuple[str, str], list[dict[str, Any]]] = {(store, shape.name): [] for store, shape in combos}
    for round_index in range(args.rounds):
        shift = round_index % len(combos)
        for store, shape in combos[shift:] + combos[:shift]:
            result = run_once(load, aggregators[store], shape, metric, sizes[store, shape.name], watches[store], ledger)
            samples[store, shape.name].append(result)
        summary = ", ".join(
            f"{store} {shape.name} {si(samples[store, shape.name][-1]['reports_per_second'])}/s"
            f"{'' if samples[store, shape.name][-1]['exact'] else ' COUNTS WRONG'}"
            for store, shape in combos
        )
        progress(f"{tag} round {round_index + 1}/{args.rounds}: {summary}")

    rows: dict[str, dict[str, Any]] = {}
    for store, shape in combos:
        runs = samples[store, shape.name]
        seconds = [r["seconds"] for r in runs]
        middle = median(seconds)
        reports, uploads = runs[0]["reports"], runs[0]["uploads"]
        rows.setdefault(store, {})[shape.name] = {
            "batch": shape.batch,
            "in_flight": shape.in_flight,
            "load_processes": processes,
            "reports_per_run": reports,
            "uploads_per_run": uploads,
            "seconds": seconds,
            "median_seconds": middle,
            "spread": (max(seconds) - min(seconds)) / middle,
            "reports_per_second": reports / middle,
            "uploads_per_second": uploads / middle,
            # CPU cores busy, median over the rounds: "aggregator", "redis" (redis store) and "load".
            "cpu_cores": {name: statistics.median(r["cpu"][name] for r in runs) for name in runs[0]["cpu"]},
            "exact": all(r["exact"] for r in runs),  # the measured runs; warm-up and sizing runs are checked too
            "sizing_reports_per_second": pilots[store, shape.name]["reports_per_second"] if pilots else None,
        }
    return {"k": k, "epsilon": epsilon, "metric": metric, "stores": rows}


# --- estimate latency -----------------------------------------------------------------------


def measure_latency(
    k: int, epsilon: float, aggregators: dict[str, AggregatorProcess], ledger: Ledger, args: argparse.Namespace
) -> dict[str, Any]:
    """Estimates.Get and GET /v1/estimates/{metric}, one call at a time, interleaved over
    stores and protocols; "cached" then "fresh" (an untimed 10-report upload before each call)."""
    import grpc

    from veil.wire.v1 import veil_pb2

    metric = metric_name(k, epsilon)
    fresh_calls = args.fresh_calls
    # The benchmark's own reports: a 1000-report upload first, so that every window's current
    # bucket holds counts, then one 10-report upload before each fresh call (two protocols),
    # and the rest of the last GRAIN block afterwards, so the ledger's prefix counts apply.
    pool = ReportPool(k, epsilon, args.seed, stream=1_000_000)
    total = 1000 + -(-10 * fresh_calls * 2 // GRAIN) * GRAIN
    pool.extend(total)
    channels = {store: grpc.insecure_channel(a.endpoint) for store, a in aggregators.items()}
    try:
        gets = {
            store: channel.unary_unary(GET_PATH, request_serializer=None, response_deserializer=None)
            for store, channel in channels.items()
        }
        upload_calls = {
            store: channel.unary_unary(
                UPLOAD_PATH, request_serializer=None, response_deserializer=veil_pb2.UploadResponse.FromString
            )
            for store, channel in channels.items()
        }
        fresh_uploads = {}
        for store in aggregators:
            first = pool.uploads(1000, 1000)
            upload_calls[store](first[0], timeout=CALL_TIMEOUT)
            fresh_uploads[store] = iter(pool.uploads(10, total)[100:])
        request = veil_pb2.EstimatesRequest(metric=metric).SerializeToString()
        path = f"/v1/estimates/{metric}"

        def call(store: str, protocol: str) -> bytes:
            if protocol == "gRPC":
                return gets[store](request, timeout=CALL_TIMEOUT)
            status, body = http_get(aggregators[store].http_port, path)
            if status != 200:
                raise RuntimeError(f"GET {path} on the {store} aggregator answered {status}")
            return body

        contenders = [(store, protocol) for store in aggregators for protocol in ("gRPC", "HTTP")]
        results: dict[str, Any] = {}
        for mode, calls in (("cached", args.latency_calls), ("fresh", fresh_calls)):
            if not calls:
                continue
            samples: dict[tuple[str, str], list[int]] = {c: [] for c in contenders}
            last: dict[tuple[str, str], bytes] = {}
            for contender in contenders:  # warm-up, untimed
                for _ in range(3 if mode == "cached" else 0):
                    call(*contender)
            rounds = 4
            for round_index in range(rounds):
                shift = round_index % len(contenders)
                for store, protocol in contenders[shift:] + contenders[:shift]:
                    share = calls // rounds + (1 if round_index < calls % rounds else 0)
                    gc.collect()
                    gc.disable()
                    try:
                        for _ in range(share):
                            if mode == "fresh":
                                upload_calls[store](next(fresh_uploads[store]), timeout=CALL_TIMEOUT)
                            started = time.perf_counter_ns()
                            body = call(store, protocol)
                            samples[store, protocol].append(time.perf_counter_ns() - started)
                    finally:
                        gc.enable()
                    if share:
                        last[store, protocol] = body
            for store, protocol in contenders:
                ns = np.asarray(samples[store, protocol], np.float64) / 1e6
                results.setdefault(store, {}).setdefault(protocol, {})[mode] = {
                    "calls": len(ns),
                    "median_ms": float(np.median(ns)),
                    "p99_ms": float(np.percentile(ns, 99)),
                    "mean_ms": float(ns.mean()),
                    "response_bytes": len(last[store, protocol]),
                    "sanity": latency_sanity(protocol, last[store, protocol], k),
                }
        for store in aggregators:
            for upload in fresh_uploads[store]:  # the rest of the last block, untimed
                upload_calls[store](upload, timeout=CALL_TIMEOUT)
            ledger.add(store, metric, *pool.counts(total))
    finally:
        for channel in channels.values():
            channel.close()
    return {
        "k": k,
        "epsilon": epsilon,
        "metric": metric,
        "windows": list(WINDOWS),
        "path": f"/v1/estimates/{metric}",
        "results": results,
    }


def latency_sanity(protocol: str, body: bytes, k: int) -> dict[str, Any]:
    """The last response names every window, none withheld, with k finite estimates each."""
    from veil.wire.v1 import veil_pb2

    if protocol == "gRPC":
        estimates = veil_pb2.EstimatesResponse.FromString(body).estimates
        windows = [(e.window, e.n, e.withheld, [c.estimate for c in e.categories]) for e in estimates]
    else:
        estimates = json.loads(body)["estimates"]
        windows = [(e["window"], e["n"], e["withheld"], [c["estimate"] for c in e["categories"]]) for e in estimates]
    ok = [w[0] for w in windows] == list(WINDOWS) and all(
        not withheld and len(values) == k and all(v is not None and np.isfinite(v) for v in values)
        for _, _, withheld, values in windows
    )
    return {"ok": bool(ok), "n": {w[0]: w[1] for w in windows}}


# --- reporting ------------------------------------------------------------------------------


def si(rate: float | None) -> str:
    if rate is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix}"
    return f"{rate:.3g}"


def cores(value: float | None) -> str:
    return f"{'-':>5}" if value is None else f"{value:>5.2f}"


def print_tables(results: dict[str, Any]) -> None:
    machine, settings = results["machine"], results["settings"]
    if settings["quick"]:
        print("QUICK SMOKE RUN: tiny runs; the rates below mean nothing (the exact-count checks do).")
    print(
        f"Ingest through gRPC over loopback into an aggregator subprocess, {MECHANISM} mechanism, windows "
        f"{', '.join(WINDOWS)}; {machine['cpus_usable']} CPUs ({machine['cpu_model'] or machine['processor']}), "
        f"{machine['date']}."
    )
    print(
        f"Load: {settings['load_processes']} grpc.aio processes, one channel per in-flight call, pre-serialized "
        f"uploads; median of {settings['rounds']} interleaved rounds. cpu = cores busy in the aggregator "
        "(agg), redis-server (rds) and the load processes (ld)."
    )
    print(f"Aggregator processes per store: {settings['aggregator_processes']} (agg cpu sums them all).")
    shapes = [replace(SHAPES[name], in_flight=shape["in_flight"]) for name, shape in settings["shapes"].items()]
    head = " | ".join(f"{s.describe():^45}" for s in shapes)
    print()
    print(f"{'':>5} {'':>4} {'':<7}| {head} | counts")
    sub = " | ".join(f"{'reports/s':>10} {'uploads/s':>10} {'agg':>5} {'rds':>5} {'ld':>5} {'sprd':>4}" for _ in shapes)
    print(f"{'k':>5} {'eps':>4} {'store':<7}| {sub} |")
    for cell in results["ingest"]:
        for store, rows in cell["stores"].items():
            parts = []
            for shape in shapes:
                row = rows[shape.name]
                cpu = row["cpu_cores"]
                parts.append(
                    f"{si(row['reports_per_second']):>10} {si(row['uploads_per_second']):>10} "
                    f"{cores(cpu.get('aggregator'))} {cores(cpu.get('redis'))} {cores(cpu.get('load'))} "
                    f"{row['spread']:>4.0%}"
                )
            exact = all(rows[s.name]["exact"] for s in shapes)
            print(
                f"{cell['k']:>5} {cell['epsilon']:>4g} {store:<7}| {' | '.join(parts)} | "
                f"{'exact' if exact else 'WRONG'}"
            )
    for line in results["summary"]["targets"]:
        print(line["text"])

    latency = results.get("latency")
    if latency:
        print()
        print(
            f"Estimates of {latency['metric']} (k = {latency['k']}, epsilon = {latency['epsilon']:g}, windows "
            f"{', '.join(latency['windows'])}), one call at a time, ms. cached: counts unchanged since the last "
            "call; "
            "fresh: an untimed upload before each call, so the estimates are recomputed."
        )
        print(
            f"{'store':<7} {'call':<44} {'mode':<7} {'calls':>6} {'median':>8} {'p99':>8} {'mean':>8} "
            f"{'bytes':>8}  check"
        )
        for store, protocols in latency["results"].items():
            for protocol, modes in protocols.items():
                what = "gRPC Estimates.Get" if protocol == "gRPC" else f"HTTP GET {latency['path']}"
                for mode, row in modes.items():
                    print(
                        f"{store:<7} {what:<44} {mode:<7} {row['calls']:>6} {row['median_ms']:>8.2f} "
                        f"{row['p99_ms']:>8.2f} {row['mean_ms']:>8.2f} {row['response_bytes']:>8}  "
                        f"{'OK' if row['sanity']['ok'] else 'FAIL'}"
                    )


def targets(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's performance targets against the best store, for information."""
    lines = []
    large = [
        (row["large"]["reports_per_second"], store, cell["epsilon"])
        for cell in cells
        if cell["k"] == 1024
        for store, row in cell["stores"].items()
        if "large" in row
    ]
    if large:
        for store in sorted({s for _, s, _ in large}):
            worst = min(r for r, s, _ in large if s == store)
            lines.append(
                {
                    "target": "reports/s at k = 1024, 1000-report uploads",
                    "goal": LARGE_1024_GOAL,
                    "store": store,
                    "measured_worst_epsilon": worst,
                    "fraction": worst / LARGE_1024_GOAL,
                    "text": f"Target >= {si(LARGE_1024_GOAL)} reports/s at k = 1024 with 1000-report "
                    f"uploads: {store} {si(worst)}/s (worst epsilon), {worst / LARGE_1024_GOAL:.0%} "
                    "of it.",
                }
            )
    small = [
        (row["small"]["uploads_per_second"], store)
        for cell in cells
        for store, row in cell["stores"].items()
        if "small" in row
    ]
    for store in sorted({s for _, s in small}):
        worst = min(r for r, s in small if s == store)
        lines.append(
            {
                "target": "uploads/s with 10-report uploads",
                "goal": SMALL_UPLOADS_GOAL,
                "store": store,
                "measured_worst_cell": worst,
                "fraction": worst / SMALL_UPLOADS_GOAL,
                "text": f"Target >= {si(SMALL_UPLOADS_GOAL)} uploads/s with 10-report uploads: {store} "
                f"{si(worst)}/s (worst cell), {worst / SMALL_UPLOADS_GOAL:.0%} of it.",
            }
        )
    return lines


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__
        + """
The aggregator: bench/_aggregator.py run with --config CONFIG, one process per store, does what `veil serve
--config CONFIG` does (same JSON logging at info, load_config, Aggregator with its defaults:
16 handler threads, max_batch 10000) and adds one page, /bench/counts, on the aggregator's HTTP
listener, through which the benchmark reads the memory and SQLite stores back. Redis is read directly.

Prints a table per cell and store (reports/s, uploads/s, CPU cores busy per process), the
issue's targets for information, and the latency table; writes all of it, with machine facts,
as JSON.""",
        epilog="""\
Targets are reported, not raised. The exit status is 1 only when a correctness check fails:
a store holds other counts than the reports sent, an upload is refused or answered as a
duplicate, the encoding differs from the SDK's, or an estimates response is malformed.""",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke run (under a minute): one round of tiny runs, no sizing, 40 latency calls; "
        "still checks every count exactly; writes ingest-quick.json unless --output is given",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per cell (default 5; 1 with --quick)")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="aim for one run to take this long when sizing (default 1.0)"
    )
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS), help=f"category counts (default {KS})")
    parser.add_argument(
        "--epsilons", type=float, nargs="+", default=list(EPSILONS), help=f"privacy levels (default {EPSILONS})"
    )
    parser.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES), help="stores (default all)")
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the SQLite store's temporary directory goes: a disk, for fsync to mean what "
        "it does in production, not a tmpfs (default: the system's temporary directory)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=tuple(SHAPES),
        default=list(SHAPES),
        help="load shapes: large = 1000-report uploads, 16 in flight; small = 10-report uploads, "
        "64 in flight (default both)",
    )
    parser.add_argument(
        "--large-in-flight",
        type=int,
        default=SHAPES["large"].in_flight,
        metavar="N",
        help=f"calls in flight with 1000-report uploads (default {SHAPES['large'].in_flight})",
    )
    parser.add_argument(
        "--small-in-flight",
        type=int,
        default=SHAPES["small"].in_flight,
        metavar="N",
        help=f"calls in flight with 10-report uploads (default {SHAPES['small'].in_flight})",
    )
    parser.add_argument(
        "--load-processes",
        type=int,
        default=2,
        help="load generator processes; must divide both in-flight counts (default 2)",
    )
    parser.add_argument(
        "--latency-calls", type=int, help="cached estimate calls per store and protocol (default 2000; 40 with --quick)"
    )
    parser.add_argument(
        "--fresh-calls",
        type=int,
        help="fresh (recomputing) estimate calls per store and protocol (default 200; 8 with --quick)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="server.processes of the Redis store's aggregator: N worker processes sharing the "
        "gRPC port, run by `veil serve` (the memory and SQLite stores keep 1; default 1)",
    )
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the true values and of FastKeystream")
    parser.add_argument("--output", type=Path, help="results JSON (default bench/results/ingest.json)")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 5
    if args.latency_calls is None:
        args.latency_calls = 40 if args.quick else 2000
    if args.fresh_calls is None:
        args.fresh_calls = 8 if args.quick else 200
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.rounds < 1 or args.seconds <= 0 or args.latency_calls < 4 or args.fresh_calls < 0:
        parser.error("--rounds must be at least 1, --seconds above 0, --latency-calls at least 4")
    in_flight = {"large": args.large_in_flight, "small": args.small_in_flight}
    args.shape_table = {name: replace(SHAPES[name], in_flight=in_flight[name]) for name in args.shapes}
    if args.load_processes < 1 or any(
        s.in_flight % args.load_processes or s.in_flight < 1 for s in args.shape_table.values()
    ):
        parser.error(
            f"--load-processes must divide every in-flight count ({[s.in_flight for s in args.shape_table.values()]})"
        )
    if args.output is None:
        args.output = RESULTS_DIR / ("ingest-quick.json" if args.quick else "ingest.json")
    return args


def redis_version() -> str | None:
    try:
        return subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    machine = machine_info(("numpy", "numba", "grpcio", "protobuf", "redis", "hiredis", "veil"))
    machine["redis_server"] = redis_version() if "redis" in args.stores else None
    machine["load_average_before"] = list(os.getloadavg())
    ledger = Ledger()
    cells: list[dict[str, Any]] = []
    latency = None
    aggregators: dict[str, AggregatorProcess] = {}
    redis_server = None
    sqlite_dir = sqlite_bytes = None
    load = None
    with tempfile.TemporaryDirectory(prefix="veil-bench-ingest-") as scratch:
        try:
            progress(
                f"starting {args.load_processes} load processes and an aggregator per store ({', '.join(args.stores)})"
            )
            load = LoadProcesses(args.load_processes)
            for store in args.stores:
                if store == "redis":
                    redis_server = RedisServer().start()
                    url = redis_server.url
                elif store == "sqlite":
                    sqlite_dir = tempfile.mkdtemp(prefix="veil-bench-sqlite-", dir=args.sqlite_dir)
                    url = f"sqlite://{sqlite_dir}/veil.db"
                else:
                    url = "memory"
                processes = args.processes if store == "redis" else 1  # memory and SQLite: one process
                aggregator = AggregatorProcess(
                    store, url, config_dict(args.ks, args.epsilons, url, processes), Path(scratch)
                )
                if store == "redis":
                    from veil.aggregator.store import RedisStore

                    aggregator.redis = RedisStore(url)
                    aggregator.redis_pid = redis_server.process.pid
                aggregators[store] = aggregator
                progress(
                    f"{store} aggregator: pid {aggregator.pid}, gRPC {aggregator.endpoint}, HTTP port "
                    f"{aggregator.http_port}"
                    + (f", redis-server pid {redis_server.process.pid} at {url}" if store == "redis" else "")
                )
            check_specs(aggregators, args)

            for k in args.ks:
                for epsilon in args.epsilons:
                    tag = f"[k={k} eps={epsilon:g}]"
                    cells.append(measure_cell(k, epsilon, load, aggregators, ledger, args, tag))
            load.stop()
            load = None

            k_latency = max(args.ks)
            progress(
                f"estimate latency at k = {k_latency}: {args.latency_calls} cached and {args.fresh_calls} fresh "
                "calls per store and protocol"
            )
            latency = measure_latency(k_latency, args.epsilons[0], aggregators, ledger, args)
            progress("final check: every metric, every window, every store")
            for aggregator in aggregators.values():
                ledger.verify(aggregator, [m.name for m in aggregator.config.metrics])
        except BaseException:
            for aggregator in aggregators.values():
                progress(f"--- {aggregator.store} aggregator log (tail) ---\n{aggregator.log_tail()}")
            raise
        finally:
            if load is not None:
                load.stop()
            for aggregator in aggregators.values():
                aggregator.stop()
            if redis_server is not None:
                redis_server.cleanup()
            if sqlite_dir is not None:
                sqlite_bytes = sqlite_sizes(sqlite_dir)
                shutil.rmtree(sqlite_dir, ignore_errors=True)

    sane = latency is None or all(
        row["sanity"]["ok"]
        for protocols in latency["results"].values()
        for modes in protocols.values()
        for row in modes.values()
    )
    exact = not ledger.failures
    machine["load_average_after"] = list(os.getloadavg())
    results = {
        "benchmark": "ingest",
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "rounds": args.rounds,
            "seconds_per_run": args.seconds,
            "mechanism": MECHANISM,
            "windows": list(WINDOWS),
            "stores": args.stores,
            "shapes": {
                name: {
                    "batch": shape.batch,
                    "in_flight": shape.in_flight,
                    "reports_per_process_bounds": list(shape.bounds),
                }
                for name, shape in args.shape_table.items()
            },
            "load_processes": args.load_processes,
            "aggregator_processes": {store: a.config.processes for store, a in aggregators.items()},
            "load": "grpc.aio, one channel per in-flight call, generic unary-unary call on pre-serialized "
            "UploadRequest bytes, fresh batch ids per run",
            "aggregator": "subprocess: bench/_aggregator.py --config CONFIG (veil serve's logging, load_config, "
            "Aggregator defaults) + /bench/counts page; with --processes N > 1 on Redis: python -m veil.aggregator "
            "--config CONFIG (server.processes = N, CPU summed over the supervisor and workers)",
            "reports": f"true values Zipf {ZIPF_EXPONENT} over a seeded permutation; FastKeystream seeded from "
            f"{args.seed}; counts per prefix by veil.aggregator.simulate.count_reports",
            "latency_calls": args.latency_calls,
            "fresh_calls": args.fresh_calls,
            "sqlite": None if sqlite_bytes is None else {"directory": str(args.sqlite_dir), **sqlite_bytes},
        },
        "ingest": cells,
        "latency": latency,
        "exact_counts": ledger.summary(),
        "summary": {
            "targets": targets(cells),
            "exact_counts_ok": exact,
            "latency_sanity_ok": sane,
            "wall_seconds": time.perf_counter() - started,
        },
    }
    write_results(args.output, results)
    print_tables(results)
    print()
    for failure in ledger.failures:
        print(f"COUNT CHECK FAILED: {failure}")
    print(
        f"Exact-count checks: {ledger.checks - len(ledger.failures)} of {ledger.checks} OK; estimate responses "
        f"{'OK' if sane else 'MALFORMED'}; {results['summary']['wall_seconds']:.0f} s; results in {args.output}"
    )
    return 0 if exact and sane else 1


def sqlite_sizes(directory: str) -> dict[str, int]:
    """The SQLite store's files at the end (bytes): the database and what its WAL holds."""
    sizes = {}
    for name in ("veil.db", "veil.db-wal"):
        path = Path(directory) / name
        sizes[name.replace("veil.db", "database").replace("-wal", "_wal") + "_bytes"] = (
            path.stat().st_size if path.exists() else 0
        )
    return sizes


def check_specs(aggregators: dict[str, AggregatorProcess], args: argparse.Namespace) -> None:
    """The aggregators serve the specs the load processes randomize under (same fingerprints)."""
    import grpc

    from veil.mechanism import MetricSpec
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    wanted = {
        metric_name(k, e): MetricSpec.create(metric_name(k, e), labels(k), MECHANISM, e).fingerprint
        for k in args.ks
        for e in args.epsilons
    }
    for aggregator in aggregators.values():
        with grpc.insecure_channel(aggregator.endpoint) as channel:
            specs = veil_pb2_grpc.CollectorStub(channel).GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(), timeout=30)
        served = {s.name: s.fingerprint for s in specs.specs}
        if served != wanted:
            raise RuntimeError(f"the {aggregator.store} aggregator serves other specs than the benchmark randomizes")


if __name__ == "__main__":
    sys.exit(main())
