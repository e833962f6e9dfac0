"""The load the ingest benchmarks send, and the check that every report they send is counted
exactly: report pools randomized before any timing (ReportPool), load processes sending them
over gRPC (LoadProcesses), what each store must then hold (Ledger), one measured run
(run_once), and the CPU seconds of the processes involved (cpu_seconds, Masters).
bench_ingest.py, bench_capacity.py, bench_device_day.py and profile_ingest.py share them.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _aggregator import CALL_TIMEOUT, MECHANISM, AggregatorProcess, labels, metric_name
from veil_testing.data import zipf_shares

__all__ = [
    "BATCH_ID_HEADER",
    "GRAIN",
    "SHAPES",
    "UPLOAD_PATH",
    "ZIPF_EXPONENT",
    "Ledger",
    "LoadProcesses",
    "Masters",
    "ReportPool",
    "Shape",
    "answer_commands",
    "cpu_seconds",
    "run_once",
]

UPLOAD_PATH = "/veil.wire.v1.Collector/Upload"
BATCH_ID_HEADER = b"\x0a\x10"  # UploadRequest field 1 (batch_id), length-delimited, 16 bytes
ZIPF_EXPONENT = 1.1

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


class Masters:
    """The CPU seconds (INFO cpu: used_cpu_sys + used_cpu_user) of each master of a store."""

    def __init__(self, nodes: list[Any]) -> None:
        self.nodes = nodes

    def seconds(self) -> list[float]:
        out = []
        for node in self.nodes:
            info = node.command("INFO", "cpu", timeout=10).decode()
            fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
            out.append(float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"]))
        return out


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
