"""A capacity model, measured: CPU per upload of the aggregator and of each Redis master, and what
N aggregator cores and M masters would then carry, through the aggregator's gRPC listener
(server.grpc: grpcio's server). (The native collector, a second listener on gRPC's C++ server
that this benchmark used to measure, was removed: bench/PROFILES.md section 4 keeps its numbers
and why it left.)

For each store (memory, sqlite, redis, cluster: a real 3-master, 3-replica Redis Cluster this
benchmark starts) and k in {16, 128, 1024}, bench_ingest's load processes (the same grpc.aio
generator, pre-serialized uploads, fresh batch ids) send 10-report uploads (64 in flight) and
1000-report uploads (16 in flight) to one aggregator process; every run is checked exactly
(bench_ingest's Ledger: every acknowledged report, whichever listener took it). Measured per run:
the aggregator's CPU from /proc/PID/stat (all its threads, C++ ones included) and each master's
from INFO cpu (used_cpu_sys + used_cpu_user), as microseconds per upload. Medians over --rounds.

Model: an aggregator core carries 1e6 / (aggregator us per upload) uploads/s; the masters, with
the shards spread evenly over M of them, 1e6 * M / (sum over masters of us per upload). The
prediction for N cores and M masters is the smaller of the two (reports/s: times the batch).

Checks, where one machine allows: the per-master CPU of the cluster within 10% of its mean (the
shards of each metric spread evenly), and 1 vs 2 aggregator processes (server.processes = 2, the
workers sharing a fixed gRPC port) on the cluster.

Efficiency (issue 17), on every store (sqlite: the default embedded store, a file in the scratch
directory, every commit fsynced): 10-report uploads per aggregator CPU second as a ratio to the
calls per CPU second of a grpcio server whose handler does nothing (bench/PROFILES.md section 4),
through the grpcio listener (checks.efficiency_<store>: the goal's check, ok at >= 75%). Both get
the same load from the same generator: after a warm-up of each, every round sends each the same
number of calls, A-B-B-A (half to the do-nothing server, half to the aggregator, the other halves
in reverse order), each measured by the CPU time of its own server process; the ratios are taken
per round and their medians reported with every round's, as the machine's load moves both.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _aggregator import AggregatorProcess, config_dict, metric_name
from _goals import EFFICIENCY_GOAL, EVEN_GOAL
from _load import GRAIN, SHAPES, Ledger, LoadProcesses, Masters, cpu_seconds, run_once
from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, write_results
from veil_testing.redis_cluster import RedisClusterServers
from veil_testing.redis_server import RedisServer

KS = (16, 128, 1024)
STORES = ("memory", "sqlite", "redis", "cluster")
CORES = (8, 32, 128)
EFFICIENCY_CALLS = 3  # the efficiency cell sends this many times a cell's calls, for steadier CPU readings


def null_server(port_file: str) -> int:
    """A grpcio server (as the aggregator's: sync, 16 threads) whose Upload handler returns an
    empty response at once: what the RPC alone costs."""
    from concurrent import futures

    import grpc

    def handle(request: bytes, context: Any) -> bytes:
        return b""

    handler = grpc.method_handlers_generic_handler(
        "veil.wire.v1.Collector",
        {"Upload": grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None, response_serializer=None)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(port_file).write_text(str(port))
    server.wait_for_termination()
    return 0


LISTENERS = {
    "grpcio": "server.grpc: grpcio's sync server, a Python thread per call",
}


def measure(
    load: LoadProcesses,
    aggregator: AggregatorProcess,
    masters: Masters | None,
    shape_name: str,
    k: int,
    reports: int,
    rounds: int,
    ledger: Ledger,
    null: tuple[str, int] | None = None,
    listeners: tuple[str, ...] = ("grpcio",),
) -> dict[str, Any]:
    """Median CPU per upload over the rounds through each of `listeners` (keys of LISTENERS; the
    first is the row's, the others' go under their names). With `null` (the do-nothing server's
    endpoint and pid) each round sends the do-nothing server the same load too, as A-B-C-C-B-A:
    half of its calls, half through each listener, then the other halves in reverse order, so
    that a load on the machine that drifts during the round weighs on all alike. The efficiency
    ratios are taken per round."""
    shape = SHAPES[shape_name]
    metric = metric_name(k, 1.0)
    endpoints = {"grpcio": aggregator.endpoint}
    for name in listeners:
        # Warm-up: new connections, and the first uploads of a layout may compile a kernel.
        run_once(load, aggregator, shape, metric, GRAIN, {}, ledger, endpoints[name])
    if null is not None:
        load.run(null[0], shape, GRAIN, {})  # its warm-up: new connections, a cold thread pool
    part = reports if null is None else max(GRAIN, reports // 2 // GRAIN * GRAIN)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in listeners}
    nulls = []

    def null_turn() -> tuple[float, int, float]:
        assert null is not None
        before = cpu_seconds(null[1])
        result = load.run(null[0], shape, part, {})
        return cpu_seconds(null[1]) - before, result["uploads"], result["seconds"]

    def aggregator_turn(name: str) -> tuple[float, list[float], int, float, bool]:
        before_cpu = cpu_seconds(aggregator.pids)
        before = masters.seconds() if masters else []
        result = run_once(load, aggregator, shape, metric, part, {}, ledger, endpoints[name])
        after = masters.seconds() if masters else []
        return (
            cpu_seconds(aggregator.pids) - before_cpu,
            [a - b for a, b in zip(after, before)],
            result["uploads"],
            result["seconds"],
            result["exact"],
        )

    for _ in range(rounds):
        first = null_turn() if null is not None else None
        order = list(listeners) if null is None else [*listeners, *reversed(listeners)]
        turns: dict[str, list[tuple[float, list[float], int, float, bool]]] = {name: [] for name in listeners}
        for name in order:
            turns[name].append(aggregator_turn(name))
        if first is not None:
            cpu, calls, seconds = (a + b for a, b in zip(first, null_turn()))
            nulls.append({"us": cpu / calls * 1e6, "calls_per_second": calls / seconds})
        for name, mine in turns.items():
            uploads = sum(t[2] for t in mine)
            samples[name].append(
                {
                    "uploads_per_second": uploads / sum(t[3] for t in mine),
                    "aggregator_us": sum(t[0] for t in mine) / uploads * 1e6,
                    "master_us": [sum(m) / uploads * 1e6 for m in zip(*(t[1] for t in mine))],
                    "exact": all(t[4] for t in mine),
                }
            )

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "uploads_per_second": statistics.median(s["uploads_per_second"] for s in runs),
            "aggregator_us_per_upload": statistics.median(s["aggregator_us"] for s in runs),
            "aggregator_us_rounds": [round(s["aggregator_us"], 1) for s in runs],
            "master_us_per_upload": [
                statistics.median(s["master_us"][i] for s in runs) for i in range(len(runs[0]["master_us"]))
            ],
            "exact": all(s["exact"] for s in runs),
        }

    row: dict[str, Any] = {
        "shape": shape_name,
        "k": k,
        "batch": shape.batch,
        "in_flight": shape.in_flight,
        "listener": listeners[0],
        **summary(samples[listeners[0]]),
    }
    for name in listeners[1:]:
        row[name] = {"listener": name, **summary(samples[name])}
    if nulls:
        row["null"] = {
            "us_per_call": statistics.median(n["us"] for n in nulls),
            "us_per_call_rounds": [round(n["us"], 1) for n in nulls],
            "calls_per_second": statistics.median(n["calls_per_second"] for n in nulls),
        }
        row["efficiency"] = {}
        for name in listeners:
            ratios = [n["us"] / s["aggregator_us"] for n, s in zip(nulls, samples[name])]
            row["efficiency"][name] = {
                "ratio": statistics.median(ratios),
                "ratio_rounds": [round(r, 3) for r in ratios],
            }
    return row


def efficiency_check(row: dict[str, Any]) -> dict[str, Any]:
    """checks.efficiency_<store>: the goal's ratio, through the row's listener, with any other's
    beside it (for comparison: not the goal's)."""

    def through(name: str, measured: dict[str, Any]) -> dict[str, Any]:
        return {
            "listener": name,
            "what": LISTENERS[name],
            **row["efficiency"][name],
            "aggregator_us_per_upload": measured["aggregator_us_per_upload"],
            "aggregator_us_rounds": measured["aggregator_us_rounds"],
            "uploads_per_second": measured["uploads_per_second"],
        }

    null = row["null"]
    check = {
        **through(row["listener"], row),
        "null_us_per_call": null["us_per_call"],
        "null_us_per_call_rounds": null["us_per_call_rounds"],
        "null_calls_per_second": null["calls_per_second"],
        "goal": EFFICIENCY_GOAL,
        "ok": row["efficiency"][row["listener"]]["ratio"] >= EFFICIENCY_GOAL,
    }
    for name in row["efficiency"]:
        if name != row["listener"]:
            check[name] = {**through(name, row[name]), "goal": None, "note": "for comparison; not the goal's check"}
    return check


def predict(row: dict[str, Any], cores: int, masters: int) -> dict[str, float]:
    aggregator = cores * 1e6 / row["aggregator_us_per_upload"]
    redis_us = sum(row["master_us_per_upload"])
    redis = math.inf if not redis_us else masters * 1e6 / redis_us
    uploads = min(aggregator, redis)
    return {
        "uploads_per_second": uploads,
        "reports_per_second": uploads * row["batch"],
        "bound": "aggregator" if aggregator <= redis else "redis",
    }


def masters_needed(row: dict[str, Any], cores: int) -> int:
    """The fewest masters that keep up with `cores` aggregator cores."""
    redis_us = sum(row["master_us_per_upload"])
    return max(1, math.ceil(cores * redis_us / row["aggregator_us_per_upload"]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny runs, numbers mean nothing")
    parser.add_argument("--rounds", type=int, help="runs per cell (default 3; 1 with --quick)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=STORES,
        default=list(STORES),
        help="memory, sqlite, redis, cluster (default all); report.py passes its --stores",
    )
    parser.add_argument(
        "--cluster-shards",
        type=int,
        nargs="+",
        default=[3, 12],
        help="store.shards of the cluster variants; the first is modelled (default 3, one per "
        "master as by default, and 12)",
    )
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--output", type=Path, help="results JSON (default bench/results/capacity.json)")
    parser.add_argument("--null-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.quick:
        args.cluster_shards = args.cluster_shards[:1]
    args.output = args.output or RESULTS_DIR / "capacity.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.null_server:
        return null_server(args.null_server)
    started = time.perf_counter()
    from veil.aggregator.store import RedisStore

    small, large = (1000, 20_000) if args.quick else (10_000, 200_000)  # reports per load process and run
    machine = machine_info(("grpcio", "redis", "hiredis", "veil"))
    ledger = Ledger()
    rows: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    cleanup: list[Any] = []
    load = LoadProcesses(args.load_processes)
    with tempfile.TemporaryDirectory(prefix="veil-bench-capacity-") as scratch:
        try:
            port_file = Path(scratch) / "null.port"
            null = subprocess.Popen([sys.executable, __file__, "--null-server", str(port_file)])
            cleanup.append(null.kill)
            while not port_file.exists() or not port_file.read_text():
                if null.poll() is not None:
                    raise RuntimeError(f"the do-nothing server exited with {null.returncode}")
                time.sleep(0.05)
            null_endpoint = f"127.0.0.1:{port_file.read_text()}"
            variants = [(store, None) for store in args.stores if store != "cluster"]
            if "cluster" in args.stores:
                variants += [("cluster", shards) for shards in args.cluster_shards]
            cluster = None
            for store, shards in variants:
                name = store if shards is None else f"cluster-s{shards}"
                masters = None
                config_store: dict[str, Any] = {}
                if store == "memory":
                    url = "memory"
                elif store == "sqlite":
                    url = f"sqlite://{Path(scratch) / 'veil-bench.db'}"
                elif store == "redis":
                    server = RedisServer().start()
                    cleanup.append(server.cleanup)
                    url, masters = server.url, Masters([server])
                else:
                    if cluster is None:
                        cluster = RedisClusterServers().start()
                        cleanup.append(cluster.cleanup)
                    cluster.flush()  # the shard count is recorded in the cluster: each variant starts afresh
                    url, masters = cluster.url, Masters(cluster.masters())
                    config_store = {"shards": shards} if shards else {}
                config = config_dict(args.ks, [1.0], url)
                config["store"].update(config_store)
                aggregator = AggregatorProcess(name, url, config, Path(scratch))
                cleanup.append(aggregator.stop)
                if store in ("redis", "cluster"):
                    aggregator.redis = RedisStore(url)
                progress(
                    f"{name}: aggregator pid {aggregator.pid}, grpcio listener {aggregator.endpoint}, "
                    f"{len(masters.nodes) if masters else 0} masters"
                )
                for k in args.ks:
                    load.command("cell", {"k": k, "epsilon": 1.0, "seed": 20240601})
                    load.command("extend", large)
                    for shape, reports in (("small", small), ("large", large)):
                        # At the first k the do-nothing server gets the same small uploads, interleaved.
                        beside = (null_endpoint, null.pid) if shape == "small" and k == args.ks[0] else None
                        calls = reports * EFFICIENCY_CALLS if beside else reports
                        row = measure(load, aggregator, masters, shape, k, calls, args.rounds, ledger, beside)
                        row["store"] = name
                        rows.append(row)
                        progress(
                            f"{name} k={k} {shape}: {row['uploads_per_second']:.0f} uploads/s, aggregator "
                            f"{row['aggregator_us_per_upload']:.0f} us/upload, masters "
                            f"{[round(u) for u in row['master_us_per_upload']]} us/upload"
                        )
                        if "efficiency" in row:
                            check = checks[f"efficiency_{name}"] = efficiency_check(row)
                            progress(f"{name} efficiency: {efficiency_text(check)}")
                if store == "cluster":
                    mine = [r for r in rows if r["store"] == name]
                    for row in mine:
                        us = row["master_us_per_upload"]
                        row["master_spread"] = (max(us) - min(us)) / statistics.mean(us)
                    # The whole run's load per master: every cell's CPU per upload, weighted by its uploads.
                    total = [
                        sum(r["master_us_per_upload"][i] for r in mine)
                        for i in range(len(mine[0]["master_us_per_upload"]))
                    ]
                    checks[f"{name}_masters_even"] = {
                        "per_cell_max_spread": max(r["master_spread"] for r in mine),
                        "overall_spread": (max(total) - min(total)) / statistics.mean(total),
                        "goal": EVEN_GOAL,
                    }
                    checks[f"{name}_masters_even"]["ok"] = checks[f"{name}_masters_even"]["overall_spread"] <= EVEN_GOAL
                    if shards != args.cluster_shards[0]:
                        continue
                    # 1 vs 2 aggregator processes on the cluster, 10-report uploads at the first k,
                    # (a fixed gRPC port both workers share).
                    config = config_dict(args.ks, [1.0], url, processes=2)
                    config["store"].update(config_store)
                    two = AggregatorProcess(f"{name}-2", url, config, Path(scratch))
                    cleanup.append(two.stop)
                    two.redis = aggregator.redis
                    ledger.expected.update({(two.store, m): v for (s, m), v in ledger.expected.items() if s == name})
                    load.command("cell", {"k": args.ks[0], "epsilon": 1.0, "seed": 20240601})
                    load.command("extend", large)
                    row = measure(load, two, masters, "small", args.ks[0], small, args.rounds, ledger)
                    one = next(r for r in mine if r["k"] == args.ks[0] and r["shape"] == "small")
                    checks[f"{name}_processes"] = {
                        "listener": "grpcio",
                        "one": one["uploads_per_second"],
                        "two": row["uploads_per_second"],
                        "one_us": one["aggregator_us_per_upload"],
                        "two_us": row["aggregator_us_per_upload"],
                    }
                    two.redis = None
        finally:
            load.stop()
            for step in reversed(cleanup):
                step()

    predictions = []
    for row in rows:
        if row["store"] != f"cluster-s{args.cluster_shards[0]}":
            continue
        for cores in CORES:
            masters = masters_needed(row, cores)
            predictions.append(
                {
                    "k": row["k"],
                    "shape": row["shape"],
                    "cores": cores,
                    "masters": masters,
                    **predict(row, cores, masters),
                }
            )
    results = {
        "benchmark": "capacity",
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "rounds": args.rounds,
            "ks": args.ks,
            "stores": args.stores,
            "cluster_shards": args.cluster_shards,
            "reports_per_process": {"small": small, "large": large},
            "listeners": LISTENERS,
            "rows_listener": "grpcio",
            "efficiency_rounds": "A-B-B-A: do-nothing grpcio server, the aggregator's grpcio listener, "
            "then the other halves in reverse order",
        },
        "rows": rows,
        "predictions": predictions,
        "checks": checks,
        "exact_counts": {"ok": not ledger.failures, "checks": ledger.checks, "failures": ledger.failures},
        "wall_seconds": time.perf_counter() - started,
    }
    write_results(args.output, results)
    print_tables(results)
    return 0 if not ledger.failures else 1


def print_tables(results: dict[str, Any]) -> None:
    print("\nCPU per upload (median), us, through the grpcio listener: aggregator | each master")
    for row in results["rows"]:
        masters = " ".join(f"{u:.0f}" for u in row["master_us_per_upload"]) or "-"
        print(
            f"  {row['store']:11} k={row['k']:<5} {row['batch']:>4}-report: "
            f"{row['uploads_per_second']:8.0f} uploads/s"
            f"  aggregator {row['aggregator_us_per_upload']:6.0f} | masters {masters}"
        )
    print(
        f"\nPredicted (cluster-s{results['settings']['cluster_shards'][0]} measurements): N aggregator cores, "
        "the masters that keep up with them"
    )
    for p in results["predictions"]:
        print(
            f"  k={p['k']:<5} {p['shape']:5} N={p['cores']:<4} M={p['masters']:<3} {p['uploads_per_second']:>12,.0f} "
            f"uploads/s {p['reports_per_second']:>14,.0f} reports/s ({p['bound']}-bound)"
        )
    print(
        "\nEfficiency: 10-report uploads per aggregator CPU second / calls per CPU second of a do-nothing "
        f"grpcio server, median (rounds); goal {EFFICIENCY_GOAL:.0%}"
    )
    for name, check in results["checks"].items():
        if name.startswith("efficiency_"):
            print(f"  {name.removeprefix('efficiency_'):11} {efficiency_text(check)}")
    print("\nChecks")
    for name, check in results["checks"].items():
        if not name.startswith("efficiency_"):
            print(f"  {name}: {check}")
    exact = results["exact_counts"]
    print(f"Exact-count checks: {exact['checks'] - len(exact['failures'])} of {exact['checks']} OK")


def efficiency_text(check: dict[str, Any]) -> str:
    """One efficiency check in a line: each listener's ratio, its rounds and its us per upload."""

    def part(entry: dict[str, Any]) -> str:
        rounds = "/".join(f"{r:.0%}" for r in entry["ratio_rounds"])
        return f"{entry['listener']} {entry['ratio']:.0%} ({rounds}, {entry['aggregator_us_per_upload']:.0f} us/upload)"

    parts = [part(check)] + [part(v) for v in check.values() if isinstance(v, dict) and "ratio" in v]
    verdict = "OK" if check["ok"] else "below the goal"
    return f"{', '.join(parts)}; do-nothing grpcio {check['null_us_per_call']:.0f} us/call; {verdict}"


if __name__ == "__main__":
    sys.exit(main())
