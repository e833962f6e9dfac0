"""The benchmarks run end to end (smoke runs: their numbers mean nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_quick_benchmark_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_randomize

    output = tmp_path / "randomize.json"
    assert bench_randomize.main(["--quick", "--ks", "16", "--epsilons", "1", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert results["benchmark"] == "randomize" and results["machine"]["cpu_count"] >= 1
    sys.modules.pop("bench_randomize", None)


def test_quick_ingest_benchmark_counts_exactly(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_ingest

    output = tmp_path / "ingest.json"
    code = bench_ingest.main(["--quick", "--ks", "16", "--epsilons", "1", "--stores", "memory", "--output", str(output)])
    assert code == 0
    assert json.loads(output.read_text())["summary"]["exact_counts_ok"] is True
    sys.modules.pop("bench_ingest", None)
