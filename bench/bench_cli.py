"""How long the `veil` commands that read a running aggregator take, start to finish.

    python bench/bench_cli.py            # 15 runs of each command
    python bench/bench_cli.py --quick    # 3 runs (numbers mean nothing)

The target (issue 18): `veil specs` and `veil estimates` answer within 0.5 s. Each command runs
as a fresh process, as a person or a script runs it, against an aggregator started here (the
in-process memory store, three metrics of the demo's shape, 1,000 reports each), and is timed
from spawn to exit. Two floors are measured in the same run for scale: the interpreter alone
(`python -c pass`) and the interpreter importing grpcio and the wire module (what any gRPC
client in Python pays). Each command runs once untimed first, with bytecode caching on (an
installed package has its .pyc files; PYTHONDONTWRITEBYTECODE would time the compiler instead).
Writes cli.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _aggregator import VEIL, start_aggregator
from _goals import CLI_START_GOAL_MS
from veil_testing.benchlib import QUICK_RESULTS_DIR, RESULTS_DIR, machine_info, progress, write_results


def wall_seconds(command: list[str], runs: int) -> dict[str, float]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    samples = []
    for run in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=environment)
        if run:  # the first writes the bytecode caches
            samples.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"bench_cli: {shlex.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return {
        "median_ms": statistics.median(samples) * 1000,
        "min_ms": min(samples) * 1000,
        "max_ms": max(samples) * 1000,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 runs each")
    parser.add_argument("--output", type=Path, help="the JSON file (default: cli.json in bench/results/)")
    args = parser.parse_args(argv)
    runs = 3 if args.quick else 15
    aggregator = start_aggregator(reports=1000)
    address = f"127.0.0.1:{aggregator.grpc_port}"
    commands = {
        "python": [sys.executable, "-c", "pass"],
        "python_grpc_wire": [sys.executable, "-c", "import grpc, veil.wire.v1.veil_pb2_grpc"],
        "veil_specs": [VEIL, "specs", "--address", address],
        "veil_estimates": [VEIL, "estimates", "--address", address],
        "veil_estimates_metric": [VEIL, "estimates", "m0", "--window", "1h", "--address", address],
    }
    results = {}
    try:
        for name, command in commands.items():
            results[name] = wall_seconds(command, runs)
            progress(
                f"  {name}: median {results[name]['median_ms']:.0f} ms, "
                f"max {results[name]['max_ms']:.0f} ms ({shlex.join(command[1:])})"
            )
    finally:
        aggregator.stop()
    write_results(
        args.output or (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR) / "cli.json",
        {
            "command": shlex.join(["python", "bench/bench_cli.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(("grpcio", "protobuf")),
            "settings": {"quick": args.quick, "runs": runs, "goal_ms": CLI_START_GOAL_MS},
            "cli": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
