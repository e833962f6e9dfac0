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

Targets are reported, not raised. The exit status is 1 when a correctness check failed (an
end-to-end run's exact counts, a randomizer's sanity band, a malformed estimates response), a
benchmark exited non-zero or wrote no results, or a results file is missing; 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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

# The targets (issue 7).
SS_PEER, GRR_PEER, OUE_PEER = "multi-freq-ldpy SS", "multi-freq-ldpy GRR", "pure-ldp OUE"
RATIO_GOALS = {"fast": 50.0, "AES": 20.0}  # Veil subset / multi-freq-ldpy SS, every cell
ENCODING_GOAL = 1_000_000  # q-subset reports/s at k = 1024, epsilon = 1, one core (strictly above)
LARGE_1024_GOAL = 1_000_000  # end-to-end reports/s at k = 1024, epsilon = 1, 1000-report uploads
LARGE_SMALL_K_GOAL = 3_000_000  # end-to-end reports/s at k <= 128, 1000-report uploads
SMALL_UPLOADS_GOAL = 25_000  # uploads/s of 10-report uploads
SQLITE_SMALL_RATIO_GOAL = 0.8  # SQLite's 10-report uploads/s over Redis's, same run: within 20% (issue 14)
GET_P99_GOAL_MS = 5.0  # Estimates.Get p99 at k = 1024 with 3 windows
CLIENT_KS = (16, 128, 1024)  # report() median and p99 published for these k
CLI_START_GOAL_MS = 500.0  # issue 18: `veil specs` and `veil estimates`, spawn to exit (median)
SERIES_P99_GOAL_MS = 50.0  # issue 16: 720 hourly buckets at k = 1024, each estimated
MERGED_P99_GOAL_MS = 10.0  # issue 16: a 7-day merged estimate at k = 1024
SERIES_STORES = ("sqlite", "redis")  # the stores issue 16's series targets apply to
EFFICIENCY_GOAL = 0.75  # issue 17: 10-report uploads per aggregator CPU second / a do-nothing grpcio server's calls
DEVICE_DAY_GOAL = 0.75  # issue 26: device-days per aggregator CPU second / a do-nothing server's, same calls and TLS
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


def machine_line(machine: dict[str, Any]) -> str:
    cpus = machine.get("cpus_usable") or machine.get("cpu_count") or "?"
    model = machine.get("cpu_model") or machine.get("processor") or "unknown CPU"
    dates = sorted(d for d in machine.get("dates", {}).values() if d)
    when = dates[0][:10] if dates else "unknown date"
    if dates and dates[-1][:10] != when:
        when += f" to {dates[-1][:10]}"
    return f"{cpus} CPUs ({model}), Python {machine.get('python', '?')}, measured {when}"


# --- targets ----------------------------------------------------------------------------------


def met(value: float | None, operator: str, goal: float) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return {">=": value >= goal, ">": value > goal, "<=": value <= goal}[operator]


def target(
    group: str,
    text: str,
    operator: str,
    goal: float,
    unit: str,
    scope: str,
    value: Any,
    file: str | None,
    path: str | None,
    note: str | None = None,
) -> dict[str, Any]:
    """One entry of the targets list; ``value`` None means not measured (not met)."""
    number = value if isinstance(value, (int, float)) else None
    entry = {
        "group": group,
        "target": text,
        "goal": f"{operator} {fmt_goal(goal, unit)}",
        "operator": operator,
        "threshold": goal,
        "unit": unit,
        "scope": scope,
        "measured": value,
        "met": met(number, operator, goal),
        "source": None if path is None else {"file": file, "path": path},
    }
    if value is None:
        entry["note"] = "not measured in these results"
    elif note:
        entry["note"] = note
    return entry


def fmt_goal(goal: float, unit: str) -> str:
    if unit == "%":
        return f"{goal:.0%}"
    if unit == "x":
        return f"{goal:g}x"
    if unit == "ms":
        return f"{goal:g} ms"
    return f"{si(goal)} {unit}"


def randomize_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    entries = []
    cells = [] if data is None else data["cells"]
    wanted = [(k, e) for k in (16, 128, 1024) for e in (1.0, 4.0)]
    for keystream, goal in RATIO_GOALS.items():
        group = f"Veil subset ({keystream}) / multi-freq-ldpy SS"
        text = f"batch randomization + summation, Veil subset {keystream} keystream vs {SS_PEER}, reports/s ratio"
        for k, epsilon in wanted:
            found = [(i, cell) for i, cell in enumerate(cells) if cell["k"] == k and cell["epsilon"] == epsilon]
            value = path = None
            if found:
                i, cell = found[0]
                for j, comparison in enumerate(cell["comparisons"]):
                    if comparison["peer"] == SS_PEER and comparison["keystream"] == keystream:
                        value, path = comparison["ratio"], f"cells[{i}].comparisons[{j}].ratio"
            entries.append(target(group, text, ">=", goal, "x", f"k={k} eps={epsilon:g}", value, file, path))
    for keystream in RATIO_GOALS:
        label = f"Veil subset {keystream}"
        value = path = None
        for i, cell in enumerate(cells):
            if cell["k"] == 1024 and cell["epsilon"] == 1.0 and label in cell["contenders"]:
                value = cell["contenders"][label]["reports_per_second"]
                path = f"cells[{i}].contenders[{label!r}].reports_per_second"
        entries.append(
            target(
                f"q-subset encoding, {keystream} keystream",
                "q-subset randomization + summation on one core "
                f"(simulate_counts + estimate; single-threaded numba kernels), {keystream} keystream",
                ">",
                ENCODING_GOAL,
                "reports/s",
                "k=1024 eps=1",
                value,
                file,
                path,
            )
        )
    return entries


def ingest_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    entries = []
    cells = [] if data is None else data["ingest"]
    stores = ("memory", "sqlite", "redis") if data is None else data["settings"]["stores"]

    def rate(k: int, epsilon: float, store: str, shape: str, field: str) -> tuple[float | None, str | None]:
        for i, cell in enumerate(cells):
            if cell["k"] == k and cell["epsilon"] == epsilon and shape in cell["stores"].get(store, {}):
                return cell["stores"][store][shape][field], f"ingest[{i}].stores.{store}.{shape}.{field}"
        return None, None

    for store in stores:
        value, path = rate(1024, 1.0, store, "large", "reports_per_second")
        entries.append(
            target(
                f"end to end, k=1024, 1000-report uploads, {store}",
                "end-to-end ingest (gRPC upload to the aggregator to the store), 1000-report uploads",
                ">=",
                LARGE_1024_GOAL,
                "reports/s",
                f"{store} k=1024 eps=1",
                value,
                file,
                path,
            )
        )
    for store in stores:
        for k in (16, 128):
            for epsilon in (1.0, 4.0):
                value, path = rate(k, epsilon, store, "large", "reports_per_second")
                entries.append(
                    target(
                        f"end to end, k<=128, 1000-report uploads, {store}",
                        "end-to-end ingest at k <= 128, 1000-report uploads",
                        ">=",
                        LARGE_SMALL_K_GOAL,
                        "reports/s",
                        f"{store} k={k} eps={epsilon:g}",
                        value,
                        file,
                        path,
                    )
                )
    for store in stores:
        for k in (16, 128, 1024):
            for epsilon in (1.0, 4.0):
                value, path = rate(k, epsilon, store, "small", "uploads_per_second")
                entries.append(
                    target(
                        f"end to end, 10-report uploads, {store}",
                        "end-to-end ingest of 10-report uploads",
                        ">=",
                        SMALL_UPLOADS_GOAL,
                        "uploads/s",
                        f"{store} k={k} eps={epsilon:g}",
                        value,
                        file,
                        path,
                    )
                )
    if "sqlite" in stores and "redis" in stores:
        for k in (16, 128, 1024):
            for epsilon in (1.0, 4.0):
                value, path = rate(k, epsilon, "sqlite", "small", "uploads_per_second")
                redis, redis_path = rate(k, epsilon, "redis", "small", "uploads_per_second")
                ratio = value / redis if value is not None and redis else None
                entries.append(
                    target(
                        "end to end, 10-report uploads, sqlite / redis",
                        "SQLite's 10-report uploads/s within 20% of Redis's, same run (issue 14)",
                        ">=",
                        SQLITE_SMALL_RATIO_GOAL,
                        "x",
                        f"k={k} eps={epsilon:g}",
                        ratio,
                        file,
                        path,
                        None if ratio is None else f"over {redis_path}",
                    )
                )
    latency = None if data is None else data.get("latency")
    for store in stores:
        for mode in ("cached", "fresh"):
            value = path = None
            if latency and latency["k"] == 1024 and len(latency["windows"]) == 3:
                row = latency["results"].get(store, {}).get("gRPC", {}).get(mode)
                if row is not None:
                    value, path = row["p99_ms"], f"latency.results.{store}.gRPC.{mode}.p99_ms"
            entries.append(
                target(
                    f"Estimates.Get p99, k=1024, 3 windows, {store}",
                    f"gRPC Estimates.Get p99 at k = 1024 with 3 windows ({mode}: "
                    + (
                        "counts unchanged since the last call)"
                        if mode == "cached"
                        else "an upload before each call, estimates recomputed)"
                    ),
                    "<=",
                    GET_P99_GOAL_MS,
                    "ms",
                    f"{store} {mode}",
                    value,
                    file,
                    path,
                )
            )
    return entries


def client_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    entries = []
    up = {} if data is None else data["latency"]["up"]
    for k in CLIENT_KS:
        for epsilon in (1.0, 4.0):
            cell = f"k={k} eps={epsilon:g}"
            row = up.get(cell, {}).get("memo off")
            value = path = None
            if (
                row
                and all(isinstance(row.get(f), (int, float)) and math.isfinite(row[f]) for f in ("median_us", "p99_us"))
                and row.get("calls", 0) > 0
            ):
                value = {"median_us": row["median_us"], "p99_us": row["p99_us"]}
                path = f"latency.up[{cell!r}]['memo off']"
            entries.append(
                {
                    "group": "SDK report() median and p99 published",
                    "target": "SDK report() median and p99 latency published (server up, memo off: a fresh randomized "
                    "response per call, the worst case)",
                    "goal": "published",
                    "operator": "published",
                    "threshold": None,
                    "unit": "us",
                    "scope": cell,
                    "measured": value,
                    "met": value is not None,
                    "source": None if path is None else {"file": file, "path": path},
                    **({"note": "not measured in these results"} if value is None else {}),
                }
            )
    bounds = {} if data is None else data["latency"].get("bounds", {})
    for k in CLIENT_KS:
        for epsilon in (1.0, 4.0):
            cell = f"k={k} eps={epsilon:g}"
            for series, memory in (("memo on", "up"), ("memo on, queue_dir", "bounds"), ("period bound", "bounds")):
                row = (up if memory == "up" else bounds).get(cell, {}).get(series)
                value = None if not row else row.get("median_us")
                path = (
                    f"latency.up[{cell!r}]['memo on']" if memory == "up" else f"latency.bounds[{cell!r}][{series!r}]"
                ) + ".median_us"
                entries.append(
                    {
                        "group": "SDK report() with the ledger and the period bound, memoized, median",
                        "target": f"report() median with the privacy ledger and the period bound ({series})",
                        "goal": "<= 10 us",
                        "operator": "<=",
                        "threshold": 10.0,
                        "unit": "us",
                        "scope": cell,
                        "measured": value,
                        "met": value is not None and value <= 10.0,
                        "source": None if value is None else {"file": file, "path": path},
                        **({"note": "not measured in these results"} if value is None else {}),
                    }
                )
    return entries


def series_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    entries = []
    # Issue 16's targets are for Redis and the embedded (SQLite) store; the memory store is measured
    # beside them in series.json, not a target.
    stores = [s for s in (SERIES_STORES if data is None else data["settings"]["stores"]) if s in SERIES_STORES]
    for store in stores:
        for name, goal, text in (
            ("series_720_hourly", SERIES_P99_GOAL_MS, "a series of 720 hourly buckets"),
            ("series_720_hourly_cold", SERIES_P99_GOAL_MS, "a series of 720 hourly buckets, first (cold) read"),
            ("merged_7_daily", MERGED_P99_GOAL_MS, "a 7-day merged estimate"),
        ):
            row = None if data is None else data["series"].get(store, {}).get(name)
            entries.append(
                target(
                    f"{text} p99, k=1024, {store}",
                    f"{text} at k = 1024 answers (p99)",
                    "<=",
                    goal,
                    "ms",
                    store,
                    None if row is None else row["p99_ms"],
                    file,
                    None if row is None else f"series.{store}.{name}.p99_ms",
                )
            )
    return entries


def cli_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    entries = []
    for name, text in (("veil_specs", "veil specs"), ("veil_estimates", "veil estimates")):
        row = None if data is None else data["cli"].get(name)
        floor = None if data is None else data["cli"]["python_grpc_wire"]["median_ms"]
        entries.append(
            target(
                f"`{text}` against a running aggregator, spawn to exit (median)",
                f"`{text}` starts and answers",
                "<=",
                CLI_START_GOAL_MS,
                "ms",
                "cli",
                None if row is None else row["median_ms"],
                file,
                None if row is None else f"cli.{name}.median_ms",
                None if floor is None else f"python importing grpc and the wire module: {floor:.0f} ms",
            )
        )
    return entries


# The listener a capacity run measured, in words. "native": results recorded before the native
# collector (server.native_grpc) was removed (bench/PROFILES.md section 4).
_THROUGH = {
    "native": " through the since removed native listener, server.native_grpc,",
    "grpcio": " through the grpcio listener, server.grpc,",
}


def capacity_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    """Issue 17's per-core efficiency, through the listener the rows were measured on, per store
    variant measured; another listener's ratio beside it is for comparison only. (Results of
    before the native collector's removal were measured through it: their listener says so.)"""
    entries = []
    checks = {} if data is None else data["checks"]
    listener = None if data is None else data["settings"].get("rows_listener")
    through = _THROUGH.get(listener, "").rstrip(",")
    for name, check in checks.items():
        if not name.startswith("efficiency_") or check.get("listener") != listener:
            continue
        store = name.removeprefix("efficiency_")
        grpcio = check.get("grpcio")
        entries.append(
            target(
                f"10-report uploads per aggregator CPU second / a do-nothing grpcio server's calls,{through}",
                "10-report uploads per aggregator core >= 75% of the calls/s of a grpcio server with a do-nothing "
                f"handler, same run, same load generator (issue 17),{through}",
                ">=",
                EFFICIENCY_GOAL,
                "%",
                store,
                check["ratio"],
                file,
                f"checks[{name!r}].ratio",
                None if grpcio is None else f"through server.grpc (grpcio), for comparison: {grpcio['ratio']:.0%}",
            )
        )
    return entries


def device_day_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    """Issue 26's device-day efficiency, per store and protocol measured; the keep-alive
    10-report cell of the same run beside it."""
    entries = []
    checks = {} if data is None else data["checks"]
    for name, check in checks.items():
        keepalive = check["keepalive"]
        entries.append(
            target(
                "device-days per aggregator CPU second / a do-nothing server's",
                "a device-day (new TLS connection, specs check, one upload of 10 metrics) per aggregator CPU "
                ">= 75% of a do-nothing server's device-days per CPU second, same calls, TLS and load (issue 26)",
                ">=",
                DEVICE_DAY_GOAL,
                "%",
                f"{check['store']} {check['protocol']}",
                check["ratio"],
                file,
                f"checks[{name!r}].ratio",
                f"{check['calls']}; keep-alive 10-report uploads, same run: {measured_ratio(keepalive)}",
            )
        )
    return entries


def all_targets(results: dict[str, Any], sources: dict[str, Any]) -> list[dict[str, Any]]:
    def file(name: str) -> str | None:
        return sources[name]["file"] if name in results else None

    return (
        randomize_targets(results.get("randomize"), file("randomize"))
        + ingest_targets(results.get("ingest"), file("ingest"))
        + client_targets(results.get("client"), file("client"))
        + series_targets(results.get("series"), file("series"))
        + cli_targets(results.get("cli"), file("cli"))
        + capacity_targets(results.get("capacity"), file("capacity"))
        + device_day_targets(results.get("device_day"), file("device_day"))
    )


def grouped(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target group: how many entries met it and the worst entry."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in targets:
        groups.setdefault(entry["group"], []).append(entry)
    rows = []
    for name, entries in groups.items():
        numeric = [e for e in entries if isinstance(e["measured"], (int, float))]
        if numeric:
            pick = min if entries[0]["operator"] in (">=", ">") else max
            worst = pick(numeric, key=lambda e: e["measured"])
        else:
            worst = next((e for e in entries if not e["met"]), entries[0])
        rows.append(
            {
                "group": name,
                "goal": entries[0]["goal"],
                "unit": entries[0]["unit"],
                "worst": worst,
                "met": sum(e["met"] for e in entries),
                "entries": len(entries),
                "measured": sum(e["measured"] is not None for e in entries),
            }
        )
    return rows


# --- checks -----------------------------------------------------------------------------------


def correctness(results: dict[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    if "randomize" in results:
        failed = [
            f"k={cell['k']} eps={cell['epsilon']:g} {label}"
            for cell in results["randomize"]["cells"]
            for label, row in cell["contenders"].items()
            if not row["sanity"]["ok"]
        ]
        checks["randomize_sanity_ok"] = not failed
        checks["randomize_sanity_failures"] = failed
    if "ingest" in results:
        exact = results["ingest"]["exact_counts"]
        checks["ingest_exact_counts_ok"] = bool(exact["ok"])
        checks["ingest_exact_count_checks"] = exact["checks"]
        checks["ingest_exact_count_failures"] = exact["failures"]
        checks["ingest_latency_sanity_ok"] = bool(results["ingest"]["summary"]["latency_sanity_ok"])
    if "capacity" in results:
        exact = results["capacity"]["exact_counts"]
        checks["capacity_exact_counts_ok"] = bool(exact["ok"])
        checks["capacity_exact_count_failures"] = exact["failures"]
    if "device_day" in results:
        exact = results["device_day"]["exact_counts"]
        checks["device_day_exact_counts_ok"] = bool(exact["ok"])
        checks["device_day_exact_count_failures"] = exact["failures"]
    if "client" in results:
        dropped = [
            f"{phase} {cell} {mode}"
            for phase in ("up", "down")
            for cell, modes in results["client"]["latency"][phase].items()
            for mode, row in modes.items()
            if row.get("dropped")
        ]
        checks["client_no_drops"] = not dropped
        checks["client_drops"] = dropped
    return checks


# --- the table ----------------------------------------------------------------------------------


def si(value: float | None) -> str:
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}x" if value >= 10 else f"{value:.1f}x"


class Table:
    """A titled table that prints as aligned text or as Markdown."""

    def __init__(
        self,
        title: str,
        headers: list[str],
        right: set[int] | None = None,
        note: str = "",
        code: set[int] | None = None,
    ) -> None:
        self.title, self.headers, self.note = title, headers, note
        self.right = right if right is not None else set(range(2, len(headers)))
        self.code = code or set()  # columns shown as code in Markdown
        self.rows: list[list[str]] = []

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self, markdown: bool) -> str:
        if markdown:
            lines = [f"#### {self.title}", ""]
            if self.note:
                lines += [self.note, ""]
            lines.append("| " + " | ".join(self.headers) + " |")
            lines.append("|" + "|".join("---:" if i in self.right else "---" for i in range(len(self.headers))) + "|")
            lines += [
                "| "
                + " | ".join(
                    f"`{c}`" if i in self.code and c != "-" else c.replace("|", "\\|") for i, c in enumerate(row)
                )
                + " |"
                for row in self.rows
            ]
            return "\n".join(lines)
        widths = [max(len(r[i]) for r in [self.headers, *self.rows]) for i in range(len(self.headers))]

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.rjust(w) if i in self.right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
            ).rstrip()

        lines = [self.title]
        if self.note:
            lines.append(self.note)
        lines += ["", line(self.headers), line(["-" * w for w in widths]), *map(line, self.rows)]
        return "\n".join(lines)


def randomize_table(data: dict[str, Any]) -> Table:
    table = Table(
        "Batch randomize + sum + estimate, reports/s (one core; Nx = Veil / peer, same run)",
        [
            "k",
            "eps",
            SS_PEER,
            OUE_PEER,
            "Veil subset fast",
            "Veil subset AES",
            GRR_PEER,
            "Veil krr fast",
            "Veil krr AES",
        ],
        right=set(range(9)),
        note="fast = seeded FastKeystream (simulation only); AES = AesCtrKeystream (the CSPRNG default); "
        f"median of {rounds(data['settings']['rounds'])}, peers and Veil interleaved.",
    )
    for cell in data["cells"]:
        rows = cell["contenders"]
        ratios = {(c["veil"], c["peer"]): c["ratio"] for c in cell["comparisons"]}

        def veil(label: str, peers: list[tuple[str, str]]) -> str:
            if label not in rows:  # noqa: B023 (called within this iteration)
                return "-"
            parts = ", ".join(f"{ratio(ratios.get((label, peer)))} {short}" for peer, short in peers)  # noqa: B023 (called within this iteration)
            return f"{si(rows[label]['reports_per_second'])} ({parts})"  # noqa: B023 (called within this iteration)

        def peer(label: str) -> str:
            return si(rows[label]["reports_per_second"]) if label in rows else "-"  # noqa: B023 (called within this iteration)

        subset_peers = [(SS_PEER, "SS"), (OUE_PEER, "OUE")]
        table.add(
            cell["k"],
            f"{cell['epsilon']:g}",
            peer(SS_PEER),
            peer(OUE_PEER),
            veil("Veil subset fast", subset_peers),
            veil("Veil subset AES", subset_peers),
            peer(GRR_PEER),
            veil("Veil krr fast", [(GRR_PEER, "GRR")]),
            veil("Veil krr AES", [(GRR_PEER, "GRR")]),
        )
    return table


def client_table(data: dict[str, Any]) -> Table:
    table = Table(
        "SDK report() latency, subset design, microseconds per call: median / p99",
        [
            "k",
            "eps",
            "bare randomize",
            "report() memo off",
            "report() memo on",
            "memo on, queue_dir",
            "period bound",
            "report() server down, memo off",
            "upload reports/s",
        ],
        right=set(range(9)),
        note="memo off: a fresh randomized response (OS CSPRNG) per call, the worst case; memo on: the "
        "steady state, each call admitted by the privacy ledger (queue_dir: the ledger's file "
        "appended too); period bound: the day's one report sent, the call refused on the device. "
        "Server up unless marked; upload = report() .. force_flush(), batches of 512.",
    )
    latency = data["latency"]

    def pair(row: dict[str, Any] | None) -> str:
        return "-" if row is None else f"{row['median_us']:.1f} / {row['p99_us']:.1f}"

    for cell, bare in latency["bare_randomize"].items():
        k, epsilon = (part.split("=")[1] for part in cell.split())
        up, down = latency["up"].get(cell, {}), latency["down"].get(cell, {})
        throughput = data.get("throughput", {}).get(cell)
        bounds = latency.get("bounds", {}).get(cell, {})
        table.add(
            k,
            epsilon,
            pair(bare),
            pair(up.get("memo off")),
            pair(up.get("memo on")),
            pair(bounds.get("memo on, queue_dir")),
            pair(bounds.get("period bound")),
            pair(down.get("memo off")),
            si(throughput["reports_per_second"]) if throughput else "-",
        )
    return table


def footprint_table(data: dict[str, Any]) -> Table:
    """What embedding the SDK costs an app, per transport (bench_footprint.py)."""
    rows = data["footprint"]
    table = Table(
        f"SDK footprint, fresh processes, median of {rows['import']['runs']}",
        ["case", "import ms", "RSS MB", "OS threads", "Reporter ms", "grpc loaded"],
        right={1, 2, 3, 4},
        note="import: `import veil.client`; reporter: then an idle Reporter whose specs arrived (RSS and "
        "threads of the whole process); python: the interpreter alone.",
    )
    for name, label in (
        ("python", "python alone"),
        ("import", "import veil.client"),
        ("reporter_http", "idle Reporter, HTTP"),
        ("reporter_grpc", "idle Reporter, gRPC"),
    ):
        row = rows.get(name)
        if row is None:
            continue
        stage = "reporter" if "reporter_rss_mb" in row else "import" if "import_rss_mb" in row else "python"
        table.add(
            label,
            f"{row['import_ms']:.0f}" if "import_ms" in row else "-",
            f"{row[f'{stage}_rss_mb']:.1f}",
            str(row[f"{stage}_threads"]),
            f"{row['reporter_ms']:.0f}" if stage == "reporter" else "-",
            "yes" if row.get("grpc_loaded", row.get("grpc_loaded_by_import")) else "no",
        )
    return table


def rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def ingest_table(data: dict[str, Any]) -> Table:
    shapes = data["settings"]["shapes"]
    stores = data["settings"]["stores"]
    columns = [(store, shape) for shape in shapes for store in stores]
    headers = ["k", "eps"]
    for store, shape in columns:
        s = shapes[shape]
        headers.append(f"{store}, {s['batch']}-report uploads x {s['in_flight']}")
    headers.append("counts")
    table = Table(
        "End to end: gRPC uploads into an aggregator process, per store; reports/s (uploads/s)",
        headers,
        right=set(range(len(headers) - 1)),
        note=f"Subset design, windows {', '.join(data['settings']['windows'])}; "
        f"{data['settings']['load_processes']} load processes; "
        f"median of {rounds(data['settings']['rounds'])}. "
        "counts: every store read back after every run, n and V exact.",
    )
    for cell in data["ingest"]:
        parts = []
        exact = True
        for store, shape in columns:
            row = cell["stores"].get(store, {}).get(shape)
            if row is None:
                parts.append("-")
                continue
            exact = exact and row["exact"]
            parts.append(f"{si(row['reports_per_second'])} ({si(row['uploads_per_second'])})")
        table.add(cell["k"], f"{cell['epsilon']:g}", *parts, "exact" if exact else "WRONG")
    return table


def efficiency_text(check: dict[str, Any]) -> str:
    """A ratio of bench_capacity's efficiency checks: median (and the range of the rounds)."""
    rounds = check.get("ratio_rounds", ())
    spread = f" ({min(rounds):.0%}-{max(rounds):.0%})" if len(rounds) > 1 else ""
    return f"{check['ratio']:.0%}{spread}"


def capacity_table(data: dict[str, Any]) -> Table:
    """bench_capacity.py's predictions: N aggregator cores, the masters that keep up, uploads/s."""
    checks = data["checks"]
    efficiency = {name.removeprefix("efficiency_"): c for name, c in checks.items() if name.startswith("efficiency_")}
    measured = ", ".join(f"{store} {efficiency_text(c)}" for store, c in efficiency.items())
    grpcio = ", ".join(f"{store} {efficiency_text(c['grpcio'])}" for store, c in efficiency.items() if "grpcio" in c)
    listener = data["settings"].get("rows_listener")
    even = next((check for name, check in checks.items() if name.endswith("_masters_even")), None)
    processes = next((check for name, check in checks.items() if name.endswith("_processes")), None)
    through = _THROUGH.get(listener, "")
    table = Table(
        f"Capacity model (Redis Cluster, store.shards = {data['settings']['cluster_shards'][0]}): "
        "N one-core aggregators and the M masters that keep up",
        ["k", "uploads", "N cores", "M masters", "uploads/s", "reports/s", "bound by"],
        right={0, 2, 3, 4, 5},
        note=f"CPU us per upload{through} measured by bench_capacity.py "
        f"(median of {rounds(data['settings']['rounds'])}). "
        f"10-report uploads per aggregator CPU second / calls per CPU second of a do-nothing grpcio "
        f"server, median (and range) of the rounds"
        + (
            f",{through} {measured} (goal 75%); through the grpcio listener (server.grpc), "
            f"same rounds, for comparison: {grpcio}."
            if grpcio
            else f",{through} {measured} (goal 75%)."
        )
        + (f" Per-master CPU, the whole run: spread {even['overall_spread']:.0%} (goal <= 10%)." if even else "")
        + (
            f" 10-report uploads/s at k = {data['settings']['ks'][0]}, 1 vs 2 aggregator processes on the "
            f"cluster: {si(processes['one'])} vs {si(processes['two'])}."
            if processes
            else ""
        ),
    )
    for p in data["predictions"]:
        batch = 10 if p["shape"] == "small" else 1000
        table.add(
            p["k"],
            f"{batch}-report",
            p["cores"],
            p["masters"],
            si(p["uploads_per_second"]),
            si(p["reports_per_second"]),
            p["bound"],
        )
    return table


def measured_ratio(check: dict[str, Any]) -> str:
    """efficiency_text of a device-day ratio, "-" where none was measured (a --quick turn too
    short for a CPU tick)."""
    if check["ratio"] is None:
        return "-"
    return efficiency_text({**check, "ratio_rounds": [r for r in check["ratio_rounds"] if r is not None]})


def device_day_table(data: dict[str, Any]) -> Table:
    """bench_device_day.py: the device-day's cost against a do-nothing server, and the devices an
    aggregator core carries."""
    settings = data["settings"]
    model = settings["model"]
    machine = data["machine"]
    table = Table(
        "The device-day: a new TLS connection, the specs check, one upload of a device's 10 metrics; devices "
        "per aggregator core",
        [
            "store",
            "protocol",
            "device-days per CPU s, / do-nothing",
            "aggregator us per device-day",
            "do-nothing us",
            "keep-alive 10-report uploads, / do-nothing",
            "devices per core",
            f"cores for {si(model['fleet'])} devices",
        ],
        right={2, 3, 4, 5, 6, 7},
        note=f"Measured by bench_device_day.py, median (and range) of {rounds(settings['rounds'])} of A-B-B-A "
        "against a do-nothing grpcio or aiohttp server with the same TLS, calls and load, each by its own "
        f"process's CPU (goal {DEVICE_DAY_GOAL:.0%}); load average {machine['load_average_before'][0]:.1f} before, "
        f"{machine['load_average_after'][0]:.1f} after. Devices per core: device-days per core-second x 86,400 / "
        f"{model['peak']} (one device-day per device per day, a peak of {model['peak']}x the average: "
        f"{si(model['fleet'])} devices are {model['fleet'] / 86_400:,.0f} device-days/s, "
        f"{model['fleet'] / 86_400 * model['peak']:,.0f} at the peak); on Redis, the masters (Redis cores at their "
        "measured CPU per device-day) needed beside them.",
    )
    for row in data["rows"]:
        if row["kind"] != "day":
            continue
        check = data["checks"][f"device_day_{row['store']}_{row['protocol']}"]
        fleet = row["model"]
        masters = None if fleet is None else fleet["fleet_masters"]
        table.add(
            row["store"],
            f"{row['protocol']} (revision {row['revision']})",
            measured_ratio(check),
            f"{row['aggregator_us_per_device_day']:.0f}",
            f"{row['null_us_per_device_day']:.0f}",
            measured_ratio(check["keepalive"]),
            "-" if fleet is None else si(fleet["devices_per_core"]),
            "-"
            if fleet is None
            else f"{fleet['fleet_cores']}" + ("" if masters is None else f" (+ {masters} masters)"),
        )
    return table


def latency_table(data: dict[str, Any]) -> Table | None:
    latency = data.get("latency")
    if not latency:
        return None
    table = Table(
        f"Estimates at k = {latency['k']}, epsilon = {latency['epsilon']:g}, windows "
        f"{', '.join(latency['windows'])}: one call at a time, milliseconds, median / p99",
        ["store", "call", "cached", "fresh", "response"],
        note="cached: counts unchanged since the last call; fresh: an upload before each call, so the "
        "estimates are recomputed.",
    )
    for store, protocols in latency["results"].items():
        for protocol, modes in protocols.items():
            call = "gRPC Estimates.Get" if protocol == "gRPC" else f"HTTP GET {latency['path']}"
            cells = [
                f"{modes[m]['median_ms']:.2f} / {modes[m]['p99_ms']:.2f}" if m in modes else "-"
                for m in ("cached", "fresh")
            ]
            ok = all(row["sanity"]["ok"] for row in modes.values())
            table.add(store, call, *cells, "OK" if ok else "MALFORMED")
    return table


def measured_text(entry: dict[str, Any]) -> str:
    value = entry["measured"]
    if value is None:
        return "not measured"
    if isinstance(value, dict):
        return f"median {value['median_us']:.1f} us, p99 {value['p99_us']:.1f} us"
    unit = entry["unit"]
    if unit == "%":
        return f"{value:.0%}"
    if unit == "x":
        return f"{ratio(value)}"
    if unit == "ms":
        return f"{value:.2f} ms"
    return f"{si(value)} {unit}"


def targets_table(targets: list[dict[str, Any]]) -> Table:
    table = Table(
        "Targets: met / entries, and the worst entry with its source",
        ["target", "goal", "worst measured", "met", "source of the worst"],
        right={3},
        code={4},
        note="Every entry, with its exact source, is in the targets list of latest.json.",
    )
    for row in grouped(targets):
        worst = row["worst"]
        source = worst["source"]
        where = "-" if source is None else f"{Path(source['file']).name}: {source['path']}"
        verdict = f"{row['met']}/{row['entries']}" + (" MET" if row["met"] == row["entries"] else " NOT MET")
        if row["measured"] < row["entries"]:
            verdict += f" ({row['entries'] - row['measured']} not measured)"
        if worst["group"].startswith("SDK"):
            measured = f"{row['measured']} of {row['entries']} cells published"
        else:
            measured = f"{measured_text(worst)} ({worst['scope']})"
        table.add(row["group"], row["goal"], measured, verdict, where)
    return table


def render(document: dict[str, Any], results: dict[str, Any], markdown: bool) -> str:
    machine = document["machine"]
    out: list[str] = []
    heading = f"Veil benchmarks: {machine_line(machine)}"
    out.append(f"### {heading}" if markdown else heading)
    dates = ", ".join(f"{name} {date}" for name, date in machine["dates"].items())
    out.append(f"Results: {', '.join(s['file'] for s in document['sources'].values())} ({dates}).")
    if document["quick"]:
        out.append("QUICK SMOKE RUN: tiny runs; the rates and verdicts below mean nothing (the correctness checks do).")
    if machine["differences"]:
        out.append(f"The benchmarks ran on different machines or software: {json.dumps(machine['differences'])}")
    tables = []
    if "randomize" in results:
        tables.append(randomize_table(results["randomize"]))
    if "client" in results:
        tables.append(client_table(results["client"]))
    if "ingest" in results:
        tables.append(ingest_table(results["ingest"]))
        latency = latency_table(results["ingest"])
        if latency is not None:
            tables.append(latency)
    if "capacity" in results:
        tables.append(capacity_table(results["capacity"]))
    if "device_day" in results:
        tables.append(device_day_table(results["device_day"]))
    if "footprint" in results:
        tables.append(footprint_table(results["footprint"]))
    tables.append(targets_table(document["targets"]))
    for table in tables:
        out += ["", table.render(markdown)]
    out.append("")
    out += verdict_lines(document)
    if markdown:  # each line of the head and of the verdicts a paragraph of its own
        return "\n\n".join(part for part in out if part)
    return "\n".join(out)


def verdict_lines(document: dict[str, Any]) -> list[str]:
    checks = document["checks"]
    lines = [f"PROBLEM: {problem}" for problem in document["problems"]]
    for name in ("ingest", "capacity", "device_day"):
        for failure in checks.get(f"{name}_exact_count_failures", []):
            lines.append(f"COUNT CHECK FAILED: {failure}")
    for failure in checks.get("randomize_sanity_failures", []):
        lines.append(f"SANITY CHECK FAILED: {failure}")
    if checks.get("ingest_latency_sanity_ok") is False:
        lines.append("ESTIMATES RESPONSE MALFORMED (see the estimate latency table)")
    exact = checks.get("ingest_exact_counts_ok")
    summary = document["summary"]
    lines.append(
        f"Targets met: {summary['targets_met']} of {summary['targets']} entries. "
        + (
            "Exact counts: " + (f"all {checks['ingest_exact_count_checks']} checks OK" if exact else "FAILED")
            if exact is not None
            else "Exact counts: not checked (no ingest results)"
        )
        + f". Overall: {'OK' if summary['ok'] else 'FAILED'}."
    )
    return lines


# --- the plot -----------------------------------------------------------------------------------


RANDOMIZE_SERIES = (
    ("Veil subset fast", "#08519c"),
    ("Veil subset AES", "#4292c6"),
    ("Veil krr fast", "#006d2c"),
    ("Veil krr AES", "#41ab5d"),
    (SS_PEER, "#d94801"),
    (GRR_PEER, "#fd8d3c"),
    (OUE_PEER, "#737373"),
)
INGEST_COLORS = {
    ("memory", "large"): "#08519c",
    ("redis", "large"): "#a50f15",
    ("sqlite", "large"): "#006d2c",
    ("memory", "small"): "#6baed6",
    ("redis", "small"): "#fb6a4a",
    ("sqlite", "small"): "#74c476",
}


def grouped_bars(axis: Any, groups: list[str], series: list[tuple[str, str, list[float | None]]]) -> None:
    width = 0.84 / max(1, len(series))
    for index, (label, color, values) in enumerate(series):
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v else math.nan for v in values]
        axis.bar(xs, heights, width, label=label, color=color, edgecolor="white", linewidth=0.5)
    axis.set_xticks(range(len(groups)), groups)
    axis.set_yscale("log")
    axis.grid(axis="y", which="major", alpha=0.4)
    axis.grid(axis="y", which="minor", alpha=0.12)
    axis.set_axisbelow(True)


def plot(document: dict[str, Any], results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter

    panels = [name for name in ("randomize", "ingest") if name in results]
    figure, axes = pyplot.subplots(1, max(1, len(panels)), figsize=(8.5 * max(1, len(panels)), 7), squeeze=False)
    axes = list(axes[0])
    per_second = FuncFormatter(lambda v, _: si(v))

    def cell_label(k: int, epsilon: float) -> str:
        return f"k = {k}\n\u03b5 = {epsilon:g}"

    if "randomize" in results:
        axis = axes[panels.index("randomize")]
        cells = results["randomize"]["cells"]
        series = [
            (label, color, [c["contenders"].get(label, {}).get("reports_per_second") for c in cells])
            for label, color in RANDOMIZE_SERIES
            if any(label in c["contenders"] for c in cells)
        ]
        grouped_bars(axis, [cell_label(c["k"], c["epsilon"]) for c in cells], series)
        axis.set_title(
            "Batch randomize + sum + estimate, one core\n"
            "Veil (fast = seeded SFC64, AES = CSPRNG keystream) vs peers, same run"
        )
        axis.set_ylabel("reports per second (log scale)")
        axis.set_xlabel("categories k, privacy level \u03b5")
        axis.yaxis.set_major_formatter(per_second)
        axis.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    if "ingest" in results:
        axis = axes[panels.index("ingest")]
        data = results["ingest"]
        cells = data["ingest"]
        shapes = data["settings"]["shapes"]
        series = []
        for shape in shapes:
            for store in data["settings"]["stores"]:
                s = shapes[shape]
                values = [c["stores"].get(store, {}).get(shape, {}).get("reports_per_second") for c in cells]
                series.append(
                    (
                        f"{store}, {s['batch']}-report uploads, {s['in_flight']} in flight",
                        INGEST_COLORS.get((store, shape), None),
                        values,
                    )
                )
        groups = [cell_label(c["k"], c["epsilon"]) for c in cells]
        grouped_bars(axis, groups, series)
        small_batch = shapes.get("small", {}).get("batch", 10)
        for goal, which, text, style in (
            (LARGE_SMALL_K_GOAL, lambda k: k <= 128, "target, 1000-report uploads, k <= 128", "dashed"),
            (LARGE_1024_GOAL, lambda k: k == 1024, "target, 1000-report uploads, k = 1024", "dashed"),
            (
                SMALL_UPLOADS_GOAL * small_batch,
                lambda k: True,
                f"target, 10-report uploads: {si(SMALL_UPLOADS_GOAL)} uploads/s = "
                f"{si(SMALL_UPLOADS_GOAL * small_batch)} reports/s",
                "dotted",
            ),
        ):
            xs = [i for i, c in enumerate(cells) if which(c["k"])]
            if xs:
                axis.hlines(goal, min(xs) - 0.45, max(xs) + 0.45, colors="black", linestyles=style, linewidth=1)
                axis.annotate(text, (min(xs) - 0.45, goal), xytext=(2, 3), textcoords="offset points", fontsize=7)
        exact = document["checks"].get("ingest_exact_counts_ok")
        axis.set_title(
            "End to end: gRPC uploads -> aggregator process -> store\n"
            f"exact counts checked after every run: {'all OK' if exact else 'FAILED'}"
        )
        axis.set_ylabel("reports acknowledged per second (log scale)")
        axis.set_xlabel("categories k, privacy level \u03b5")
        axis.yaxis.set_major_formatter(per_second)
        axis.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    title = f"Veil throughput by k and \u03b5: {machine_line(document['machine'])}"
    if document["quick"]:
        title += "\nQUICK SMOKE RUN: the numbers mean nothing"
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    figure.savefig(scratch, dpi=110, format="png")
    pyplot.close(figure)
    scratch.replace(path)


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


# --- running the benchmarks ---------------------------------------------------------------------


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


# --- command line -------------------------------------------------------------------------------


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
