"""A Redis that answers but refuses writes: memory full under noeviction (what deploy/
recommends), a failed RDB save (MISCONF, as with a full disk), a read-only replica. Every
refusal is UNAVAILABLE (retry with the same batch id), never INTERNAL; health is NOT_SERVING
while writes are refused; the devices keep their batches, and once Redis takes writes again
the counts are exact. A Redis that evicts keys is refused at start and NOT_SERVING in health.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
import redis as redis_py
from reliability_kit import METRICS, Load, RawBatch, assert_exact, flush_all
from veil_testing.waiting import wait_until

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator
from veil.aggregator.errors import ConfigError
from veil.wire.v1 import veil_pb2_grpc


def _refuse(client: redis_py.Redis, server, kind: str) -> None:
    if kind == "oom":
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # below what Redis already uses: every write refused
    elif kind == "misconf":
        # A background save that cannot rename its file fails, and Redis then stops writes.
        os.mkdir(server.dir / "dump.rdb")
        client.config_set("stop-writes-on-bgsave-error", "yes")
        client.config_set("save", "3600 1")  # writes stop only when snapshots are configured
        client.bgsave()
        assert wait_until(lambda: client.info("persistence")["rdb_last_bgsave_status"] == "err", 10)
    else:  # a primary demoted to a replica of a primary that is not there
        client.replicaof("127.0.0.1", "1")


def _recover(client: redis_py.Redis, server, kind: str) -> None:
    if kind == "oom":
        client.config_set("maxmemory", "0")
    elif kind == "misconf":
        os.rmdir(server.dir / "dump.rdb")
        client.bgsave()
        assert wait_until(lambda: client.info("persistence")["rdb_last_bgsave_status"] == "ok", 10)
    else:
        client.replicaof("NO", "ONE")


@pytest.mark.parametrize("kind", ["oom", "misconf", "readonly"])
def test_a_redis_refusing_writes_is_unavailable_not_serving_and_loses_nothing(
    kind, make_redis_server, make_aggregator, make_device, tmp_path
):
    server = make_redis_server()
    client = redis_py.Redis.from_url(server.url)
    serve = make_aggregator(server.url).start()
    devices = [
        make_device(serve.endpoint, seed, queue_dir=tmp_path / "device-1" if seed == 1 else None) for seed in range(2)
    ]
    assert all(d.reporter.wait_for_specs(30) for d in devices)
    spec = devices[0].reporter.metrics["browser"]
    raw = RawBatch(spec, 50, seed=9)
    stub = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(serve.endpoint))
    with Load(devices, rate=300):
        time.sleep(1.0)
        _refuse(client, server, kind)
        assert wait_until(lambda: serve.health() == "NOT_SERVING", 5), "health SERVING while writes are refused"
        codes = set()
        for _ in range(5):
            try:
                stub.Upload(raw.request(os.urandom(16)), timeout=10)
                codes.add("OK")
            except grpc.RpcError as error:
                codes.add(error.code().name)
            time.sleep(0.3)
        refused = [d.reporter.counters() for d in devices]
        _recover(client, server, kind)
        assert wait_until(lambda: serve.health() == "SERVING", 5), "health not SERVING once writes are taken"
        time.sleep(0.5)
    flush_all(devices)
    assert codes == {"UNAVAILABLE"}, codes
    assert all(c.failed == 0 and c.queued > 0 for c in refused), refused
    assert_exact(devices, server.url)
    assert "INTERNAL" not in serve.log_text()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_a_redis_that_evicts_keys_is_refused_at_start_and_not_serving_later(policy, make_redis_server):
    server = make_redis_server()
    client = redis_py.Redis.from_url(server.url)
    config = parse_config(
        {"server": {"grpc": "127.0.0.1:0", "http": ""}, "store": {"url": server.url}, "metrics": METRICS}
    )
    client.config_set("maxmemory-policy", policy)
    with pytest.raises(ConfigError, match=f"maxmemory-policy {policy}"):
        Aggregator(config).start()
    client.config_set("maxmemory-policy", "noeviction")
    aggregator = Aggregator(config)
    aggregator.start()
    try:
        assert aggregator._store_ok is True
        client.config_set("maxmemory-policy", policy)
        aggregator._check_store()
        assert aggregator._store_ok is False
    finally:
        aggregator.stop(0)


def test_a_frozen_redis_turns_health_not_serving_within_about_two_seconds(make_redis_server, make_aggregator):
    # The health ping has its own client: one attempt of at most a second, no retries (before:
    # the uploads' 2 s timeout times three attempts, SERVING for 6.5-7.4 s into a freeze).
    server = make_redis_server()
    serve = make_aggregator(server.url).start()
    assert wait_until(lambda: serve.health() == "SERVING", 5)
    server.process.send_signal(signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        assert wait_until(lambda: serve.health() == "NOT_SERVING", 10)
        after = time.monotonic() - frozen
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert after < 3.0, f"NOT_SERVING only {after:.1f} s into the freeze"
    assert wait_until(lambda: serve.health() == "SERVING", 5)
