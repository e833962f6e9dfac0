"""What every Veil benchmark shares: machine facts, one timer, progress lines, the results file.

Benchmarks here compare Veil with peer libraries measured in the same run on the same machine,
so only ratios travel between machines; the machine facts recorded beside them say where the
absolute numbers come from.
"""

from __future__ import annotations

import datetime
import gc
import importlib.util
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "BENCH_DIR",
    "QUICK_RESULTS_DIR",
    "RESULTS_DIR",
    "load_script",
    "machine_info",
    "median",
    "progress",
    "replace_marked",
    "timed",
    "write_results",
]

# bench/ and bench/results of the checkout: this package is installed in development mode (the dev extra),
# so its files stay in the checkout's testing/src/veil_testing.
BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"
RESULTS_DIR = BENCH_DIR / "results"
# Where `make bench-quick` (bench/report.py --run --quick) puts its smoke runs, so that they never
# overwrite the real results.
QUICK_RESULTS_DIR = RESULTS_DIR / "quick"


def load_script(name: str) -> ModuleType:
    """bench/<name>.py as a module, for the tests that check a benchmark's parts: a script is
    not importable by name. bench/ is on sys.path while it loads, as when it runs, so the parts
    it imports from beside it (report.py's _goals, ...) are found."""
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def progress(message: str) -> None:
    """One progress line on stderr, so stdout carries only the results table."""
    print(message, file=sys.stderr, flush=True)


def timed(function: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(wall seconds, result) of function(*args). Garbage is collected before the call and the
    collector paused during it, as timeit does, so a collection triggered by an earlier
    measurement's garbage is not charged to this one."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = function(*args)
        seconds = time.perf_counter() - start
    finally:
        gc.enable()
    return seconds, result


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def machine_info(packages: tuple[str, ...]) -> dict[str, Any]:
    """Where the numbers were measured: CPU, interpreter, and the versions of ``packages``."""
    import numba  # the only third-party import here: every benchmark of Veil's kernels needs it

    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": versions,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as lines:
            for line in lines:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write JSON atomically (a *.tmp beside it, then rename), so an interrupted run never
    leaves half a results file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    scratch.replace(path)


def replace_marked(path: Path, begin: str, end: str, text: str) -> None:
    """Put ``text`` between the lines ``begin`` and ``end`` of the file (a table a benchmark keeps
    in a document), nothing else changed; SystemExit when the file has no such markers."""
    content = path.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{path} has no {begin} ... {end} markers.")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", content))
