"""The benchmarks and their report run end to end (smoke runs: their numbers mean nothing, and
nothing here asserts on a time).

The report (targets, tables, plot, README block, failed checks) is checked on a copy of the
committed results of the last full run, bench/results/. One quick run of every benchmark through
the report's --run (what `make bench-quick` does) is in the slow suite: it costs some 80 CPU
seconds, a sixth of the default suite's, and exercises the benchmarks, not the product.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from veil_testing.benchlib import BENCH_DIR, load_script

BENCHMARKS = ("randomize", "client", "ingest", "capacity", "device_day", "series", "cli", "footprint")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report_module():
    """bench/report.py as a module (a script, so not importable by name)."""
    return load_script("report")


def run_report(report, argv: list[str]) -> tuple[int, str]:
    """report.main(argv) and what it printed on stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = report.main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def quick_run(report_module, tmp_path_factory):
    """bench/report.py --run --quick on k in {16, 1024}, epsilon 1, both stores (about 30 s)."""
    directory = tmp_path_factory.mktemp("bench-quick")
    code, printed = run_report(
        report_module,
        [
            "--run",
            "--quick",
            "--results-dir",
            str(directory),
            "--ks",
            "16",
            "1024",
            "--epsilons",
            "1",
            "--stores",
            "memory",
            "redis",
        ],
    )
    # As the run wrote it (a test below writes latest.json again from the same files).
    latest = json.loads((directory / "latest.json").read_text())
    return directory, code, printed, latest


@pytest.fixture(scope="module")
def committed(report_module, tmp_path_factory):
    """The report run alone on a copy of the committed results of each benchmark: the
    directory, its exit status and what it printed, and the latest.json it wrote."""
    directory = tmp_path_factory.mktemp("bench-committed")
    for name in BENCHMARKS:
        shutil.copy(BENCH_DIR / "results" / f"{name}.json", directory / f"{name}.json")
    code, printed = run_report(report_module, ["--results-dir", str(directory)])
    return directory, code, printed, json.loads((directory / "latest.json").read_text())


def lookup(document: Any, path: str) -> Any:
    """Follow a source path of the targets list (a.b[0]['key'].c) into a results document."""
    position = 0
    token = re.compile(r"\.?([A-Za-z_][A-Za-z_0-9]*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*')\]")
    while position < len(path):
        match = token.match(path, position)
        assert match, f"cannot read the source path {path!r} at {position}"
        name, index, quoted = match.groups()
        document = document[name if name else int(index) if index else ast.literal_eval(quoted)]
        position = match.end()
    return document


@pytest.mark.slow
def test_quick_run_writes_every_benchmark_and_the_combined_results(quick_run):
    directory, code, printed, latest = quick_run
    assert code == 0, printed
    randomize = json.loads((directory / "randomize.json").read_text())
    assert randomize["benchmark"] == "randomize" and randomize["summary"]["sanity_ok"] is True
    assert [(c["k"], c["epsilon"]) for c in randomize["cells"]] == [(16, 1.0), (1024, 1.0)]
    client = json.loads((directory / "client.json").read_text())
    assert client["benchmark"] == "client" and client["settings"]["quick"] is True
    ingest = json.loads((directory / "ingest.json").read_text())
    assert ingest["summary"]["exact_counts_ok"] is True and ingest["exact_counts"]["checks"] > 0
    assert ingest["settings"]["stores"] == ["memory", "redis"]

    capacity = json.loads((directory / "capacity.json").read_text())
    assert capacity["exact_counts"]["ok"] is True and capacity["exact_counts"]["checks"] > 0
    assert {row["store"] for row in capacity["rows"]} == {"memory", "redis"}
    assert {name for name in capacity["checks"]} == {"efficiency_memory", "efficiency_redis"}
    # The device-day on the stores it measures of those asked (Redis), over both protocols, the
    # keep-alive cell beside each; every acknowledged report read back exact.
    device_day = json.loads((directory / "device_day.json").read_text())
    assert device_day["exact_counts"]["ok"] is True and device_day["exact_counts"]["checks"] > 0
    assert device_day["settings"]["stores"] == ["redis"]
    assert {(r["store"], r["protocol"], r["kind"]) for r in device_day["rows"]} == {
        ("redis", protocol, kind) for protocol in ("grpc", "http") for kind in ("day", "keepalive")
    }
    assert set(device_day["checks"]) == {"device_day_redis_grpc", "device_day_redis_http"}
    assert all(r["tls_sessions_resumed"] == 0 for r in device_day["rows"])
    series = json.loads((directory / "series.json").read_text())
    assert set(series["series"]) == {"memory", "redis"} and series["settings"]["quick"] is True
    assert series["series"]["redis"]["series_720_hourly"]["buckets"] == 721

    cli = json.loads((directory / "cli.json").read_text())
    assert set(cli["cli"]) >= {"veil_specs", "veil_estimates"} and cli["settings"]["quick"] is True

    footprint = json.loads((directory / "footprint.json").read_text())["footprint"]
    assert footprint["reporter_http"]["grpc_loaded"] is False and footprint["reporter_grpc"]["grpc_loaded"] is True
    assert footprint["import"]["grpc_loaded_by_import"] is False

    assert set(latest["benchmarks"]) == set(BENCHMARKS)
    assert latest["benchmarks"]["ingest"] == ingest  # each benchmark's results as it wrote them
    assert latest["quick"] is True and latest["summary"]["ok"] is True and not latest["problems"]
    assert latest["machine"]["cpu_count"] >= 1 and latest["machine"]["python"]
    assert latest["checks"]["ingest_exact_counts_ok"] is True
    for name, source in latest["sources"].items():
        assert source["run"]["exit_status"] == 0 and source["run"]["fresh"], name
    assert "QUICK SMOKE RUN" in printed and "Targets met:" in printed
    not_measured = [t for t in latest["targets"] if t["measured"] is None]  # the cells it leaves out
    assert not_measured and all("k=128" in t["scope"] or "eps=4" in t["scope"] for t in not_measured)
    check_png(directory / "throughput.png")


def test_the_report_of_the_committed_results_checks_every_benchmark(committed):
    _, code, printed, latest = committed
    assert code == 0, printed
    assert set(latest["benchmarks"]) == set(BENCHMARKS) and not latest["problems"]
    assert latest["quick"] is False and latest["summary"]["ok"] is True
    assert latest["checks"]["ingest_exact_counts_ok"] is True
    assert "QUICK SMOKE RUN" not in printed and "Targets met:" in printed


def test_targets_list_names_the_exact_source_of_every_number(committed):
    _, _, _, latest = committed
    targets = latest["targets"]
    groups = {t["group"] for t in targets}
    for wanted in (
        "multi-freq-ldpy SS",
        "q-subset encoding",
        "k=1024, 1000-report uploads, memory",
        "k=1024, 1000-report uploads, redis",
        "k<=128",
        "10-report uploads",
        "Estimates.Get p99",
        "report() median and p99",
        "device-days per aggregator CPU second",
    ):
        assert any(wanted in group for group in groups), wanted
    by_name = {Path(s["file"]).name: name for name, s in latest["sources"].items()}
    measured = 0
    for entry in targets:
        assert {"target", "goal", "measured", "met", "source"} <= set(entry)
        assert isinstance(entry["met"], bool)
        if entry["measured"] is None:  # a cell the run did not measure
            assert entry["met"] is False and entry["source"] is None
            continue
        measured += 1
        document = latest["benchmarks"][by_name[Path(entry["source"]["file"]).name]]
        found = lookup(document, entry["source"]["path"])
        if entry.get("note", "").startswith("over "):  # a ratio: its source over the note's path
            found /= lookup(document, entry["note"].removeprefix("over "))
        if isinstance(entry["measured"], dict):
            assert all(found[key] == value for key, value in entry["measured"].items())
        else:
            assert found == entry["measured"]
            operator, goal = entry["operator"], entry["threshold"]
            assert entry["met"] == {">=": found >= goal, ">": found > goal, "<=": found <= goal}[operator]
    assert measured >= 20


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width >= 800 and height >= 400


def test_plot_is_a_png(committed):
    check_png(committed[0] / "throughput.png")


def test_report_runs_alone_on_existing_results(committed, report_module):
    directory, _, _, _ = committed
    before = (directory / "latest.json").read_bytes()  # as the run or an earlier test wrote it
    code, markdown = run_report(report_module, ["--results-dir", str(directory), "--markdown", "--no-write"])
    assert code == 0
    assert (directory / "latest.json").read_bytes() == before  # --no-write
    assert "| k | eps | multi-freq-ldpy SS |" in markdown and "|---:|" in markdown
    assert "\n#### Targets: met / entries" in markdown and "gRPC Estimates.Get" in markdown

    code, _ = run_report(report_module, ["--results-dir", str(directory)])
    assert code == 0
    again = json.loads((directory / "latest.json").read_text())
    assert [(t["scope"], t["measured"], t["met"]) for t in again["targets"]] == [
        (t["scope"], t["measured"], t["met"]) for t in json.loads(before)["targets"]
    ]
    assert "run" not in again["sources"]["ingest"]  # nothing was run this time


def test_update_readme_replaces_only_the_marked_block(committed, report_module, tmp_path):
    directory, _, _, _ = committed
    readme = tmp_path / "README.md"
    head, tail = "# Title\n\n## Performance\n\n", "\n## Layout\n\nunchanged\n"
    readme.write_text(f"{head}{report_module.README_BEGIN}\nold table\n{report_module.README_END}\n{tail}")
    code, markdown = run_report(
        report_module, ["--results-dir", str(directory), "--no-write", "--markdown", "--update-readme", str(readme)]
    )
    assert code == 0
    assert readme.read_text() == (
        f"{head}{report_module.README_BEGIN}\n{markdown.strip()}\n{report_module.README_END}\n{tail}"
    )


def test_failed_exact_count_check_fails_the_report(committed, report_module, tmp_path):
    directory, _, _, _ = committed
    for name in ("randomize", "client", "ingest"):
        shutil.copy(directory / f"{name}.json", tmp_path / f"{name}.json")
    # The measured run's results, with its exact-count verdict turned to a failure.
    ingest = json.loads((tmp_path / "ingest.json").read_text())
    ingest["exact_counts"]["ok"] = ingest["summary"]["exact_counts_ok"] = False
    ingest["exact_counts"]["failures"] = ["memory ingest_k16_e1 total: n 3999, expected 4000; 1 V entries differ"]
    ingest["ingest"][0]["stores"]["memory"]["large"]["exact"] = False
    (tmp_path / "ingest.json").write_text(json.dumps(ingest))

    code, printed = run_report(report_module, ["--results-dir", str(tmp_path)])
    assert code == 1
    assert "COUNT CHECK FAILED: memory ingest_k16_e1 total" in printed and "WRONG" in printed
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["summary"]["ok"] is False and latest["checks"]["ingest_exact_counts_ok"] is False


def test_run_never_reports_a_file_it_did_not_write(committed, report_module, tmp_path):
    """With --run, a benchmark that wrote nothing (it crashed) counts as missing even though an
    older file of the same name is there; without a file at all the report says so too."""
    directory, _, _, _ = committed
    for name in ("randomize", "client", "ingest"):
        shutil.copy(directory / f"{name}.json", tmp_path / f"{name}.json")
    runs = {
        name: {"command": name, "exit_status": 0, "fresh": True, "seconds": 0.0}
        for name in ("randomize", "client", "ingest")
    }
    runs["ingest"] = {"command": "ingest", "exit_status": 1, "fresh": False, "seconds": 0.0}
    results, sources, problems = report_module.load(tmp_path, runs)
    assert set(results) == {"randomize", "client"} and sources["ingest"]["missing"] is True
    assert any("ingest benchmark wrote no results" in p for p in problems)

    (tmp_path / "client.json").unlink()
    code, printed = run_report(report_module, ["--results-dir", str(tmp_path), "--no-write"])
    assert code == 1 and "PROBLEM: client results missing" in printed


@pytest.mark.slow  # a profiled aggregator under load: a tool's check, not the product's
def test_profiling_the_aggregator_writes_a_profile_and_counts_exactly(tmp_path):
    command = [
        sys.executable,
        str(BENCH_DIR / "profile_ingest.py"),
        "--shapes",
        "small",
        "--ks",
        "16",
        "--seconds",
        "1",
        "--output",
        str(tmp_path),
    ]
    assert subprocess.run(command, timeout=600).returncode == 0
    profile = json.loads((tmp_path / "small-k16.speedscope.json").read_text())
    assert any(p["samples"] for p in profile["profiles"])
    summary = (tmp_path / "summary.txt").read_text()
    assert "counts exact" in summary and "grpc" in summary
