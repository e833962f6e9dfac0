"""What embedding the Veil SDK costs an app: import time, memory and OS threads, per transport.

    python bench/bench_footprint.py            # 11 fresh processes per case, medians
    python bench/bench_footprint.py --quick    # 3 each (numbers mean nothing)

Each case runs in a fresh interpreter (bytecode caches warm: one untimed run first), which
reads its own RSS and OS thread count from /proc/self/status:

  - python:         the interpreter alone (the floor);
  - import:         ``import veil.client`` (what every app pays; it loads no grpc);
  - reporter http:  then ``Reporter("http://127.0.0.1:<port>")`` until its specs are known, idle
                    (standard library only);
  - reporter grpc:  then ``Reporter("127.0.0.1:<port>")`` (grpcio, loaded by this Reporter),
                    the same.

against an in-process aggregator started here (memory store, both listeners on loopback).
Import time is the wall time of the import statement; a Reporter's time is from construction
to its first specs. Writes footprint.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _aggregator import start_aggregator
from veil_testing.benchlib import QUICK_RESULTS_DIR, RESULTS_DIR, machine_info, progress, write_results

PROBE = """\
import json, sys, time

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])

out = {}
out["python_rss_mb"], out["python_threads"] = status()
if sys.argv[1] != "python":
    started = time.perf_counter()
    import veil.client
    out["import_ms"] = (time.perf_counter() - started) * 1000
    out["import_rss_mb"], out["import_threads"] = status()
    out["grpc_loaded_by_import"] = "grpc" in sys.modules
if sys.argv[1] == "reporter":
    started = time.perf_counter()
    reporter = veil.client.Reporter(sys.argv[2], spec_ttl_ms=3_600_000)
    assert reporter.wait_for_specs(30), "no specs"
    out["reporter_ms"] = (time.perf_counter() - started) * 1000
    time.sleep(0.2)  # idle: the calls done, the threads parked
    out["reporter_rss_mb"], out["reporter_threads"] = status()
    out["grpc_loaded"] = "grpc" in sys.modules
    reporter.shutdown(5)
print(json.dumps(out))
"""


def measure(args: list[str], runs: int) -> dict[str, Any]:
    """Medians (and ranges) of the probe's numbers over ``runs`` fresh processes."""
    samples: list[dict[str, Any]] = []
    for run in range(runs + 1):
        done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_footprint: probe {shlex.join(args)} exited {done.returncode}: {done.stderr}")
        if run:  # the first writes the bytecode caches
            samples.append(json.loads(done.stdout))
    result: dict[str, Any] = {"runs": runs}
    for key, value in samples[0].items():
        values = [sample[key] for sample in samples]
        if isinstance(value, bool):
            result[key] = all(values) if value else any(values)
        else:
            result[key] = round(statistics.median(values), 2)
            result[f"{key}_range"] = [round(min(values), 2), round(max(values), 2)]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 processes each")
    parser.add_argument("--output", type=Path, help="the JSON file (default: footprint.json in bench/results/)")
    args = parser.parse_args(argv)
    runs = 3 if args.quick else 11
    aggregator = start_aggregator()
    cases = {
        "python": ["python"],
        "import": ["import"],
        "reporter_http": ["reporter", f"http://127.0.0.1:{aggregator.http_port}"],
        "reporter_grpc": ["reporter", f"127.0.0.1:{aggregator.grpc_port}"],
    }
    results = {}
    try:
        for name, case in cases.items():
            results[name] = row = measure(case, runs)
            progress(f"  {name}: {json.dumps({k: v for k, v in row.items() if not k.endswith('_range')})}")
    finally:
        aggregator.stop()
    write_results(
        args.output or (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR) / "footprint.json",
        {
            "command": shlex.join(
                ["python", "bench/bench_footprint.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "machine": machine_info(("grpcio", "protobuf")),
            "settings": {"quick": args.quick, "runs": runs},
            "footprint": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
