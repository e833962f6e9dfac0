"""py-spy profiles of the aggregator under ingest load; bench/PROFILES.md says what they showed.

For each load shape of bench_ingest.py (small: 10-report uploads, 64 in flight; large:
1000-report uploads, 16 in flight) and each k (default 16 and 1024, epsilon 1), on a Redis this
script starts: one aggregator process (bench_ingest's), the load processes, a pilot run to size
a run of about --seconds + 4 s, then that run with `py-spy record --gil` attached to the
aggregator for --seconds from 2 s in. The counts are checked exactly after every run, as in
bench_ingest. Writes (to --output, default results/profiles/) <shape>-k<k>.speedscope.json (open at
https://www.speedscope.app) and summary.txt: per profile, the share of
samples by where the time went and the top functions by self time.

`--gil` samples only the thread holding the GIL, which is what bounds a Python server; a
whole-process view (all threads, idle included) is `--all-threads`.

Usage:  .venv/bin/python bench/profile_ingest.py [--shapes small large] [--ks 16 1024] [--seconds 8]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _aggregator import AggregatorProcess, config_dict, metric_name  # beside this file, which runs as a script
from _load import GRAIN, SHAPES, Ledger, LoadProcesses, Shape, run_once
from veil_testing.benchlib import RESULTS_DIR, progress
from veil_testing.redis_server import RedisServer

PROFILES_DIR = RESULTS_DIR / "profiles"

# Where a sampled leaf frame's time goes, by its file (first match wins).
CATEGORIES = (
    ("thread handoff and locks", ("threading.py", "concurrent/futures", "queue.py")),
    ("grpc (Python layer)", ("grpc/_server.py", "grpc/_common.py", "grpc/_interceptor.py", "grpc/aio")),
    ("grpc (C core, Cython)", ("cygrpc", "libgrpc")),
    ("store write (redis-py, hiredis, group commit)", ("redis/", "hiredis", "store/_redis/", "store/_coalesce.py")),
    ("decode", ("aggregator/decode.py", "aggregator/_kernels.py", "numba")),
    (
        "servicer, access, rate limit",
        ("aggregator/service.py", "aggregator/_access.py", "aggregator/_interceptor.py", "aggregator/_ratelimit.py"),
    ),
    ("prometheus", ("prometheus_client",)),
    ("numpy", ("numpy/",)),
    ("protobuf", ("protobuf",)),
)


def categorize(path: str) -> str:
    for name, needles in CATEGORIES:
        if any(needle in path for needle in needles):
            return name
    return "other"


def summarize(path: Path, top: int = 15) -> str:
    """Shares of the samples by category and by function (self time), from a speedscope file."""
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]
    by_category: collections.Counter = collections.Counter()
    by_function: collections.Counter = collections.Counter()
    total = 0.0
    for profile in data["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            if not stack:
                continue
            leaf = frames[stack[-1]]
            where = leaf.get("file", "")
            by_category[categorize(where)] += weight
            by_function[f"{leaf['name']} ({Path(where).name}:{leaf.get('line', '?')})"] += weight
            total += weight
    if not total:
        return f"{path.name}: no samples\n"
    unit = data["profiles"][0].get("unit", "samples") if data["profiles"] else "samples"
    lines = [f"{path.name}: {total:.3g} {unit} of samples"]
    lines += [f"  {100 * w / total:5.1f}%  {name}" for name, w in by_category.most_common()]
    lines.append("  top functions (self):")
    lines += [f"  {100 * w / total:5.1f}%  {name}" for name, w in by_function.most_common(top)]
    return "\n".join(lines) + "\n"


def profile_one(
    load: LoadProcesses,
    aggregator: AggregatorProcess,
    ledger: Ledger,
    shape: Shape,
    k: int,
    args: argparse.Namespace,
) -> dict:
    metric = metric_name(k, 1.0)
    load.command("cell", {"k": k, "epsilon": 1.0, "seed": args.seed})
    watch = {"aggregator": aggregator.pids, "redis": aggregator.redis_pid}
    load.command("extend", shape.pilot)  # reports per load process
    run_once(load, aggregator, shape, metric, GRAIN, watch, ledger)  # warm-up
    rate = run_once(load, aggregator, shape, metric, shape.pilot, watch, ledger)["reports_per_second"]
    wanted = rate * (args.seconds + 4) / len(load.pipes)
    reports = int(-(-wanted // GRAIN) * GRAIN)
    load.command("extend", reports)
    outcome: dict = {}
    runner = threading.Thread(
        target=lambda: outcome.update(run_once(load, aggregator, shape, metric, reports, watch, ledger))
    )
    runner.start()
    time.sleep(2)
    output = args.output / f"{shape.name}-k{k}.speedscope.json"
    command = [
        args.py_spy,
        "record",
        "--pid",
        str(aggregator.pid),
        "--duration",
        str(args.seconds),
        "--rate",
        "250",
        "--format",
        "speedscope",
        "--output",
        str(output),
        "--nonblocking",
    ]
    command.append("--gil" if not args.all_threads else "--threads")
    spy = subprocess.run(command, capture_output=True, text=True)
    runner.join()
    if spy.returncode != 0:
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {spy.stderr.strip()[-2000:]}")
    return {"profile": output, "uploads_per_second": outcome["uploads_per_second"], "exact": outcome["exact"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 1024])
    parser.add_argument("--seconds", type=int, default=8, help="seconds of sampling per profile (default 8)")
    parser.add_argument("--all-threads", action="store_true", help="sample every thread, not only the GIL holder")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--output", type=Path, default=PROFILES_DIR, help=f"directory (default {PROFILES_DIR})")
    args = parser.parse_args(argv)
    args.py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(args.py_spy).exists():
        parser.error("py-spy is not installed (it is in the [dev] extra: make .venv/.dev)")
    from veil.aggregator.store import RedisStore

    args.output.mkdir(parents=True, exist_ok=True)
    ledger = Ledger()
    summaries = []
    with tempfile.TemporaryDirectory(prefix="veil-profile-") as scratch, RedisServer() as redis:
        load = LoadProcesses(2)
        aggregator = AggregatorProcess("redis", redis.url, config_dict(args.ks, [1.0], redis.url), Path(scratch))
        aggregator.redis, aggregator.redis_pid = RedisStore(redis.url), redis.process.pid
        try:
            for name in args.shapes:
                for k in args.ks:
                    progress(f"profiling {name} uploads at k = {k} for {args.seconds} s")
                    result = profile_one(load, aggregator, ledger, SHAPES[name], k, args)
                    summaries.append(
                        f"{name} uploads, k = {k}: {result['uploads_per_second']:.0f} uploads/s under "
                        f"py-spy, counts {'exact' if result['exact'] else 'WRONG'}\n" + summarize(result["profile"])
                    )
        finally:
            load.stop()
            aggregator.stop()
    text = "\n".join(summaries)
    (args.output / "summary.txt").write_text(text, encoding="utf-8")
    print(text)
    for failure in ledger.failures:
        print(f"COUNT CHECK FAILED: {failure}")
    return 1 if ledger.failures else 0


if __name__ == "__main__":
    sys.exit(main())
