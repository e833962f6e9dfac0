"""Combine the benchmarks' results into one document, one table and one plot.

    .venv/bin/python bench/report.py                # bench/results/*.json (each benchmark's own)
    .venv/bin/python bench/report.py --markdown     # the same table as Markdown (bench/README.md's)
    .venv/bin/python bench/report.py --update-readme  # ... and put it into bench/README.md's "The latest results"
    .venv/bin/python bench/report.py --run          # run the benchmarks first (`make bench`)
    .venv/bin/python bench/report.py --run --quick  # smoke runs in bench/results/quick/ (`make bench-quick`)

Reads randomize.json (bench_randomize.py), client.json (bench_client.py), ingest.json
(bench_ingest.py), capacity.json (bench_capacity.py), device_day.json (bench_device_day.py),
series.json (bench_series.py), cli.json (bench_cli.py) and footprint.json (bench_footprint.py)
from the results directory and writes beside them:

  latest.json     one document: the machine, each benchmark's results as it wrote them, the
                  correctness checks, and a ``targets`` list (target, goal, measured, met, and
                  the exact source of each number: file and JSON path);
  throughput.png  reports per second by k and epsilon, log scale: Veil's batch randomizer (fast
                  and AES keystreams) beside multi-freq-ldpy and pure-ldp, and end-to-end ingest
                  per store and upload shape;

and prints one table (stdout; progress and the benchmarks' own tables go to stderr): the
randomize cells with Veil / peer ratios measured in the same run, report() latency per k,
ingest per store and shape with the exact-count verdict, estimate latency, the capacity model's
predictions, the device-day and the devices an aggregator core carries, the SDK's import time,
memory and threads per transport, and the targets.

With --run the benchmarks run first, one after the other, each writing its own JSON into
the results directory; a benchmark that fails still lets the others run, and the report then
combines what this run wrote (never an older file left from an earlier run).

The parts, beside this script (which reads, runs and writes): the goals as data (_goals.py),
the targets list and correctness checks (_targets.py), the tables (_tables.py, numbers in words
by _format.py) and the plot (_plot.py).

Targets are reported, not raised. The exit status is 1 when a correctness check failed (an
end-to-end run's exact counts, a randomizer's sanity band, a malformed estimates response), a
benchmark exited non-zero or wrote no results, or a results file is missing; 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _plot import plot
from _tables import render
from _targets import all_targets, correctness, grouped
from veil_testing.benchlib import QUICK_RESULTS_DIR, RESULTS_DIR, progress, write_results

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BENCHMARKS = {
    "randomize": "bench_randomize.py",
    "client": "bench_client.py",
    "ingest": "bench_ingest.py",
    "capacity": "bench_capacity.py",
    "device_day": "bench_device_day.py",
    "series": "bench_series.py",
    "cli": "bench_cli.py",
    "footprint": "bench_footprint.py",
}
LATEST, PLOT = "latest.json", "throughput.png"
# bench/README.md's tables sit between these lines; --update-readme replaces what is between (never
# the front README: measured numbers change with every run).
README_BEGIN = "<!-- bench/report.py --markdown: begin -->"
README_END = "<!-- bench/report.py --markdown: end -->"

DEVICE_DAY_STORES = ("sqlite", "redis", "cluster")  # what --stores may pass on to bench_device_day


# --- reading ----------------------------------------------------------------------------------


def shown(path: Path) -> str:
    """A path as the report names it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def is_quick(results: dict[str, Any]) -> bool:
    settings = results.get("settings", {})
    if "quick" in settings:
        return bool(settings["quick"])
    return "--quick" in results.get("command", "")


def load(directory: Path, runs: dict[str, dict[str, Any]] | None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(results per benchmark, sources per benchmark, problems). With ``runs`` (--run), a file
    this run did not write counts as missing: an older file must never pass for a new run."""
    results: dict[str, Any] = {}
    sources: dict[str, Any] = {}
    problems: list[str] = []
    for name in BENCHMARKS:
        path = directory / f"{name}.json"
        run = (runs or {}).get(name)
        source: dict[str, Any] = {"file": shown(path)}
        if run is not None:
            source["run"] = run
            if run["exit_status"] != 0:
                problems.append(f"{name} benchmark exited with status {run['exit_status']}")
            if not run["fresh"]:
                problems.append(f"{name} benchmark wrote no results in this run")
                sources[name] = {**source, "missing": True}
                continue
        if not path.exists():
            problems.append(f"{name} results missing: {shown(path)}")
            sources[name] = {**source, "missing": True}
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        results[name] = data
        sources[name] = {
            **source,
            "command": data.get("command"),
            "date": data.get("machine", {}).get("date"),
            "quick": is_quick(data),
        }
    return results, sources, problems


def merged_machine(results: dict[str, Any]) -> dict[str, Any]:
    """The benchmarks' machine facts in one: fields on which they agree, packages together, and
    where they disagree (benchmarks run on different machines or interpreters), each one's value."""
    machines = {name: data.get("machine", {}) for name, data in results.items()}
    merged: dict[str, Any] = {}
    differences: dict[str, Any] = {}
    for field in ("cpu_model", "processor", "cpu_count", "cpus_usable", "numba_threads", "platform", "python"):
        values = {name: m.get(field) for name, m in machines.items() if field in m}
        if len({json.dumps(v) for v in values.values()}) == 1:
            merged[field] = next(iter(values.values()))
        elif values:
            differences[field] = values
    packages: dict[str, Any] = {}
    for name, m in machines.items():
        for package, version in m.get("packages", {}).items():
            if package in packages and packages[package] != version:
                differences.setdefault("packages", {}).setdefault(package, {})[name] = version
            packages.setdefault(package, version)
    merged["packages"] = packages
    for field in ("redis_server", "load_average_before", "load_average_after"):
        if field in machines.get("ingest", {}):
            merged[field] = machines["ingest"][field]
    merged["dates"] = {name: m.get("date") for name, m in machines.items()}
    merged["differences"] = differences
    return merged


# --- writing bench/README.md's tables ----------------------------------------------------------


def update_readme(path: Path, table: str) -> None:
    """Replace the lines between README_BEGIN and README_END with ``table``; nothing else."""
    text = path.read_text(encoding="utf-8")
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{path}: no {README_BEGIN} ... {README_END} block to update")
    start = begin + len(README_BEGIN)
    text = text[:start] + "\n" + table.strip() + "\n" + text[end:]
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(text, encoding="utf-8")
    scratch.replace(path)


# --- running the benchmarks -------------------------------------------------------------------


def run_benchmarks(args: argparse.Namespace, directory: Path) -> dict[str, dict[str, Any]]:
    """Each benchmark in turn, writing its JSON into ``directory``; their tables and progress go
    to stderr, so stdout carries only the combined table. One failing does not stop the rest."""
    runs = {}
    for name, script in BENCHMARKS.items():
        output = directory / f"{name}.json"
        before = output.stat().st_mtime_ns if output.exists() else None
        command = [sys.executable, str(BENCH_DIR / script), "--output", str(output)]
        if args.quick:
            command.append("--quick")
        if name in ("randomize", "ingest", "capacity"):
            if args.ks:
                command += ["--ks", *map(str, args.ks)]
            if args.epsilons and name != "capacity":  # capacity measures epsilon = 1 only
                command += ["--epsilons", *(f"{e:g}" for e in args.epsilons)]
        if name in ("ingest", "capacity", "series") and args.stores:
            command += ["--stores", *args.stores]
        if name == "device_day" and args.stores:
            command += ["--stores", *([s for s in args.stores if s in DEVICE_DAY_STORES] or ["sqlite"])]
        progress(f"=== {name}: {shlex.join(command)}")
        started = time.perf_counter()
        status = subprocess.run(command, stdout=2, cwd=REPO).returncode  # fd 2: stderr
        fresh = output.exists() and output.stat().st_mtime_ns != before
        runs[name] = {
            "command": shlex.join(command),
            "exit_status": status,
            "fresh": fresh,
            "seconds": round(time.perf_counter() - started, 1),
        }
        progress(
            f"=== {name}: exit status {status}, {runs[name]['seconds']} s" + ("" if fresh else ", NO RESULTS WRITTEN")
        )
    return runs


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__)
    parser.add_argument("--run", action="store_true", help="run the benchmarks first (what `make bench` does)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke runs; results in {shown(QUICK_RESULTS_DIR)}/ unless --results-dir is given",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        help=f"where the benchmarks' JSON is read (and written with --run), and where {LATEST} and "
        f"{PLOT} go (default {shown(RESULTS_DIR)}, or {shown(QUICK_RESULTS_DIR)} with --quick)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for bench/README.md)")
    parser.add_argument("--no-write", action="store_true", help=f"print only: write neither {LATEST} nor {PLOT}")
    parser.add_argument(
        "--update-readme",
        nargs="?",
        type=Path,
        const=REPO / "bench" / "README.md",
        metavar="README",
        help="also put the Markdown table into README (default bench/README.md) between the lines "
        f"{README_BEGIN} and {README_END}",
    )
    parser.add_argument(
        "--ks",
        type=int,
        nargs="+",
        help="with --run: category counts for bench_randomize and bench_ingest (default theirs: 16 128 1024)",
    )
    parser.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        help="with --run: privacy levels for bench_randomize and bench_ingest (default theirs: 1 4)",
    )
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=("memory", "sqlite", "redis"),
        help="with --run: stores for bench_ingest, bench_capacity and bench_series (default theirs: all), and the "
        "ones of them bench_device_day measures (sqlite, redis; memory alone: sqlite)",
    )
    args = parser.parse_args(argv)
    if (args.ks or args.epsilons or args.stores) and not args.run:
        parser.error("--ks, --epsilons and --stores choose what --run measures")
    if args.results_dir is None:
        args.results_dir = QUICK_RESULTS_DIR if args.quick else RESULTS_DIR
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    directory = args.results_dir
    runs = None
    if args.run:
        directory.mkdir(parents=True, exist_ok=True)
        runs = run_benchmarks(args, directory)
    results, sources, problems = load(directory, runs)
    targets = all_targets(results, sources)
    checks = correctness(results)
    ok = not problems and all(v for key, v in checks.items() if key.endswith("_ok"))
    document: dict[str, Any] = {
        "report": "veil benchmarks: bench/report.py",
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv if argv is None else [shown(Path(__file__)), *argv]),
        "quick": any(s.get("quick") for s in sources.values()),
        "machine": merged_machine(results),
        "sources": sources,
        "checks": checks,
        "problems": problems,
        "summary": {
            "ok": ok,
            "targets_met": sum(t["met"] for t in targets),
            "targets": len(targets),
            "target_groups": [
                {k: v for k, v in row.items() if k != "worst"} | {"worst": row["worst"]["scope"]}
                for row in grouped(targets)
            ],
        },
        "targets": targets,
        "plot": shown(directory / PLOT),
        "benchmarks": results,
    }
    if not args.no_write:
        if results:
            plot(document, results, directory / PLOT)
        write_results(directory / LATEST, document)
    print(render(document, results, args.markdown))
    if args.update_readme:
        update_readme(args.update_readme, render(document, results, markdown=True))
        progress(f"updated the performance table in {shown(args.update_readme)}")
    if not args.no_write:
        progress(f"wrote {shown(directory / LATEST)}" + (f" and {shown(directory / PLOT)}" if results else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
