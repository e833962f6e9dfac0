"""The report's tables: one per benchmark's results and one of the targets, each printable as
aligned text or as Markdown (bench/README.md's), and render, which puts them together under the
machine line with the verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _format import THROUGH, efficiency_text, machine_line, measured_ratio, ratio, si
from _goals import DEVICE_DAY_GOAL
from _targets import GRR_PEER, OUE_PEER, SS_PEER, grouped

__all__ = ["Table", "render"]


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


def capacity_table(data: dict[str, Any]) -> Table:
    """bench_capacity.py's predictions: N aggregator cores, the masters that keep up, uploads/s."""
    checks = data["checks"]
    efficiency = {name.removeprefix("efficiency_"): c for name, c in checks.items() if name.startswith("efficiency_")}
    measured = ", ".join(f"{store} {efficiency_text(c)}" for store, c in efficiency.items())
    grpcio = ", ".join(f"{store} {efficiency_text(c['grpcio'])}" for store, c in efficiency.items() if "grpcio" in c)
    listener = data["settings"].get("rows_listener")
    even = next((check for name, check in checks.items() if name.endswith("_masters_even")), None)
    processes = next((check for name, check in checks.items() if name.endswith("_processes")), None)
    through = THROUGH.get(listener, "")
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
