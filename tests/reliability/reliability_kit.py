"""What the reliability tests share: a `veil serve` process that can be killed and restarted, seeded
SDK devices that know the ground truth of what they sent, and exact reads of Redis and of SQLite files.

    serve = ServeProcess(tmp_path, aggregator_config(redis.url)).start()   # veil_testing.processes
    devices = [Device(serve.endpoint, seed) for seed in range(3)]
    with Load(devices):                                          # report() in a thread per device
        serve.kill(); serve.start()
    flush_all(devices)
    assert_exact(devices, redis.url)                             # n, V_j (per weight), every window

Ground truth: a Device draws its reports with SeededRandomSource(seed) and replays every draw on
a second SeededRandomSource(seed) (the "shadow"), so it knows each report the Reporter queued
without looking inside the SDK. When a device ends with dropped == failed == queued == 0, every
queued report was in a batch the aggregator acknowledged, so the shadow reports are exactly the
acknowledged ones, and Redis must hold exactly their counts.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import random
import selectors
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import grpc
import numpy as np
from veil_testing.config_toml import LOAD
from veil_testing.processes import free_port

from veil.aggregator.counts import Counts
from veil.aggregator.store import CountsKey, RedisStore
from veil.client import Reporter
from veil.mechanism import MetricSpec, SeededRandomSource
from veil.wire.v1 import veil_pb2

# Labels are distinctive strings, so a scrape can tell whether any of them leaked. Each simulated
# device stands for many (its reports are the load), so a device may send LOAD a period.
METRICS = [
    {
        "name": "browser",
        "labels": [
            f"browser.{b}.lbl" for b in ("chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "other")
        ],
        "mechanism": "subset",
        "epsilon": 1.0,
        "windows": ["total", "1h"],
        "reports_per_period": LOAD,
    },
    {
        "name": "crash_screen",
        "labels": [f"crash.screen{i}.lbl" for i in range(8)],
        "mechanism": "rappor",
        "epsilon": 2.0,
        "reports_per_period": LOAD,
    },
    {
        "name": "os",
        "labels": [f"os.{o}.lbl" for o in ("android", "ios", "windows", "macos", "linux", "other")],
        "mechanism": "krr",
        "epsilon": 2.0,
        "reports_per_period": LOAD,
    },
    # Large uploads for memory tests: 32-byte bitmaps, q = 69 of k = 256.
    {"name": "bulk", "labels": [f"bulk.{i}.lbl" for i in range(256)], "mechanism": "subset", "epsilon": 1.0},
]
LABELS = {m["name"]: m["labels"] for m in METRICS}
DEVICE_METRICS = ("browser", "crash_screen", "os")  # what the devices report (bulk is for raw uploads)

# The SDK tuned for tests: batches cut every 250 ms, short deadlines and backoffs, a queue that
# never fills (a drop would make the ground truth unknowable; the tests assert there is none).
# The SDK sends its outbox one batch at a time, so a backlog drains at (batch size / round trip):
# batches much smaller than this would not drain between kills when Redis's replies are delayed.
FAST_SDK = {
    "max_queue_size": 1_000_000,
    "max_batch_size": 256,
    "schedule_delay_ms": 250,
    "export_timeout_ms": 1000,
    "retry_initial_backoff_ms": 20,
    "retry_max_backoff_ms": 250,
}


def aggregator_config(
    store_url: str, *, server: dict | None = None, store: dict | None = None, auth: dict | None = None
) -> dict:
    """The config of a `veil serve` process of these tests (processes.ServeProcess): METRICS, on a
    fixed free gRPC port (a restart listens where the devices reconnect)."""
    config = {
        "server": {
            "grpc": f"127.0.0.1:{free_port()}",
            "http": "127.0.0.1:0",
            "min_n": 100,
            "watch_interval": 0.1,
            "grace_period": 2.0,
            **(server or {}),
        },
        "store": {"url": store_url, **(store or {})},
        "metrics": METRICS,
    }
    if auth is not None:
        config["auth"] = auth
    return config


class ReplyDelayProxy:
    """A TCP proxy on loopback in front of Redis that passes requests at once and holds every
    reply for ``delay`` seconds (order kept). A batch is then applied in Redis ``delay`` seconds
    before the aggregator hears of it, so an aggregator killed at a random moment has often
    applied batches it never acknowledged: the window that exactly-once must survive.

    One thread does every socket operation (a selector loop), so no socket is closed under
    another thread's feet."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="redis-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        pairs: set[tuple[socket.socket, socket.socket]] = set()
        replies: list[tuple[float, int, tuple[socket.socket, socket.socket], bytes]] = []  # a heap
        sequence = itertools.count()

        def close(pair: tuple[socket.socket, socket.socket]) -> None:
            if pair in pairs:
                pairs.discard(pair)
                for sock in pair:
                    selector.unregister(sock)
                    sock.close()

        while not self._closed.is_set():
            timeout = 0.05 if not replies else min(0.05, max(0.0, replies[0][0] - time.monotonic()))
            for key, _ in selector.select(timeout):
                if key.data is None:
                    client, _ = self._listener.accept()
                    try:
                        upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=1)
                    except OSError:
                        client.close()  # Redis is down, so is this connection
                        continue
                    pair = (client, upstream)
                    pairs.add(pair)
                    for sock, role in ((client, "request"), (upstream, "reply")):
                        sock.settimeout(5)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        selector.register(sock, selectors.EVENT_READ, (pair, role))
                    continue
                pair, role = key.data
                if pair not in pairs:
                    continue
                try:
                    data = key.fileobj.recv(65536)
                    if data and role == "request":
                        pair[1].sendall(data)
                except OSError:
                    data = b""
                if not data:
                    close(pair)
                elif role == "reply":
                    heapq.heappush(replies, (time.monotonic() + self.delay, next(sequence), pair, data))
            while replies and replies[0][0] <= time.monotonic():
                _, _, pair, data = heapq.heappop(replies)
                if pair in pairs:
                    try:
                        pair[0].sendall(data)
                    except OSError:
                        close(pair)
        for pair in list(pairs):
            close(pair)
        selector.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._listener.close()


# --- devices and their ground truth ----------------------------------------------------------


class Device:
    """A Reporter with a seeded random source, and the exact reports it queued (see module doc).

    One thread calls report() at a time (the shadow replays the draws in the same order)."""

    def __init__(
        self,
        endpoint: str,
        seed: int,
        *,
        queue_dir: Path | None = None,
        token: str | None = None,
        memoize: bool = False,
        **options: object,
    ) -> None:
        self.seed = seed
        self.memoize = memoize
        self.reporter = Reporter(
            endpoint,
            tls=False,
            token=token,
            queue_dir=queue_dir,
            memoize=memoize,
            random_source=SeededRandomSource(seed),
            **{**FAST_SDK, **options},
        )
        self.duplicates = 0  # uploads the aggregator answered "already counted"
        self.acknowledged: dict[bytes, bytes] = {}  # batch id -> the UploadRequest bytes, once acknowledged
        self._observe_duplicates()
        self._shadow = SeededRandomSource(seed)
        self._memo: dict[tuple[str, int], tuple[int, ...]] = {}
        self.values = random.Random(10_000 + seed)  # the true values
        self.truth: dict[str, list[tuple[int, ...]]] = {}  # metric -> every report queued

    def _observe_duplicates(self) -> None:
        """Record acknowledged batches, and count acknowledgements of batches counted on an earlier
        attempt (UploadResponse.duplicate, or a BatchResult's in an UploadBatches answer), by
        wrapping the SDK's transport: an observation only, the uploads themselves are unchanged."""
        transport = self.reporter._processor.transport
        upload, upload_batches = transport.upload, transport.upload_batches

        def acknowledge(payload: bytes, duplicate: bool) -> None:
            self.duplicates += duplicate
            self.acknowledged[veil_pb2.UploadRequest.FromString(payload).batch_id] = payload

        def observed(payload: bytes, timeout: float) -> grpc.Future:
            def record(future: grpc.Future) -> None:  # runs before the worker hears of the outcome
                if future.exception() is None:
                    acknowledge(payload, future.result().duplicate)

            future = upload(payload, timeout)
            future.add_done_callback(record)
            return future

        def observed_batches(payload: bytes, timeout: float) -> grpc.Future:
            def record(future: grpc.Future) -> None:
                if future.exception() is not None:
                    return
                batches = veil_pb2.UploadBatchesRequest.FromString(payload).batches
                for batch, result in zip(batches, future.result().results):
                    if result.code == 0:  # counted, or counted before
                        acknowledge(batch.SerializeToString(), result.duplicate)

            future = upload_batches(payload, timeout)
            future.add_done_callback(record)
            return future

        transport.upload, transport.upload_batches = observed, observed_batches

    def report(self, metric: str, index: int) -> None:
        self.reporter.report(metric, LABELS[metric][index])
        spec = self.reporter.metrics[metric]
        if not self.memoize:
            report = spec.mechanism.randomize(index, self._shadow)
        elif (report := self._memo.get((metric, index))) is None:  # the SDK draws once per value
            report = self._memo[(metric, index)] = spec.mechanism.randomize(index, self._shadow)
        self.truth.setdefault(metric, []).append(report)

    def report_some(self, count: int, metrics: Sequence[str] = DEVICE_METRICS) -> None:
        """``count`` reports of skewed true values over ``metrics``."""
        for _ in range(count):
            metric = metrics[self.values.randrange(len(metrics))]
            k = len(LABELS[metric])
            # Skewed: category j with weight 1 / (j + 1), so the counts differ per category.
            index = min(int(k * self.values.random() ** 2.5), k - 1)
            self.report(metric, index)


class Load:
    """report_some() in one thread per device, about ``rate`` reports per second each, until
    the block ends (or stop()). Exceptions in a load thread fail the test at stop()."""

    def __init__(self, devices: Iterable[Device], rate: float = 800.0, burst: int = 16) -> None:
        self.devices = list(devices)
        self.rate, self.burst = rate, burst
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(d,), name=f"load-{d.seed}", daemon=True) for d in self.devices
        ]

    def _run(self, device: Device) -> None:
        try:
            assert device.reporter.wait_for_specs(30), "no specs within 30 s"
            pause = self.burst / self.rate
            next_at = time.monotonic()
            while not self._stop.is_set():
                device.report_some(self.burst)
                next_at += pause
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self._errors.append(error)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
            assert not thread.is_alive(), "a load thread did not stop"
        if self._errors:
            raise self._errors[0]

    def __exit__(self, *exc: object) -> None:
        self.stop()


def flush_all(devices: Iterable[Device], timeout: float = 60.0) -> None:
    for device in devices:
        assert device.reporter.force_flush(timeout), device.reporter.counters()


# --- counts: expected and stored -------------------------------------------------------------


def counts_of(spec: MetricSpec, reports: Iterable[tuple[int, ...]]) -> Counts:
    """n_t and V_j^(t) of reports, computed here (independently of the aggregator's kernels)."""
    counts = Counts.zeros(spec.mechanism)
    rows = counts.row_of_weight()
    for report in reports:
        row = rows[len(report)]
        assert row >= 0, f"report weight {len(report)} is not a weight of {spec.name}"
        counts.n[row] += 1
        counts.v[row, list(report)] += 1
    return counts


def stored_counts(store_url: str, spec: MetricSpec, window: str = "total") -> Counts:
    """The counts in the store (Redis, or a SQLite file) for a metric's window, summed over every
    bucket of the window."""
    if store_url.startswith("sqlite://"):
        return sqlite_counts(store_url.removeprefix("sqlite://"), spec, window)
    store = RedisStore(store_url)
    try:
        weights, k = spec.mechanism.weight_law().weights, spec.k
        if window == "total":
            return store.read(CountsKey(spec.name, spec.fingerprint, "total", 0), weights, k)
        buckets = set()  # every bucket of the window, found in any shard (one unless a cluster)
        for shard_hash in store.bucket_hashes(CountsKey(spec.name, spec.fingerprint, window, 0)):
            for name in store._redis.scan_iter(match=shard_hash[:-1] + "*", count=1000):
                buckets.add(int(name.rsplit(b":", 1)[1]))
        total = Counts.zeros(spec.mechanism)
        for bucket in buckets:
            total.add(store.read(CountsKey(spec.name, spec.fingerprint, window, bucket), weights, k))
        return total
    finally:
        store.close()


def sqlite_counts(path: str, spec: MetricSpec, window: str = "total") -> Counts:
    """As stored_counts, from a SQLite store's file, read here from its tables (read-only: an
    aggregator may be serving it), unexpired buckets only."""
    total = Counts.zeros(spec.mechanism)
    rows = total.row_of_weight()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        for weight, n, v in db.execute(
            "SELECT c.weight, c.n, c.v FROM counters c JOIN buckets b ON b.id = c.bucket WHERE b.metric = ? AND "
            "b.fingerprint = ? AND b.window = ? AND (b.expires_at IS NULL OR b.expires_at > ?)",
            (spec.name, spec.fingerprint, window, time.time()),
        ):
            total.n[rows[weight]] += n
            total.v[rows[weight]] += np.frombuffer(v, "<i8")
    return total


def describe(counts: Counts) -> str:
    return f"n = {counts.total} (per weight {counts.n.tolist()}), V = {counts.totals.tolist()}"


def assert_exact(devices: Sequence[Device], store_url: str, extra: dict[str, Counts] | None = None) -> dict:
    """Every device ended with nothing dropped, failed or queued, and the store holds exactly the
    counts of the reports they queued (plus ``extra``, counts acknowledged outside the SDK), in
    every window. Returns a summary for messages."""
    counters = [d.reporter.counters() for d in devices]
    for device, c in zip(devices, counters, strict=True):
        assert (c.dropped, c.failed, c.queued) == (0, 0, 0), (device.seed, c)
        queued = sum(len(r) for r in device.truth.values())
        assert c.sent == c.accepted == queued, (device.seed, c, queued)
    specs = devices[0].reporter.metrics
    checked = {}
    for metric in sorted({m for d in devices for m in d.truth} | set(extra or {})):
        spec = specs[metric]
        expected = counts_of(spec, (r for d in devices for r in d.truth.get(metric, ())))
        if extra and metric in extra:
            expected.add(extra[metric])
        windows = next(m.get("windows", ["total"]) for m in METRICS if m["name"] == metric)
        for window in windows:
            stored = stored_counts(store_url, spec, window)
            assert stored == expected, (
                f"{metric} [{window}]: the store holds {describe(stored)}; the acknowledged ground truth is "
                f"{describe(expected)}"
            )
        checked[metric] = expected.total
    assert sum(c.sent for c in counters) == sum(v for m, v in checked.items() if not extra or m not in extra)
    return {
        "sent": sum(c.sent for c in counters),
        "retried": sum(c.retried for c in counters),
        "duplicates": sum(d.duplicates for d in devices),
        "per_metric": checked,
    }


# --- raw uploads (outside the SDK) -----------------------------------------------------------


def bitmap_reports(spec: MetricSpec, reports: Sequence[tuple[int, ...]]) -> bytes:
    """Reports as the wire's k-bit bitmaps (bit j % 8 of byte j // 8), encoded here."""
    width = (spec.k + 7) // 8
    return b"".join(sum(1 << j for j in report).to_bytes(width, "little") for report in reports)


class RawBatch:
    """A valid batch of ``count`` reports of ``spec`` (``distinct`` seeded reports repeated), as a
    serialized UploadRequest for any batch id, with its exact counts."""

    def __init__(self, spec: MetricSpec, count: int, seed: int, distinct: int = 1000) -> None:
        source = SeededRandomSource(seed)
        rng = random.Random(seed)
        unique = [spec.mechanism.randomize(rng.randrange(spec.k), source) for _ in range(distinct)]
        reports = [unique[i % distinct] for i in range(count)]
        self.spec = spec
        self.count = count
        self.counts = counts_of(spec, reports)
        self._bits = bitmap_reports(spec, reports)

    def request(self, batch_id: bytes) -> veil_pb2.UploadRequest:
        return veil_pb2.UploadRequest(
            batch_id=batch_id,
            metric=self.spec.name,
            spec_fingerprint=self.spec.fingerprint,
            count=self.count,
            bitmaps=veil_pb2.Bitmaps(bits=self._bits),
        )

    @property
    def size(self) -> int:
        return len(self._bits)


def scaled(counts: Counts, factor: int) -> Counts:
    return Counts(counts.weights, counts.n * factor, counts.v * factor)
