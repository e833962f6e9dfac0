"""The native-front experiment (README.md here): the same 10-report uploads (k = 16, 64 in
flight, bench_ingest's load processes) to four servers, in rounds A-B-C-D-D-C-B-A, on each store:

- grpcio-null: bench_capacity's do-nothing grpcio server (the efficiency goal's baseline);
- veil-serve: the aggregator as it is (bench_ingest's aggregator process);
- front-null: front.cc handing each gathered set to a Python callable that answers at once;
- front-ingest: front.cc with Veil's decode and the store's group write (ingest.py).

Printed and written to bench/results/native_front.json: CPU us per call of each server process
(/proc/PID/stat, all threads), calls/s, and each one's ratio to grpcio-null's calls per CPU
second, per round; then every count front-ingest acknowledged is checked exactly in its store.
Builds front.cc first (g++ and Debian's libgrpc++-dev).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
from bench_ingest import SHAPES, AggregatorProcess, LoadProcesses, cpu_seconds, store_counts  # noqa: E402
from ingest import cell_config  # noqa: E402
from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, write_results  # noqa: E402
from veil_testing.redis_cluster import RedisClusterServers  # noqa: E402
from veil_testing.redis_server import RedisServer  # noqa: E402

from veil.aggregator.config import parse_config  # noqa: E402
from veil.aggregator.store import open_store  # noqa: E402

SERVERS = ("grpcio-null", "veil-serve", "front-null", "front-ingest")
_NULL_HANDLER = "import sys; sys.path.insert(0, sys.argv[1]); import native_front; " + (
    "native_front.serve(sys.argv[2], lambda bodies: [b''] * len(bodies), 256)"
)


def build(directory: Path) -> Path:
    """front.cc compiled into directory as the native_front extension module."""
    try:
        grpc = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        sys.exit("compare.py: pkg-config finds no grpc++: install Debian's libgrpc++-dev (and pkg-config, g++).")
    target = directory / f"native_front{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", str(HERE / "front.cc")]
    command += [f"-I{sysconfig.get_paths()['include']}", "-o", str(target), *grpc]
    progress(f"building: {shlex.join(command)}")
    subprocess.run(command, check=True)
    return directory


def start(argv: list[str], port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen(argv)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{shlex.join(argv)} did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text()}"


def compare(store: str, load: LoadProcesses, module: Path, scratch: Path, reports: int, rounds: int) -> dict[str, Any]:
    cleanup = []
    scratch.mkdir()
    try:
        if store == "sqlite":
            aggregator_url, front_url = f"sqlite://{scratch}/aggregator.db", f"sqlite://{scratch}/front.db"
        elif store == "redis":
            redis: Any = RedisServer().start()
            cleanup.append(redis.cleanup)
            aggregator_url, front_url = redis.url, redis.url.rsplit("/", 1)[0] + "/1"
        else:  # one cluster for both: what both acknowledged is checked together
            redis = RedisClusterServers().start()
            cleanup.append(redis.cleanup)
            aggregator_url = front_url = redis.url
        null, null_endpoint = start(
            [sys.executable, str(HERE.parent / "bench_capacity.py"), "--null-server", str(scratch / "null.port")],
            scratch / "null.port",
        )
        cleanup.append(null.kill)
        aggregator = AggregatorProcess(store, aggregator_url, cell_config(aggregator_url), scratch)
        cleanup.append(aggregator.stop)
        front_null, front_null_endpoint = start(
            [sys.executable, "-c", _NULL_HANDLER, str(module), str(scratch / "front-null.port")],
            scratch / "front-null.port",
        )
        cleanup.append(front_null.kill)
        front, front_endpoint = start(
            [sys.executable, str(HERE / "ingest.py"), str(module), str(scratch / "front.port"), front_url],
            scratch / "front.port",
        )
        cleanup.append(front.kill)
        servers = {
            "grpcio-null": (null_endpoint, [null.pid], False),
            "veil-serve": (aggregator.endpoint, aggregator.pids, True),
            "front-null": (front_null_endpoint, [front_null.pid], False),
            "front-ingest": (front_endpoint, [front.pid], True),
        }
        expected: dict[str, Any] = {}
        shape = SHAPES["small"]

        def turn(name: str, count: int) -> tuple[float, int, float]:
            endpoint, pids, counting = servers[name]
            before = cpu_seconds(pids)
            result = load.run(endpoint, shape, count, {})
            cpu = cpu_seconds(pids) - before
            if counting:
                if result["accepted"] != result["reports"] or result["duplicates"]:
                    raise RuntimeError(f"{name} on {store}: {result['accepted']} of {result['reports']} acknowledged")
                key = "both" if store == "cluster" else name
                held = expected.get(key)
                expected[key] = (
                    (result["n"], result["v"]) if held is None else (held[0] + result["n"], held[1] + result["v"])
                )
            return cpu, result["uploads"], result["seconds"]

        for name in SERVERS:
            turn(name, 1000)  # warm-up: connections, thread pools, numba
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in SERVERS}
        for index in range(rounds):
            totals = {name: [0.0, 0, 0.0] for name in SERVERS}
            for name in (*SERVERS, *reversed(SERVERS)):
                for i, value in enumerate(turn(name, reports // 2)):
                    totals[name][i] += value
            for name, (cpu, calls, seconds) in totals.items():
                samples[name].append({"us": cpu / calls * 1e6, "calls_per_second": calls / seconds})
            null_us = samples["grpcio-null"][-1]["us"]
            progress(
                f"{store} round {index + 1}: "
                + ", ".join(
                    f"{name} {samples[name][-1]['us']:.0f} us ({null_us / samples[name][-1]['us']:.0%})"
                    for name in SERVERS
                )
            )
        front.kill()
        front.wait()  # the SQLite file is one process's at a time
        config = parse_config(cell_config(front_url))
        found = next(iter(store_counts(config, open_store(front_url), aggregator.since).values()))
        n, v = expected["both" if store == "cluster" else "front-ingest"]
        exact = {w: bool(np.array_equal(c["n"], n) and np.array_equal(c["v"], v)) for w, c in found.items()}
        return {
            "store": store,
            "servers": {
                name: {
                    "us_per_call": statistics.median(s["us"] for s in rows),
                    "us_per_call_rounds": [round(s["us"], 1) for s in rows],
                    "calls_per_second": statistics.median(s["calls_per_second"] for s in rows),
                    "ratio_to_grpcio_null": statistics.median(
                        null["us"] / s["us"] for null, s in zip(samples["grpcio-null"], rows)
                    ),
                }
                for name, rows in samples.items()
            },
            "front_ingest_exact": exact,
            "front_ingest_reports": int(np.sum(n)),
        }
    finally:
        for step in reversed(cleanup):
            step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--stores", nargs="+", default=["sqlite", "redis", "cluster"], choices=["sqlite", "redis", "cluster"]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reports", type=int, default=60_000, help="reports per load process and server a round (default 60000)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "native_front.json")
    args = parser.parse_args(argv)
    load = LoadProcesses(2)
    try:
        with tempfile.TemporaryDirectory(prefix="veil-native-front-") as directory:
            scratch = Path(directory)
            module = build(scratch)
            load.command("cell", {"k": 16, "epsilon": 1.0, "seed": 20240601})
            load.command("extend", 200_000)
            rows = [compare(store, load, module, scratch / store, args.reports, args.rounds) for store in args.stores]
    finally:
        load.stop()
    write_results(args.output, {"machine": machine_info(("grpcio", "redis", "veil")), "rows": rows})
    print(f"{'store':8} " + " ".join(f"{name:>22}" for name in SERVERS) + "  exact")
    for row in rows:
        cells = [
            f"{s['us_per_call']:6.0f} us {s['ratio_to_grpcio_null']:5.0%}".rjust(22) for s in row["servers"].values()
        ]
        print(f"{row['store']:8} " + " ".join(cells) + f"  {all(row['front_ingest_exact'].values())}")
    print(f"(CPU us per 10-report call, median of rounds; % = calls per CPU second against grpcio-null)\n{args.output}")
    return 0 if all(all(row["front_ingest_exact"].values()) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
