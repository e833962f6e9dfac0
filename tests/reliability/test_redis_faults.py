"""Redis faults under load: killed, stopped, stalled. Acknowledged batches are never lost or
counted twice, uploads fail fast while Redis is away, health says so, and memory stays flat.

Durability is Redis's own (docs/operating.md, "Durability"):

- ``appendonly yes`` + ``appendfsync always``: Redis writes and fsyncs its AOF before it answers,
  so a batch the aggregator acknowledged survives a crash of Redis or of its host. Tested below
  by SIGKILLing Redis mid-load.
- ``appendfsync everysec``: Redis writes the AOF before answering but fsyncs it once a second,
  so a crash of the *host* (power, kernel) can lose about the last second of acknowledged
  batches, up to 2 s when the disk lags (Redis then postpones the write, and a crash of Redis
  alone can lose that too). A process kill, the only crash a test can cause here, leaves the
  written data in the OS page cache, so that window is stated, not tested.
- Replication is asynchronous; ``[store] wait_replicas`` makes the aggregator WAIT for replicas
  after every batch (see docs/operating.md).

Every test counts exactly: Redis must hold the counts of exactly the reports the devices saw
acknowledged (see reliability_kit.assert_exact), plus the batches uploaded here directly.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from reliability_kit import METRICS, Load, RawBatch, assert_exact, flush_all, scaled
from veil_testing.waiting import wait_until

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

pytestmark = pytest.mark.starts_first  # a minute or more: Redis stopped, stalled and failed over

MIB = 1024 * 1024


def test_redis_sigkill_with_appendfsync_always_loses_no_acknowledged_batch(
    make_redis_server, make_proxy, make_aggregator, make_device, tmp_path
):
    """Redis SIGKILLed and restarted (same AOF) four times or more under load: nothing
    acknowledged is lost and nothing is counted twice.

    The aggregator reaches Redis through ReplyDelayProxy (replies held 50 ms), so each kill
    finds scripts that Redis has run, and written to its fsynced AOF, but whose replies never
    reached the aggregator: those batches come back from the SDK and must be recognized as
    duplicates from the dedupe keys restored from the AOF (asserted: duplicates > 0)."""
    redis = make_redis_server(appendonly=True, appendfsync="always")
    proxy = make_proxy(redis.port, 0.05)
    serve = make_aggregator(proxy.url, store={"timeout": 1.0}).start()
    devices = [
        make_device(serve.endpoint, seed, queue_dir=tmp_path / f"device-{seed}" if seed == 1 else None)
        for seed in range(3)
    ]
    rng = random.Random(7)
    with Load(devices, rate=400):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        # At least four kills, and more (up to twelve) until one has stranded an applied batch:
        # whether a reply is held at the moment of a kill is a matter of timing.
        for kill in range(12):
            time.sleep(rng.uniform(0.5, 1.0))
            redis.kill()
            time.sleep(rng.uniform(0.2, 1.0))
            redis.start()  # same port, same directory: the AOF is loaded before it answers
            time.sleep(0.5)
            if kill >= 3 and wait_until(lambda: sum(d.duplicates for d in devices) > 0, 2):
                break
    assert wait_until(lambda: serve.health() == "SERVING", 10)
    flush_all(devices)
    summary = assert_exact(devices, redis.url)
    assert summary["retried"] > 0, summary
    assert summary["duplicates"] > 0, f"no kill stranded an applied batch: {summary}"
    print(f"\nRedis SIGKILLed 4 times (appendfsync always): {summary}")


def test_redis_stall_past_the_client_deadline_counts_late_batches_once(make_redis_server, make_aggregator, make_device):
    """Redis frozen (SIGSTOP) for 1.5 s, longer than the devices' 1 s upload deadline but within
    the aggregator's 2 s store timeout: the devices give up on uploads that Redis then applies
    when it resumes; their retries carry the same batch ids and are counted once."""
    redis = make_redis_server()
    serve = make_aggregator(redis.url, store={"timeout": 2.0}).start()
    devices = [make_device(serve.endpoint, seed) for seed in range(3)]
    with Load(devices, rate=400):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        for _ in range(2):
            time.sleep(0.8)
            redis.process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(1.5)
            finally:
                redis.process.send_signal(signal.SIGCONT)
        time.sleep(0.5)
    flush_all(devices)
    summary = assert_exact(devices, redis.url)
    assert summary["retried"] > 0 and summary["duplicates"] > 0, summary
    print(f"\nRedis stalled twice for 1.5 s: {summary}")


def test_failover_to_a_replica_with_wait_loses_no_acknowledged_batch(make_redis_server, make_aggregator, make_device):
    """The primary (no persistence at all) SIGKILLed under load, its replica promoted (with a
    new replica of its own, as Sentinel would arrange) and the aggregator restarted on it: with
    ``wait_replicas = 1`` the aggregator acknowledged a batch only once a replica had it, so the
    promoted replica holds every acknowledged batch, and the dedupe keys of batches whose WAIT
    failed, so their retries are counted once."""
    primary = make_redis_server()
    replica = make_redis_server(replicaof=primary)
    assert wait_until(lambda: b"master_link_status:up" in replica.command("INFO", "replication"), 10)
    serve = make_aggregator(primary.url, store={"timeout": 1.0, "wait_replicas": 1, "wait_timeout_ms": 500}).start()
    devices = [make_device(serve.endpoint, seed) for seed in range(3)]
    with Load(devices, rate=400):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        time.sleep(1.5)
        primary.kill()
        assert replica.command("REPLICAOF", "NO", "ONE").startswith(b"+OK")
        serve.kill()
        serve.set_store_url(replica.url)
        serve.start()
        # No replica could acknowledge a write: the store is unavailable until one connects.
        assert serve.health() == "NOT_SERVING"
        second = make_redis_server(replicaof=replica)
        assert wait_until(lambda: b"master_link_status:up" in second.command("INFO", "replication"), 10)
        assert wait_until(lambda: serve.health() == "SERVING", 5)
        time.sleep(1.0)
    flush_all(devices)
    summary = assert_exact(devices, replica.url)
    assert summary["retried"] > 0, summary
    print(f"\nfailover to the replica (WAIT 1): {summary}")


class Hammer:
    """Threads uploading large valid batches (fresh batch ids) as fast as the aggregator
    answers, recording each outcome, its latency and the bytes sent."""

    def __init__(self, endpoint: str, batch: RawBatch, threads: int = 4) -> None:
        self.batch = batch
        self.channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 64 * MIB)])
        self.stub = veil_pb2_grpc.CollectorStub(self.channel)
        self.codes: dict[str, int] = {}
        self.latencies: list[float] = []
        self.bytes = 0
        self.details: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def upload(self) -> str:
        started = time.monotonic()
        try:
            self.stub.Upload(self.batch.request(os.urandom(16)), timeout=15)
            code, details = "OK", ""
        except grpc.RpcError as error:
            code, details = error.code().name, error.details() or ""
        with self._lock:
            self.latencies.append(time.monotonic() - started)
            self.codes[code] = self.codes.get(code, 0) + 1
            self.bytes += self.batch.size
            self.details.add(details)
        return code

    def _run(self) -> None:
        while not self._stop.is_set():
            self.upload()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
            assert not thread.is_alive()
        self.channel.close()


def _healthz(serve) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{serve.http_port}/healthz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _bulk(devices) -> RawBatch:
    """A valid 40,000-report batch of the 256-category metric: 1.25 MiB of bitmaps."""
    return RawBatch(devices[0].reporter.metrics["bulk"], 40_000, seed=5)


def _warm_up(hammer: Hammer, uploads: int) -> None:
    """Uploads acknowledged (and counted) with the hammer's concurrency, so the aggregator has
    compiled its decoders and sized its buffers before any memory is measured."""
    threads = [threading.Thread(target=hammer.upload) for _ in range(uploads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert hammer.codes == {"OK": uploads}, hammer.codes
    hammer.codes, hammer.latencies, hammer.bytes, hammer.details = {}, [], 0, set()


@pytest.mark.parametrize("outage", [5.0, pytest.param(30.0, marks=pytest.mark.slow)])
def test_redis_outage_fails_fast_and_not_serving_then_backlog_drains_exactly(
    outage, make_redis_server, make_aggregator, make_device, tmp_path
):
    """Redis stopped for ``outage`` seconds while devices keep reporting and two threads keep
    uploading 1.25 MiB batches:

    - every upload during the outage is refused with UNAVAILABLE, fast (well inside the SDK's
      deadline), with a message naming no address, and none of them is counted;
    - gRPC health turns NOT_SERVING within ~2 s of the stop and stays so for the whole outage,
      HTTP /healthz answers 503, Estimates.Get answers UNAVAILABLE; SERVING again within ~2 s
      of Redis's return;
    - once Redis is back the devices' backlogs (in memory, and spooled under a queue directory)
      drain, and the counts are exact.
    (Memory during an outage: test_aggregator_memory_stays_flat_while_redis_is_down.)
    """
    redis = make_redis_server(appendonly=True, appendfsync="always")  # stop() and start() keep the counts
    serve = make_aggregator(redis.url, server={"max_batch": 40_000}, store={"timeout": 1.0}).start()
    devices = [
        make_device(serve.endpoint, seed, queue_dir=tmp_path / f"device-{seed}" if seed == 1 else None)
        for seed in range(3)
    ]
    assert all(d.reporter.wait_for_specs(30) for d in devices)
    bulk = _bulk(devices)
    hammer = Hammer(serve.endpoint, bulk, threads=2)
    with Load(devices, rate=300):
        _warm_up(hammer, 2)
        time.sleep(0.5)
        redis.stop()
        stopped = time.monotonic()
        assert wait_until(lambda: serve.health() == "NOT_SERVING", 5), "health still SERVING 5 s into the outage"
        not_serving_after = time.monotonic() - stopped
        hammer.start()
        health_seen, healthz_seen = set(), set()
        estimates_code = None
        while time.monotonic() - stopped < outage:
            time.sleep(0.25)
            health_seen.add(serve.health())
            healthz_seen.add(_healthz(serve))
            if estimates_code is None:
                try:
                    veil_pb2_grpc.EstimatesStub(hammer.channel).Get(
                        veil_pb2.EstimatesRequest(metric="browser"), timeout=10
                    )
                    estimates_code = "OK"
                except grpc.RpcError as error:
                    estimates_code = error.code().name
        hammer.stop()
        backlog = [d.reporter.counters() for d in devices]
        redis.start()
        restarted = time.monotonic()
        assert wait_until(lambda: serve.health() == "SERVING", 5), "health not SERVING 5 s after Redis returned"
        serving_after = time.monotonic() - restarted
        time.sleep(1.0)
    flush_all(devices)
    summary = assert_exact(devices, redis.url, extra={"bulk": scaled(bulk.counts, 2)})

    refused, slowest = sum(hammer.codes.values()), max(hammer.latencies)
    report = (
        f"outage {outage:.0f} s: NOT_SERVING after {not_serving_after:.2f} s, SERVING {serving_after:.2f} s "
        f"after the return; {refused} uploads ({hammer.bytes / MIB:.0f} MiB) refused {hammer.codes}, slowest "
        f"{slowest:.2f} s; estimates {estimates_code}; backlog at the return "
        f"{[c.queued for c in backlog]}; {summary}"
    )
    print("\n" + report)
    assert set(hammer.codes) == {"UNAVAILABLE"} and refused >= outage, report
    assert hammer.details == {"The counter store is unavailable; retry with the same batch id."}, hammer.details
    assert slowest < 2.5, report  # fail fast: a few store timeouts at most, never the SDK's 10 s deadline
    assert health_seen == {"NOT_SERVING"}, health_seen
    assert healthz_seen == {503}, healthz_seen
    assert estimates_code == "UNAVAILABLE", report
    assert not_serving_after < 3 and serving_after < 3, report
    assert all(c.queued > 0 for c in backlog), backlog  # every device had a backlog to drain
    assert summary["retried"] > 0, summary


# A batch kept per refused upload would add all of the ~400 MiB uploaded. What the aggregator
# legitimately adds: eight 1.25 MiB requests in flight, allocator arenas, and (until the cycle in
# the next test is fixed) garbage awaiting the cyclic collector: measured +20..25 MiB with the
# cycles collected at once, +40..56 MiB without (2 cores, loaded machine).
MEMORY_BOUND_MIB = 96
TREND_BOUND_MIB = 48


def test_aggregator_memory_stays_flat_while_redis_is_down(make_redis_server, make_aggregator, make_device):
    """Redis down while eight threads upload 1.25 MiB batches as fast as they are refused, some
    400 MiB in 12 s: the aggregator buffers nothing, so its resident memory (VmRSS) rises by at
    most 96 MiB over its warmed-up level and does not keep rising: the peak of the last third of
    the outage is within 48 MiB of the first third's."""
    redis = make_redis_server()
    serve = make_aggregator(redis.url, server={"max_batch": 40_000}, store={"timeout": 1.0}).start()
    device = make_device(serve.endpoint, 0)
    assert device.reporter.wait_for_specs(30)
    hammer = Hammer(serve.endpoint, _bulk([device]), threads=8)
    _warm_up(hammer, 16)
    time.sleep(0.5)
    baseline = serve.rss_kib()
    redis.stop()
    assert wait_until(lambda: serve.health() == "NOT_SERVING", 5)
    hammer.start()
    samples, started = [], time.monotonic()
    while time.monotonic() - started < 12 and hammer.bytes < 8 * MEMORY_BOUND_MIB * MIB:
        time.sleep(0.2)
        samples.append((time.monotonic() - started, serve.rss_kib()))
    hammer.stop()
    elapsed = time.monotonic() - started
    peak = max(rss for _, rss in samples)
    first = max(rss for t, rss in samples if t <= elapsed / 3)
    last = max(rss for t, rss in samples if t >= 2 * elapsed / 3)
    growth, trend = (peak - baseline) / 1024, (last - first) / 1024
    report = (
        f"{sum(hammer.codes.values())} uploads ({hammer.bytes / MIB:.0f} MiB) refused {hammer.codes} in "
        f"{elapsed:.1f} s; RSS {baseline / 1024:.0f} MiB -> peak {peak / 1024:.0f} MiB (+{growth:.0f} MiB), "
        f"last third vs first {trend:+.0f} MiB"
    )
    print("\n" + report)
    assert set(hammer.codes) == {"UNAVAILABLE"}, report
    assert hammer.bytes > 3 * MEMORY_BOUND_MIB * MIB, f"too little uploaded to tell buffering from noise: {report}"
    assert growth < MEMORY_BOUND_MIB, report
    assert trend < TREND_BOUND_MIB, report


def test_refused_uploads_are_freed_without_the_cyclic_garbage_collector(make_redis_server):
    """With the cyclic garbage collector off, uploads refused while Redis is down (health
    already NOT_SERVING) leave no request object behind: they are freed by reference counting
    as soon as they are answered, so an outage costs no memory however long it lasts, whatever
    the collector's thresholds (which grow with the heap). In-process, to count the objects.
    (They are refused without a Redis call: redis-py 8.1.0's failed connect keeps its caller's
    frames, request included, in an exception <-> frame cycle until the cyclic GC runs.)"""
    redis = make_redis_server()
    config = parse_config(
        {
            "server": {"grpc": "127.0.0.1:0", "http": ""},
            "store": {"url": redis.url, "timeout": 1.0},
            "metrics": METRICS,
        }
    )
    aggregator = Aggregator(config)
    aggregator.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}")
    try:
        stub, health = veil_pb2_grpc.CollectorStub(channel), health_pb2_grpc.HealthStub(channel)
        batch = RawBatch(config.metric("os").spec, 1000, seed=3)
        stub.Upload(batch.request(os.urandom(16)), timeout=10)  # warm: decoders ready, connections made
        redis.stop()
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == not_serving, 5)
        sent = []  # this side's request objects, kept so that the server's can be told apart
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                sent.append(batch.request(os.urandom(16)))
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Upload(sent[-1], timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            time.sleep(0.3)
            ours = {id(request) for request in sent}
            left = sum(1 for o in gc.get_objects() if isinstance(o, veil_pb2.UploadRequest) and id(o) not in ours)
        finally:
            gc.enable()
        assert left == 0, f"{left} of 20 refused requests are still alive, held only by reference cycles"
    finally:
        channel.close()
        aggregator.stop(grace=0)
