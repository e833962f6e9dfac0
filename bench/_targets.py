"""The targets list of latest.json: each goal of _goals against the number a benchmark's
results hold for it (target, goal, measured, met, and the exact source: file and JSON path), one
entry per cell, store or protocol measured; grouped (a row per goal); and the correctness checks
(exact counts, sanity bands, drops) that decide the report's exit status.
"""

from __future__ import annotations

import math
from typing import Any

from _format import THROUGH, measured_ratio, si
from _goals import (
    CLI_START_GOAL_MS,
    CLIENT_KS,
    DEVICE_DAY_GOAL,
    EFFICIENCY_GOAL,
    ENCODING_GOAL,
    GET_P99_GOAL_MS,
    LARGE_1024_GOAL,
    LARGE_SMALL_K_GOAL,
    LEDGER_REPORT_GOAL_US,
    MERGED_P99_GOAL_MS,
    RATIO_GOALS,
    SERIES_P99_GOAL_MS,
    SERIES_STORES,
    SMALL_UPLOADS_GOAL,
    SQLITE_SMALL_RATIO_GOAL,
)

__all__ = ["GRR_PEER", "OUE_PEER", "SS_PEER", "all_targets", "correctness", "grouped"]

SS_PEER, GRR_PEER, OUE_PEER = "multi-freq-ldpy SS", "multi-freq-ldpy GRR", "pure-ldp OUE"  # the peers' labels


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
                        "goal": f"<= {LEDGER_REPORT_GOAL_US:g} us",
                        "operator": "<=",
                        "threshold": LEDGER_REPORT_GOAL_US,
                        "unit": "us",
                        "scope": cell,
                        "measured": value,
                        "met": value is not None and value <= LEDGER_REPORT_GOAL_US,
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


def capacity_targets(data: dict[str, Any] | None, file: str | None) -> list[dict[str, Any]]:
    """Issue 17's per-core efficiency, through the listener the rows were measured on, per store
    variant measured; another listener's ratio beside it is for comparison only. (Results of
    before the native collector's removal were measured through it: their listener says so.)"""
    entries = []
    checks = {} if data is None else data["checks"]
    listener = None if data is None else data["settings"].get("rows_listener")
    through = THROUGH.get(listener, "").rstrip(",")
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
