"""Aggregator ingest throughput and estimate-read latency, on the memory, SQLite and Redis stores.

Ingest: subset-mechanism reports are uploaded through real gRPC over loopback into an aggregator
running as a separate process (the daemon's own Aggregator class, config file and logging, as
`python -m veil.aggregator --config FILE` runs it; more under --help), for every cell
k in {16, 128, 1024} x epsilon in {1, 4}, on three stores: the in-process memory store, SQLite (a
file in a temporary directory on the disk of --sqlite-dir, every commit fsynced) and a real
redis-server this benchmark starts (no persistence). Two load shapes:

  large   1000-report uploads, 16 calls in flight  (busy clients; with 4 in flight a Redis
          script's ~5-8 ms at k = 1024 bounds throughput, since a group holds at most 4 batches)
  small   10-report uploads, 64 calls in flight    (many small clients)

The load generator runs in separate processes (--load-processes, default 2), each a grpc.aio
event loop with one channel (its own HTTP/2 connection) per in-flight call, sending uploads that
were randomized (seeded FastKeystream, simulation only), packed and serialized before the clock
starts; each run gets fresh 16-byte batch ids. A generic unary-unary call sends the serialized
bytes as they are (no message objects on the timed path). Throughput is all reports acknowledged
divided by the wall time from the first process's start to the last one's end; CPU use of the
aggregator, redis-server and the load processes over the same interval is recorded beside it.

Exactness: after every run, including warm-up and sizing runs, the store is read back (Redis
directly, the memory and SQLite stores through the aggregator) and every window of the metric must hold
exactly n = the reports sent, and per category V = the sum of count_reports over the sent
batches' own report arrays. A mismatch, a refused upload or a duplicate makes the exit status 1.

Latency: Estimates.Get over gRPC and GET /v1/estimates/{metric} over HTTP, one call at a time,
for the largest k (3 windows: total, 1h, 1d, all holding counts), every store; median and p99.
"cached" calls find the counts unchanged since the last call; "fresh" calls each follow an
(untimed) upload, so the aggregator reads the counts and recomputes three estimates first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from veil_testing.benchlib import RESULTS_DIR, machine_info, median, progress, write_results
from veil_testing.data import zipf_shares
from veil_testing.processes import ServeProcess, free_port
from veil_testing.redis_server import RedisServer

KS = (16, 128, 1024)
EPSILONS = (1.0, 4.0)
MECHANISM = "subset"
WINDOWS = ("total", "1h", "1d")
STORES = ("memory", "sqlite", "redis")
ZIPF_EXPONENT = 1.1

UPLOAD_PATH = "/veil.wire.v1.Collector/Upload"
GET_PATH = "/veil.wire.v1.Estimates/Get"
COUNTS_PATH = "/bench/counts"  # the benchmark's own page on the aggregator's HTTP listener
BATCH_ID_HEADER = b"\x0a\x10"  # UploadRequest field 1 (batch_id), length-delimited, 16 bytes
CALL_TIMEOUT = 120.0

# Counts of every prefix of a worker's reports are kept at this granularity, so a run may send
# any multiple of it; a multiple of every batch size.
GRAIN = 1000
GENERATE_CHUNK = 50_000  # reports randomized per kernel call while generating


@dataclass(frozen=True)
class Shape:
    """A load shape: reports per upload, calls in flight in all, and bounds on the reports one
    load process sends per run (the sizing aims for --seconds within them)."""

    name: str
    batch: int
    in_flight: int
    pilot: int  # reports per process in the sizing run
    bounds: tuple[int, int]
    quick: int  # reports per process per run with --quick

    def describe(self) -> str:
        return f"{self.batch}-report uploads, {self.in_flight} in flight"


SHAPES = {
    "large": Shape("large", 1000, 16, pilot=32_000, bounds=(16_000, 1_500_000), quick=4_000),
    "small": Shape("small", 10, 64, pilot=4_000, bounds=(2_000, 300_000), quick=1_000),
}

# The targets, for information only (a benchmark never fails on a time).
TARGET_LARGE_REPORTS = 1_000_000  # reports/s at k = 1024, 1000-report uploads
TARGET_SMALL_UPLOADS = 25_000  # uploads/s, 10-report uploads


def metric_name(k: int, epsilon: float) -> str:
    return f"ingest_k{k}_e{epsilon:g}".replace(".", "_")


def labels(k: int) -> list[str]:
    return [f"c{j}" for j in range(k)]


# --- the aggregator -------------------------------------------------------------------------


def config_dict(ks: list[int], epsilons: list[float], store_url: str, processes: int = 1) -> dict[str, Any]:
    """Every cell's metric, three windows each; defaults otherwise. Ports are chosen by the
    kernel, except with several worker processes, which need fixed gRPC ports to share."""
    server: dict[str, Any] = {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"}
    if processes > 1:
        server = {"grpc": f"127.0.0.1:{free_port()}", "http": f"127.0.0.1:{free_port()}", "processes": processes}
    return {
        "server": server,
        "store": {"url": store_url},
        "metrics": [
            {
                "name": metric_name(k, e),
                "labels": labels(k),
                "mechanism": MECHANISM,
                "epsilon": e,
                "windows": list(WINDOWS),
            }
            for k in ks
            for e in epsilons
        ],
    }


def store_counts(config: Any, store: Any, since: float, metrics: list[str] | None = None) -> dict[str, Any]:
    """{metric: {window: {"n": [...], "v": [[...]]}}}: the counts of every window, summed over its
    buckets from the one holding ``since`` to the current one (an hour may turn during a run)."""
    from veil.aggregator.store import CountsKey

    now = time.time()
    found: dict[str, Any] = {}
    for metric in config.metrics:
        if metrics is not None and metric.name not in metrics:
            continue
        spec = metric.spec.mechanism
        weights = spec.weight_law().weights
        windows = {}
        for window in metric.windows:
            n = np.zeros(len(weights), np.int64)
            v = np.zeros((len(weights), spec.k), np.int64)
            starts = (
                [0] if window.span is None else range(window.bucket(since)[0], window.bucket(now)[0] + 1, window.span)
            )
            for start in starts:
                key = CountsKey(metric.name, metric.spec.fingerprint, window.name, start)
                counts = store.read(key, weights, spec.k)
                n += counts.n
                v += counts.v
            windows[window.name] = {"n": n.tolist(), "v": v.tolist()}
        found[metric.name] = windows
    return found


def serve(config_path: str) -> int:
    """The aggregator process: what `veil serve --config FILE` runs (the same logging, config
    loading, Aggregator, signals), plus one page on its HTTP listener that reads the counts
    back from its store, so the memory store can be checked from outside. Prints its ports."""
    from veil.aggregator.config import load_config
    from veil.aggregator.daemon import Aggregator
    from veil.aggregator.logs import configure_logging
    from veil.aggregator.tuning import freeze_startup_heap, keep_freed_memory

    configure_logging("json", "info")
    config = load_config(config_path)
    since = time.time()
    holder: dict[str, Any] = {}

    def counts_page() -> bytes:
        return json.dumps(store_counts(config, holder["store"], since)).encode()

    keep_freed_memory()
    aggregator = Aggregator(config, pages={COUNTS_PATH: ("application/json", counts_page)})
    holder["store"] = aggregator.store
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    aggregator.start()
    freeze_startup_heap()
    while not stop.wait(0.5):
        pass
    aggregator.stop()
    return 0


class AggregatorProcess:
    """One aggregator subprocess (this file with --serve; with server.processes > 1 `veil serve`
    itself, a supervisor of worker processes) and how to reach it."""

    def __init__(self, store: str, store_url: str, config: dict[str, Any], directory: Path) -> None:
        from veil.aggregator.config import parse_config

        self.store = store
        self.store_url = store_url
        self.config = parse_config(config)
        self.since = time.time()
        command = [sys.executable, str(Path(__file__).resolve()), "--serve"] if self.config.processes == 1 else None
        self.server = ServeProcess(directory / store, config, command=command, parent_death_signal=signal.SIGTERM)
        try:
            self.server.start()
        except RuntimeError as err:
            raise RuntimeError(f"the {store} aggregator did not start: {err}") from None
        self.endpoint = self.server.endpoint  # server.grpc: grpcio's server
        self.http_port = self.server.http_port
        self.redis = None  # for the redis store: a RedisStore reading what the aggregator wrote
        self.redis_pid: int | None = None  # and the redis-server's pid, for its CPU use

    @property
    def pid(self) -> int:
        return self.server.pid

    @property
    def pids(self) -> list[int]:
        return self.server.pids

    def counts(self, metrics: list[str] | None = None) -> dict[str, Any]:
        """What the store holds now (see store_counts)."""
        if self.redis is not None:
            return store_counts(self.config, self.redis, self.since, metrics)
        status, body = http_get(self.http_port, COUNTS_PATH)
        if status != 200:
            raise RuntimeError(f"{COUNTS_PATH} answered {status}")
        found = json.loads(body)
        return found if metrics is None else {m: found[m] for m in metrics}

    def log_tail(self) -> str:
        return self.server.log_text()[-3000:]

    def stop(self) -> None:
        self.server.terminate()
        if self.redis is not None:
            self.redis.close()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    """One GET on a fresh connection (the aggregator's HTTP/1.0 listener closes each one)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def cpu_seconds(pid: int | list[int] | None) -> float:
    """User + system CPU seconds of a process (or the sum over several), all threads, from /proc
    (0 where unknown)."""
    if pid is None:
        return 0.0
    if isinstance(pid, list):
        return sum(cpu_seconds(p) for p in pid)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# --- the reports ----------------------------------------------------------------------------


class ReportPool:
    """One load process's reports for one metric: randomized before any timing, kept packed as
    they travel (bitmap rows or index rows, whichever the SDK's encoder picks), with the counts
    of every GRAIN-report prefix taken by count_reports from the report arrays themselves."""

    def __init__(self, k: int, epsilon: float, seed: int, stream: int) -> None:
        from veil.aggregator.counts import Counts
        from veil.aggregator.simulate import FastKeystream
        from veil.mechanism import BITMAPS, MetricSpec, encoding

        self.metric = MetricSpec.create(metric_name(k, epsilon), labels(k), MECHANISM, epsilon)
        self.spec = self.metric.mechanism
        self.bitmaps = encoding(self.spec) == BITMAPS
        self.shares = zipf_shares(k, ZIPF_EXPONENT, np.random.default_rng([seed, k]))  # heaviest not at 0
        self.values = np.random.default_rng([seed, k, round(epsilon * 1000), stream, 1])
        seed_words = np.random.SeedSequence([seed, k, round(epsilon * 1000), stream, 2]).generate_state(2, np.uint64)
        self.keystream = FastKeystream(int(seed_words[0]) << 64 | int(seed_words[1]))
        self.chunks: list[np.ndarray] = []
        self.packed = np.zeros((0, 0), np.uint8)
        self.size = 0
        running = Counts.zeros(self.spec)
        self.prefix: list[tuple[np.ndarray, np.ndarray]] = [(running.n.copy(), running.v.copy())]
        self._running = running
        self.tails: dict[int, list[bytes]] = {}  # batch size -> serialized uploads without their ids
        self.encoding_checked: list[int] = []

    def extend(self, reports: int) -> None:
        """Randomize reports until the pool holds at least ``reports`` (a multiple of GRAIN)."""
        from veil.aggregator.simulate import count_reports, simulate_reports

        reports = -(-reports // GRAIN) * GRAIN
        grew = False
        while self.size < reports:
            m = min(GENERATE_CHUNK, reports - self.size)
            values = self.values.choice(self.spec.k, size=m, p=self.shares)
            rows = simulate_reports(self.spec, values, keystream=self.keystream)
            if self.size == 0:
                self._check_encoding(rows)
            for start in range(0, m, GRAIN):
                count_reports(self.spec, rows[start : start + GRAIN], out=self._running)
                self.prefix.append((self._running.n.copy(), self._running.v.copy()))
            self.chunks.append(self._pack(rows))
            self.size += m
            grew = True
        if grew:
            self.packed = np.concatenate(self.chunks)
            self.chunks = [self.packed]

    def _pack(self, rows: np.ndarray) -> np.ndarray:
        """Report rows as the wire carries them: category j is bit j % 8 of byte j // 8."""
        if not self.bitmaps:
            return np.ascontiguousarray(rows, dtype="<u4").view(np.uint8)
        width = -(-self.spec.k // 8)
        bits = np.zeros((rows.shape[0], 8 * width), np.uint8)
        bits[np.arange(rows.shape[0])[:, None], rows] = 1
        return np.packbits(bits, axis=1, bitorder="little")

    def _tail(self, start: int, count: int) -> bytes:
        """The serialized UploadRequest of reports start .. start + count, without its batch id."""
        from veil.wire.v1 import veil_pb2

        payload = self.packed[start : start + count].tobytes()
        request = veil_pb2.UploadRequest(metric=self.metric.name, spec_fingerprint=self.metric.fingerprint, count=count)
        if self.bitmaps:
            request.bitmaps.bits = payload
        else:
            request.index_sets.set_size = self.spec.q
            request.index_sets.indices = payload
        return request.SerializeToString()

    def _check_encoding(self, rows: np.ndarray) -> None:
        """The packed, serialized uploads must be byte for byte what the SDK's encoder sends."""
        from veil.client import encode_batch

        saved = self.packed
        self.packed = self._pack(rows[: max(s.batch for s in SHAPES.values())])
        for batch in sorted({s.batch for s in SHAPES.values()}):
            batch_id = os.urandom(16)
            sdk = encode_batch(self.metric, [tuple(r) for r in rows[:batch].tolist()], batch_id)
            if sdk != BATCH_ID_HEADER + batch_id + self._tail(0, batch):
                raise AssertionError(
                    f"{self.metric.name}: the benchmark's encoding of {batch} reports differs "
                    "from veil.client.encode_batch"
                )
            self.encoding_checked.append(batch)
        self.packed = saved

    def uploads(self, batch: int, reports: int) -> list[bytes]:
        """Serialized uploads of the first ``reports`` reports, ``batch`` each, fresh batch ids."""
        tails = self.tails.setdefault(batch, [])
        for start in range(len(tails) * batch, reports, batch):
            tails.append(self._tail(start, batch))
        return [BATCH_ID_HEADER + os.urandom(16) + tail for tail in tails[: reports // batch]]

    def counts(self, reports: int) -> tuple[np.ndarray, np.ndarray]:
        """(n, V) of the first ``reports`` reports (a multiple of GRAIN)."""
        return self.prefix[reports // GRAIN]


# --- the load processes ---------------------------------------------------------------------


def answer_commands(conn: Any, handle: Callable[[str, Any], Any]) -> None:
    """A load process's loop: commands from the benchmark over a pipe, one at a time, until
    "stop"; each answered ("ok", what ``handle`` returns) or ("error", its traceback)."""
    while True:
        command, arguments = conn.recv()
        if command == "stop":
            return
        try:
            conn.send(("ok", handle(command, arguments)))
        except BaseException:  # noqa: BLE001 (the parent reports it: a load process must answer every command)
            conn.send(("error", traceback.format_exc()))


def load_process(conn: Any, index: int) -> None:
    """A load process: "cell" makes its pool, "extend" randomizes it, "run" sends uploads."""
    pools: list[ReportPool] = []

    def handle(command: str, arguments: Any) -> Any:
        if command == "cell":
            pools[:] = [ReportPool(**arguments, stream=index)]
            return None
        if command == "extend":
            started = time.perf_counter()
            pools[0].extend(arguments)
            return {
                "size": pools[0].size,
                "seconds": time.perf_counter() - started,
                "encoding_checked": pools[0].encoding_checked,
            }
        if command == "run":
            return asyncio.run(_send_uploads(conn, pools[0], **arguments))
        raise ValueError(f"unknown command {command!r}")

    answer_commands(conn, handle)


async def _send_uploads(conn: Any, pool: ReportPool, endpoint: str, batch: int, reports: int, in_flight: int) -> dict:
    """Send the pool's first ``reports`` reports in ``batch``-report uploads, ``in_flight`` calls at
    a time, each call slot on its own channel (connection); untimed set-up first, then "ready",
    then wait for "go"."""
    import grpc

    from veil.wire.v1 import veil_pb2

    requests = pool.uploads(batch, reports)
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
    channels = [grpc.aio.insecure_channel(endpoint, options=options) for _ in range(in_flight)]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), 30)
        calls = [
            channel.unary_unary(
                UPLOAD_PATH, request_serializer=None, response_deserializer=veil_pb2.UploadResponse.FromString
            )
            for channel in channels
        ]
        gc.collect()
        conn.send(("ready", None))
        conn.recv()  # "go": blocking the loop here is fine, nothing is in flight yet
        gc.disable()
        next_request = 0
        accepted = duplicates = 0

        async def slot(call: Any) -> None:
            nonlocal next_request, accepted, duplicates
            while next_request < len(requests):
                request = requests[next_request]
                next_request += 1
                response = await call(request, timeout=CALL_TIMEOUT)
                accepted += response.accepted
                duplicates += response.duplicate

        cpu, start = time.process_time(), time.monotonic()
        await asyncio.gather(*(slot(call) for call in calls))
        end, cpu = time.monotonic(), time.process_time() - cpu
    finally:
        gc.enable()
        for channel in channels:
            await channel.close()
    n, v = pool.counts(reports)
    return {
        "start": start,
        "end": end,
        "cpu": cpu,
        "uploads": len(requests),
        "reports": reports,
        "accepted": accepted,
        "duplicates": duplicates,
        "n": n,
        "v": v,
    }


class LoadProcesses:
    """The load processes (spawned: no gRPC state is ever forked) and the benchmark's side of
    their pipes."""

    def __init__(self, count: int, target: Callable[[Any, int], None] = load_process) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = []
        self.processes = []
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=target, args=(theirs, index), name=f"veil-load-{index}", daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def _receive(self, pipe: Any) -> Any:
        status, reply = pipe.recv()
        if status == "error":
            raise RuntimeError(f"a load process failed:\n{reply}")
        return reply

    def command(self, command: str, arguments: Any = None) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((command, arguments))
        return [self._receive(pipe) for pipe in self.pipes]

    def run(self, endpoint: str, shape: Shape, reports: int, watch: dict[str, int | None]) -> dict[str, Any]:
        """One measured run: every process sends ``reports`` of its reports. CPU seconds of the
        watched processes are read just before "go" and after the last process is done."""
        per_process = shape.in_flight // len(self.pipes)
        arguments = {"endpoint": endpoint, "batch": shape.batch, "reports": reports, "in_flight": per_process}
        results, used = self.go(arguments, watch)
        seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
        return {
            "seconds": seconds,
            "reports": sum(r["reports"] for r in results),
            "uploads": sum(r["uploads"] for r in results),
            "accepted": sum(r["accepted"] for r in results),
            "duplicates": sum(r["duplicates"] for r in results),
            "n": sum(r["n"] for r in results),
            "v": sum(r["v"] for r in results),
            # CPU cores busy on average over the run (CPU seconds per wall second).
            "cpu": {
                **{name: used[name] / seconds for name in watch if watch[name] is not None},
                "load": sum(r["cpu"] for r in results) / seconds,
            },
        }

    def go(self, arguments: dict[str, Any], watch: dict[str, Any]) -> tuple[list[Any], dict[str, float]]:
        """One timed run: each process gets ("run", arguments), sets up untimed and answers
        "ready"; the CPU seconds of the watched processes are read just before "go" and after the
        last process is done. (each process's result, CPU seconds used per watched name)"""
        for pipe in self.pipes:
            pipe.send(("run", arguments))
        for pipe in self.pipes:
            self._receive(pipe)  # "ready"
        before = {name: cpu_seconds(pid) for name, pid in watch.items()}
        for pipe in self.pipes:
            pipe.send(("go", None))
        results = [self._receive(pipe) for pipe in self.pipes]
        return results, {name: cpu_seconds(pid) - before[name] for name, pid in watch.items()}

    def stop(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("stop", None))
            except OSError:
                pass
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


# --- exact counts ---------------------------------------------------------------------------


@dataclass
class Ledger:
    """What each store must hold: per metric, the n and V of every report it acknowledged."""

    expected: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    checks: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, store: str, metric: str, n: np.ndarray, v: np.ndarray) -> None:
        held = self.expected.get((store, metric))
        self.expected[store, metric] = (n.copy(), v.copy()) if held is None else (held[0] + n, held[1] + v)

    def summary(self) -> dict[str, Any]:
        """The results' "exact_counts": all OK or not, how many checks, and the failures."""
        return {"ok": not self.failures, "checks": self.checks, "failures": self.failures}

    def verify(self, aggregator: AggregatorProcess, metrics: list[str]) -> bool:
        """Every window of every named metric holds exactly the expected counts."""
        found = aggregator.counts(metrics)
        ok = True
        for metric in metrics:
            n, v = self.expected.get((aggregator.store, metric), (None, None))
            for window, counts in found[metric].items():
                self.checks += 1
                got_n, got_v = np.asarray(counts["n"], np.int64), np.asarray(counts["v"], np.int64)
                if n is None:
                    good = not got_n.any() and not got_v.any()
                else:
                    good = np.array_equal(got_n, n) and np.array_equal(got_v, v)
                if not good:
                    ok = False
                    expected_n = 0 if n is None else int(n.sum())
                    wrong = 0 if n is None or got_v.shape != v.shape else int((got_v != v).sum())
                    self.failures.append(
                        f"{aggregator.store} {metric} {window}: n {int(got_n.sum())}, expected "
                        f"{expected_n}; {wrong} V entries differ"
                    )
        return ok


# --- ingest ---------------------------------------------------------------------------------


def run_once(
    load: LoadProcesses,
    aggregator: AggregatorProcess,
    shape: Shape,
    metric: str,
    reports: int,
    watch: dict[str, int | None],
    ledger: Ledger,
    endpoint: str | None = None,
) -> dict[str, Any]:
    """One run, to `endpoint` (default: the aggregator's server.grpc listener), then the exact
    check of the store. A refused call raises (in the load process)."""
    result = load.run(endpoint or aggregator.endpoint, shape, reports, watch)
    if result["accepted"] != result["reports"] or result["duplicates"]:
        ledger.failures.append(
            f"{aggregator.store} {metric}: {result['accepted']} of {result['reports']} reports "
            f"acknowledged, {result['duplicates']} uploads answered duplicate"
        )
    ledger.add(aggregator.store, metric, result["n"], result["v"])
    result["exact"] = ledger.verify(aggregator, [metric])
    del result["n"], result["v"]
    result["reports_per_second"] = result["reports"] / result["seconds"]
    result["uploads_per_second"] = result["uploads"] / result["seconds"]
    return result


def measure_cell(
    k: int,
    epsilon: float,
    load: LoadProcesses,
    aggregators: dict[str, AggregatorProcess],
    ledger: Ledger,
    args: argparse.Namespace,
    tag: str,
) -> dict[str, Any]:
    metric = metric_name(k, epsilon)
    watches = {store: {"aggregator": a.pids, "redis": a.redis_pid} for store, a in aggregators.items()}
    combos = [(store, args.shape_table[shape]) for shape in args.shapes for store in aggregators]
    load.command("cell", {"k": k, "epsilon": epsilon, "seed": args.seed})
    processes = len(load.pipes)

    sizes: dict[tuple[str, str], int] = {}
    pilots: dict[tuple[str, str], dict[str, Any]] = {}
    if args.quick:
        sizes = {(store, shape.name): shape.quick for store, shape in combos}
    else:
        made = load.command("extend", max(s.pilot for s in SHAPES.values()))
        progress(
            f"{tag} randomized {made[0]['size'] * processes} reports in {made[0]['seconds']:.1f}s (untimed); "
            "warm-up and sizing runs"
        )
        for store, shape in combos:
            # Warm-up: the first uploads of a layout may compile a kernel in the aggregator.
            run_once(load, aggregators[store], shape, metric, GRAIN, watches[store], ledger)
            pilot = run_once(load, aggregators[store], shape, metric, shape.pilot, watches[store], ledger)
            pilots[store, shape.name] = pilot
            wanted = pilot["reports_per_second"] * args.seconds / processes
            low, high = shape.bounds
            sizes[store, shape.name] = int(min(high, max(low, -(-wanted // GRAIN) * GRAIN)))
    made = load.command("extend", max(sizes.values()))
    progress(
        f"{tag} pool of {made[0]['size'] * processes} reports ready ({made[0]['seconds']:.1f}s, untimed); "
        f"encoding checked against encode_batch for batches of {made[0]['encoding_checked']}"
    )

    samples: dict[tuple[str, str], list[dict[str, Any]]] = {(store, shape.name): [] for store, shape in combos}
    for round_index in range(args.rounds):
        shift = round_index % len(combos)
        for store, shape in combos[shift:] + combos[:shift]:
            result = run_once(load, aggregators[store], shape, metric, sizes[store, shape.name], watches[store], ledger)
            samples[store, shape.name].append(result)
        summary = ", ".join(
            f"{store} {shape.name} {si(samples[store, shape.name][-1]['reports_per_second'])}/s"
            f"{'' if samples[store, shape.name][-1]['exact'] else ' COUNTS WRONG'}"
            for store, shape in combos
        )
        progress(f"{tag} round {round_index + 1}/{args.rounds}: {summary}")

    rows: dict[str, dict[str, Any]] = {}
    for store, shape in combos:
        runs = samples[store, shape.name]
        seconds = [r["seconds"] for r in runs]
        middle = median(seconds)
        reports, uploads = runs[0]["reports"], runs[0]["uploads"]
        rows.setdefault(store, {})[shape.name] = {
            "batch": shape.batch,
            "in_flight": shape.in_flight,
            "load_processes": processes,
            "reports_per_run": reports,
            "uploads_per_run": uploads,
            "seconds": seconds,
            "median_seconds": middle,
            "spread": (max(seconds) - min(seconds)) / middle,
            "reports_per_second": reports / middle,
            "uploads_per_second": uploads / middle,
            # CPU cores busy, median over the rounds: "aggregator", "redis" (redis store) and "load".
            "cpu_cores": {name: statistics.median(r["cpu"][name] for r in runs) for name in runs[0]["cpu"]},
            "exact": all(r["exact"] for r in runs),  # the measured runs; warm-up and sizing runs are checked too
            "sizing_reports_per_second": pilots[store, shape.name]["reports_per_second"] if pilots else None,
        }
    return {"k": k, "epsilon": epsilon, "metric": metric, "stores": rows}


# --- estimate latency -----------------------------------------------------------------------


def measure_latency(
    k: int, epsilon: float, aggregators: dict[str, AggregatorProcess], ledger: Ledger, args: argparse.Namespace
) -> dict[str, Any]:
    """Estimates.Get and GET /v1/estimates/{metric}, one call at a time, interleaved over
    stores and protocols; "cached" then "fresh" (an untimed 10-report upload before each call)."""
    import grpc

    from veil.wire.v1 import veil_pb2

    metric = metric_name(k, epsilon)
    fresh_calls = args.fresh_calls
    # The benchmark's own reports: a 1000-report upload first, so that every window's current
    # bucket holds counts, then one 10-report upload before each fresh call (two protocols),
    # and the rest of the last GRAIN block afterwards, so the ledger's prefix counts apply.
    pool = ReportPool(k, epsilon, args.seed, stream=1_000_000)
    total = 1000 + -(-10 * fresh_calls * 2 // GRAIN) * GRAIN
    pool.extend(total)
    channels = {store: grpc.insecure_channel(a.endpoint) for store, a in aggregators.items()}
    try:
        gets = {
            store: channel.unary_unary(GET_PATH, request_serializer=None, response_deserializer=None)
            for store, channel in channels.items()
        }
        upload_calls = {
            store: channel.unary_unary(
                UPLOAD_PATH, request_serializer=None, response_deserializer=veil_pb2.UploadResponse.FromString
            )
            for store, channel in channels.items()
        }
        fresh_uploads = {}
        for store in aggregators:
            first = pool.uploads(1000, 1000)
            upload_calls[store](first[0], timeout=CALL_TIMEOUT)
            fresh_uploads[store] = iter(pool.uploads(10, total)[100:])
        request = veil_pb2.EstimatesRequest(metric=metric).SerializeToString()
        path = f"/v1/estimates/{metric}"

        def call(store: str, protocol: str) -> bytes:
            if protocol == "gRPC":
                return gets[store](request, timeout=CALL_TIMEOUT)
            status, body = http_get(aggregators[store].http_port, path)
            if status != 200:
                raise RuntimeError(f"GET {path} on the {store} aggregator answered {status}")
            return body

        contenders = [(store, protocol) for store in aggregators for protocol in ("gRPC", "HTTP")]
        results: dict[str, Any] = {}
        for mode, calls in (("cached", args.latency_calls), ("fresh", fresh_calls)):
            if not calls:
                continue
            samples: dict[tuple[str, str], list[int]] = {c: [] for c in contenders}
            last: dict[tuple[str, str], bytes] = {}
            for contender in contenders:  # warm-up, untimed
                for _ in range(3 if mode == "cached" else 0):
                    call(*contender)
            rounds = 4
            for round_index in range(rounds):
                shift = round_index % len(contenders)
                for store, protocol in contenders[shift:] + contenders[:shift]:
                    share = calls // rounds + (1 if round_index < calls % rounds else 0)
                    gc.collect()
                    gc.disable()
                    try:
                        for _ in range(share):
                            if mode == "fresh":
                                upload_calls[store](next(fresh_uploads[store]), timeout=CALL_TIMEOUT)
                            started = time.perf_counter_ns()
                            body = call(store, protocol)
                            samples[store, protocol].append(time.perf_counter_ns() - started)
                    finally:
                        gc.enable()
                    if share:
                        last[store, protocol] = body
            for store, protocol in contenders:
                ns = np.asarray(samples[store, protocol], np.float64) / 1e6
                results.setdefault(store, {}).setdefault(protocol, {})[mode] = {
                    "calls": len(ns),
                    "median_ms": float(np.median(ns)),
                    "p99_ms": float(np.percentile(ns, 99)),
                    "mean_ms": float(ns.mean()),
                    "response_bytes": len(last[store, protocol]),
                    "sanity": latency_sanity(protocol, last[store, protocol], k),
                }
        for store in aggregators:
            for upload in fresh_uploads[store]:  # the rest of the last block, untimed
                upload_calls[store](upload, timeout=CALL_TIMEOUT)
            ledger.add(store, metric, *pool.counts(total))
    finally:
        for channel in channels.values():
            channel.close()
    return {
        "k": k,
        "epsilon": epsilon,
        "metric": metric,
        "windows": list(WINDOWS),
        "path": f"/v1/estimates/{metric}",
        "results": results,
    }


def latency_sanity(protocol: str, body: bytes, k: int) -> dict[str, Any]:
    """The last response names every window, none withheld, with k finite estimates each."""
    from veil.wire.v1 import veil_pb2

    if protocol == "gRPC":
        estimates = veil_pb2.EstimatesResponse.FromString(body).estimates
        windows = [(e.window, e.n, e.withheld, [c.estimate for c in e.categories]) for e in estimates]
    else:
        estimates = json.loads(body)["estimates"]
        windows = [(e["window"], e["n"], e["withheld"], [c["estimate"] for c in e["categories"]]) for e in estimates]
    ok = [w[0] for w in windows] == list(WINDOWS) and all(
        not withheld and len(values) == k and all(v is not None and np.isfinite(v) for v in values)
        for _, _, withheld, values in windows
    )
    return {"ok": bool(ok), "n": {w[0]: w[1] for w in windows}}


# --- reporting ------------------------------------------------------------------------------


def si(rate: float | None) -> str:
    if rate is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix}"
    return f"{rate:.3g}"


def cores(value: float | None) -> str:
    return f"{'-':>5}" if value is None else f"{value:>5.2f}"


def print_tables(results: dict[str, Any]) -> None:
    machine, settings = results["machine"], results["settings"]
    if settings["quick"]:
        print("QUICK SMOKE RUN: tiny runs; the rates below mean nothing (the exact-count checks do).")
    print(
        f"Ingest through gRPC over loopback into an aggregator subprocess, {MECHANISM} mechanism, windows "
        f"{', '.join(WINDOWS)}; {machine['cpus_usable']} CPUs ({machine['cpu_model'] or machine['processor']}), "
        f"{machine['date']}."
    )
    print(
        f"Load: {settings['load_processes']} grpc.aio processes, one channel per in-flight call, pre-serialized "
        f"uploads; median of {settings['rounds']} interleaved rounds. cpu = cores busy in the aggregator "
        "(agg), redis-server (rds) and the load processes (ld)."
    )
    print(f"Aggregator processes per store: {settings['aggregator_processes']} (agg cpu sums them all).")
    shapes = [replace(SHAPES[name], in_flight=shape["in_flight"]) for name, shape in settings["shapes"].items()]
    head = " | ".join(f"{s.describe():^45}" for s in shapes)
    print()
    print(f"{'':>5} {'':>4} {'':<7}| {head} | counts")
    sub = " | ".join(f"{'reports/s':>10} {'uploads/s':>10} {'agg':>5} {'rds':>5} {'ld':>5} {'sprd':>4}" for _ in shapes)
    print(f"{'k':>5} {'eps':>4} {'store':<7}| {sub} |")
    for cell in results["ingest"]:
        for store, rows in cell["stores"].items():
            parts = []
            for shape in shapes:
                row = rows[shape.name]
                cpu = row["cpu_cores"]
                parts.append(
                    f"{si(row['reports_per_second']):>10} {si(row['uploads_per_second']):>10} "
                    f"{cores(cpu.get('aggregator'))} {cores(cpu.get('redis'))} {cores(cpu.get('load'))} "
                    f"{row['spread']:>4.0%}"
                )
            exact = all(rows[s.name]["exact"] for s in shapes)
            print(
                f"{cell['k']:>5} {cell['epsilon']:>4g} {store:<7}| {' | '.join(parts)} | "
                f"{'exact' if exact else 'WRONG'}"
            )
    for line in results["summary"]["targets"]:
        print(line["text"])

    latency = results.get("latency")
    if latency:
        print()
        print(
            f"Estimates of {latency['metric']} (k = {latency['k']}, epsilon = {latency['epsilon']:g}, windows "
            f"{', '.join(latency['windows'])}), one call at a time, ms. cached: counts unchanged since the last "
            "call; "
            "fresh: an untimed upload before each call, so the estimates are recomputed."
        )
        print(
            f"{'store':<7} {'call':<44} {'mode':<7} {'calls':>6} {'median':>8} {'p99':>8} {'mean':>8} "
            f"{'bytes':>8}  check"
        )
        for store, protocols in latency["results"].items():
            for protocol, modes in protocols.items():
                what = "gRPC Estimates.Get" if protocol == "gRPC" else f"HTTP GET {latency['path']}"
                for mode, row in modes.items():
                    print(
                        f"{store:<7} {what:<44} {mode:<7} {row['calls']:>6} {row['median_ms']:>8.2f} "
                        f"{row['p99_ms']:>8.2f} {row['mean_ms']:>8.2f} {row['response_bytes']:>8}  "
                        f"{'OK' if row['sanity']['ok'] else 'FAIL'}"
                    )


def targets(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's performance targets against the best store, for information."""
    lines = []
    large = [
        (row["large"]["reports_per_second"], store, cell["epsilon"])
        for cell in cells
        if cell["k"] == 1024
        for store, row in cell["stores"].items()
        if "large" in row
    ]
    if large:
        for store in sorted({s for _, s, _ in large}):
            worst = min(r for r, s, _ in large if s == store)
            lines.append(
                {
                    "target": "reports/s at k = 1024, 1000-report uploads",
                    "goal": TARGET_LARGE_REPORTS,
                    "store": store,
                    "measured_worst_epsilon": worst,
                    "fraction": worst / TARGET_LARGE_REPORTS,
                    "text": f"Target >= {si(TARGET_LARGE_REPORTS)} reports/s at k = 1024 with 1000-report "
                    f"uploads: {store} {si(worst)}/s (worst epsilon), {worst / TARGET_LARGE_REPORTS:.0%} "
                    "of it.",
                }
            )
    small = [
        (row["small"]["uploads_per_second"], store)
        for cell in cells
        for store, row in cell["stores"].items()
        if "small" in row
    ]
    for store in sorted({s for _, s in small}):
        worst = min(r for r, s in small if s == store)
        lines.append(
            {
                "target": "uploads/s with 10-report uploads",
                "goal": TARGET_SMALL_UPLOADS,
                "store": store,
                "measured_worst_cell": worst,
                "fraction": worst / TARGET_SMALL_UPLOADS,
                "text": f"Target >= {si(TARGET_SMALL_UPLOADS)} uploads/s with 10-report uploads: {store} "
                f"{si(worst)}/s (worst cell), {worst / TARGET_SMALL_UPLOADS:.0%} of it.",
            }
        )
    return lines


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__
        + """
The aggregator: this file run with --serve --config CONFIG, one process per store, does what `veil serve
--config CONFIG` does (same JSON logging at info, load_config, Aggregator with its defaults:
16 handler threads, max_batch 10000) and adds one page, /bench/counts, on the aggregator's HTTP
listener, through which the benchmark reads the memory and SQLite stores back. Redis is read directly.

Prints a table per cell and store (reports/s, uploads/s, CPU cores busy per process), the
issue's targets for information, and the latency table; writes all of it, with machine facts,
as JSON.""",
        epilog="""\
Targets are reported, not raised. The exit status is 1 only when a correctness check fails:
a store holds other counts than the reports sent, an upload is refused or answered as a
duplicate, the encoding differs from the SDK's, or an estimates response is malformed.""",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke run (under a minute): one round of tiny runs, no sizing, 40 latency calls; "
        "still checks every count exactly; writes ingest-quick.json unless --output is given",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per cell (default 5; 1 with --quick)")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="aim for one run to take this long when sizing (default 1.0)"
    )
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS), help=f"category counts (default {KS})")
    parser.add_argument(
        "--epsilons", type=float, nargs="+", default=list(EPSILONS), help=f"privacy levels (default {EPSILONS})"
    )
    parser.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES), help="stores (default all)")
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the SQLite store's temporary directory goes: a disk, for fsync to mean what "
        "it does in production, not a tmpfs (default: the system's temporary directory)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=tuple(SHAPES),
        default=list(SHAPES),
        help="load shapes: large = 1000-report uploads, 16 in flight; small = 10-report uploads, "
        "64 in flight (default both)",
    )
    parser.add_argument(
        "--large-in-flight",
        type=int,
        default=SHAPES["large"].in_flight,
        metavar="N",
        help=f"calls in flight with 1000-report uploads (default {SHAPES['large'].in_flight})",
    )
    parser.add_argument(
        "--small-in-flight",
        type=int,
        default=SHAPES["small"].in_flight,
        metavar="N",
        help=f"calls in flight with 10-report uploads (default {SHAPES['small'].in_flight})",
    )
    parser.add_argument(
        "--load-processes",
        type=int,
        default=2,
        help="load generator processes; must divide both in-flight counts (default 2)",
    )
    parser.add_argument(
        "--latency-calls", type=int, help="cached estimate calls per store and protocol (default 2000; 40 with --quick)"
    )
    parser.add_argument(
        "--fresh-calls",
        type=int,
        help="fresh (recomputing) estimate calls per store and protocol (default 200; 8 with --quick)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="server.processes of the Redis store's aggregator: N worker processes sharing the "
        "gRPC port, run by `veil serve` (the memory and SQLite stores keep 1; default 1)",
    )
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the true values and of FastKeystream")
    parser.add_argument("--output", type=Path, help="results JSON (default bench/results/ingest.json)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # of --serve
    args = parser.parse_args(argv)
    if args.serve:
        return args
    if args.rounds is None:
        args.rounds = 1 if args.quick else 5
    if args.latency_calls is None:
        args.latency_calls = 40 if args.quick else 2000
    if args.fresh_calls is None:
        args.fresh_calls = 8 if args.quick else 200
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.rounds < 1 or args.seconds <= 0 or args.latency_calls < 4 or args.fresh_calls < 0:
        parser.error("--rounds must be at least 1, --seconds above 0, --latency-calls at least 4")
    in_flight = {"large": args.large_in_flight, "small": args.small_in_flight}
    args.shape_table = {name: replace(SHAPES[name], in_flight=in_flight[name]) for name in args.shapes}
    if args.load_processes < 1 or any(
        s.in_flight % args.load_processes or s.in_flight < 1 for s in args.shape_table.values()
    ):
        parser.error(
            f"--load-processes must divide every in-flight count ({[s.in_flight for s in args.shape_table.values()]})"
        )
    if args.output is None:
        args.output = RESULTS_DIR / ("ingest-quick.json" if args.quick else "ingest.json")
    return args


def redis_version() -> str | None:
    try:
        return subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args.config)
    started = time.perf_counter()
    machine = machine_info(("numpy", "numba", "grpcio", "protobuf", "redis", "hiredis", "veil"))
    machine["redis_server"] = redis_version() if "redis" in args.stores else None
    machine["load_average_before"] = list(os.getloadavg())
    ledger = Ledger()
    cells: list[dict[str, Any]] = []
    latency = None
    aggregators: dict[str, AggregatorProcess] = {}
    redis_server = None
    sqlite_dir = sqlite_bytes = None
    load = None
    with tempfile.TemporaryDirectory(prefix="veil-bench-ingest-") as scratch:
        try:
            progress(
                f"starting {args.load_processes} load processes and an aggregator per store ({', '.join(args.stores)})"
            )
            load = LoadProcesses(args.load_processes)
            for store in args.stores:
                if store == "redis":
                    redis_server = RedisServer().start()
                    url = redis_server.url
                elif store == "sqlite":
                    sqlite_dir = tempfile.mkdtemp(prefix="veil-bench-sqlite-", dir=args.sqlite_dir)
                    url = f"sqlite://{sqlite_dir}/veil.db"
                else:
                    url = "memory"
                processes = args.processes if store == "redis" else 1  # memory and SQLite: one process
                aggregator = AggregatorProcess(
                    store, url, config_dict(args.ks, args.epsilons, url, processes), Path(scratch)
                )
                if store == "redis":
                    from veil.aggregator.store import RedisStore

                    aggregator.redis = RedisStore(url)
                    aggregator.redis_pid = redis_server.process.pid
                aggregators[store] = aggregator
                progress(
                    f"{store} aggregator: pid {aggregator.pid}, gRPC {aggregator.endpoint}, HTTP port "
                    f"{aggregator.http_port}"
                    + (f", redis-server pid {redis_server.process.pid} at {url}" if store == "redis" else "")
                )
            check_specs(aggregators, args)

            for k in args.ks:
                for epsilon in args.epsilons:
                    tag = f"[k={k} eps={epsilon:g}]"
                    cells.append(measure_cell(k, epsilon, load, aggregators, ledger, args, tag))
            load.stop()
            load = None

            k_latency = max(args.ks)
            progress(
                f"estimate latency at k = {k_latency}: {args.latency_calls} cached and {args.fresh_calls} fresh "
                "calls per store and protocol"
            )
            latency = measure_latency(k_latency, args.epsilons[0], aggregators, ledger, args)
            progress("final check: every metric, every window, every store")
            for aggregator in aggregators.values():
                ledger.verify(aggregator, [m.name for m in aggregator.config.metrics])
        except BaseException:
            for aggregator in aggregators.values():
                progress(f"--- {aggregator.store} aggregator log (tail) ---\n{aggregator.log_tail()}")
            raise
        finally:
            if load is not None:
                load.stop()
            for aggregator in aggregators.values():
                aggregator.stop()
            if redis_server is not None:
                redis_server.cleanup()
            if sqlite_dir is not None:
                sqlite_bytes = sqlite_sizes(sqlite_dir)
                shutil.rmtree(sqlite_dir, ignore_errors=True)

    sane = latency is None or all(
        row["sanity"]["ok"]
        for protocols in latency["results"].values()
        for modes in protocols.values()
        for row in modes.values()
    )
    exact = not ledger.failures
    machine["load_average_after"] = list(os.getloadavg())
    results = {
        "benchmark": "ingest",
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "rounds": args.rounds,
            "seconds_per_run": args.seconds,
            "mechanism": MECHANISM,
            "windows": list(WINDOWS),
            "stores": args.stores,
            "shapes": {
                name: {
                    "batch": shape.batch,
                    "in_flight": shape.in_flight,
                    "reports_per_process_bounds": list(shape.bounds),
                }
                for name, shape in args.shape_table.items()
            },
            "load_processes": args.load_processes,
            "aggregator_processes": {store: a.config.processes for store, a in aggregators.items()},
            "load": "grpc.aio, one channel per in-flight call, generic unary-unary call on pre-serialized "
            "UploadRequest bytes, fresh batch ids per run",
            "aggregator": "subprocess: bench_ingest.py --serve CONFIG (veil serve's logging, load_config, Aggregator "
            "defaults) + /bench/counts page; with --processes N > 1 on Redis: python -m veil.aggregator "
            "--config CONFIG (server.processes = N, CPU summed over the supervisor and workers)",
            "reports": f"true values Zipf {ZIPF_EXPONENT} over a seeded permutation; FastKeystream seeded from "
            f"{args.seed}; counts per prefix by veil.aggregator.simulate.count_reports",
            "latency_calls": args.latency_calls,
            "fresh_calls": args.fresh_calls,
            "sqlite": None if sqlite_bytes is None else {"directory": str(args.sqlite_dir), **sqlite_bytes},
        },
        "ingest": cells,
        "latency": latency,
        "exact_counts": ledger.summary(),
        "summary": {
            "targets": targets(cells),
            "exact_counts_ok": exact,
            "latency_sanity_ok": sane,
            "wall_seconds": time.perf_counter() - started,
        },
    }
    write_results(args.output, results)
    print_tables(results)
    print()
    for failure in ledger.failures:
        print(f"COUNT CHECK FAILED: {failure}")
    print(
        f"Exact-count checks: {ledger.checks - len(ledger.failures)} of {ledger.checks} OK; estimate responses "
        f"{'OK' if sane else 'MALFORMED'}; {results['summary']['wall_seconds']:.0f} s; results in {args.output}"
    )
    return 0 if exact and sane else 1


def sqlite_sizes(directory: str) -> dict[str, int]:
    """The SQLite store's files at the end (bytes): the database and what its WAL holds."""
    sizes = {}
    for name in ("veil.db", "veil.db-wal"):
        path = Path(directory) / name
        sizes[name.replace("veil.db", "database").replace("-wal", "_wal") + "_bytes"] = (
            path.stat().st_size if path.exists() else 0
        )
    return sizes


def check_specs(aggregators: dict[str, AggregatorProcess], args: argparse.Namespace) -> None:
    """The aggregators serve the specs the load processes randomize under (same fingerprints)."""
    import grpc

    from veil.mechanism import MetricSpec
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    wanted = {
        metric_name(k, e): MetricSpec.create(metric_name(k, e), labels(k), MECHANISM, e).fingerprint
        for k in args.ks
        for e in args.epsilons
    }
    for aggregator in aggregators.values():
        with grpc.insecure_channel(aggregator.endpoint) as channel:
            specs = veil_pb2_grpc.CollectorStub(channel).GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(), timeout=30)
        served = {s.name: s.fingerprint for s in specs.specs}
        if served != wanted:
            raise RuntimeError(f"the {aggregator.store} aggregator serves other specs than the benchmark randomizes")


if __name__ == "__main__":
    sys.exit(main())
