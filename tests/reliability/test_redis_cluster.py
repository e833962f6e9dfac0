"""A Redis Cluster under load (veil_testing.redis_cluster: 6 real redis-server processes, 3 masters
and 3 replicas): a master killed and its replica promoted, slots moved between masters, the
whole cluster down, and several aggregators on one cluster. Every test counts exactly: the
cluster must hold the counts of exactly the reports the SDK devices saw acknowledged
(reliability_kit.assert_exact), each metric's counters summed over its shards."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import grpc
import pytest
from redis.crc import key_slot
from reliability_kit import Load, RawBatch, assert_exact, flush_all
from veil_testing.waiting import wait_until

from veil.aggregator.store import RedisStore
from veil.aggregator.store._redis import dedupe_key, shard_tags
from veil.wire.v1 import veil_pb2_grpc

CLUSTER_STORE = {"timeout": 1.0}


@pytest.mark.slow  # some 20 s: a failover, then the old master back as a replica
def test_a_master_killed_under_sdk_load_its_replica_takes_over_and_every_acknowledged_batch_counts_once(
    make_redis_cluster, make_aggregator, make_device
):
    """SIGKILL a master (no persistence) while devices report through the SDK: with
    ``wait_replicas = 1`` a batch was acknowledged only once the replica had it, so after the
    cluster promotes the replica nothing acknowledged is lost, and batches whose WAIT or call
    failed are retried by the SDK under the same id, onto the same shard, and counted once."""
    cluster = make_redis_cluster()
    serve = make_aggregator(cluster.url, store={**CLUSTER_STORE, "wait_replicas": 1, "wait_timeout_ms": 500}).start()
    devices = [make_device(serve.endpoint, seed) for seed in range(3)]
    victim = cluster.masters()[0]
    with Load(devices, rate=400):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        time.sleep(1.5)
        victim.kill()
        cluster.wait_ok()  # the replica promoted: every slot served again
        # Its shards' writes wait for a replica of the new master: the old one, back and synced.
        victim.start()
        cluster.wait_ok()
        assert wait_until(lambda: serve.health() == "SERVING", 15)
        time.sleep(1.0)
    flush_all(devices)
    summary = assert_exact(devices, cluster.url)
    assert summary["retried"] > 0, summary
    print(f"\nmaster killed, replica promoted (WAIT 1): {summary}")


@pytest.mark.parametrize("wait_replicas", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_slots_moved_between_masters_under_sdk_load_count_exactly(
    redis_cluster, make_aggregator, make_device, wait_replicas
):
    """Move the slots of every shard of a metric to another master, key by key (MOVED and ASK
    for clients, TRYAGAIN for a script whose keys are split for a moment), while devices
    report: each batch's dedupe key and counters share a slot, so they move together and a
    batch still counts once."""
    serve = make_aggregator(
        redis_cluster.url, store={**CLUSTER_STORE, "wait_replicas": wait_replicas, "wait_timeout_ms": 500}
    ).start()
    devices = [make_device(serve.endpoint, seed) for seed in range(2)]
    assert devices[0].reporter.wait_for_specs(30)
    spec = devices[0].reporter.metrics["browser"]
    store = RedisStore(redis_cluster.url)
    try:
        tags = shard_tags(spec.name, store.shard_count())
        # A real slot holds the ids of 48 h of batches: 300 old ones each, so that moving a slot
        # takes a while (a few keys a step), and uploads meet it half moved.
        pipe = store._redis.pipeline()
        for tag in tags:
            for _ in range(300):
                pipe.set(dedupe_key(spec.name, os.urandom(16), tag), "1", ex=3600)
        pipe.execute()
    finally:
        store.close()
    slots = [key_slot(tag.encode()) for tag in tags]
    moved = 0
    with Load(devices, rate=600):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        time.sleep(1.0)
        for slot in slots:
            masters = redis_cluster.masters()
            owner = redis_cluster.owner(slot)
            moved += redis_cluster.migrate_slot(
                slot, masters[(masters.index(owner) + 1) % len(masters)], keys_per_step=10, pause=0.01
            )
        time.sleep(1.0)
    flush_all(devices)
    summary = assert_exact(devices, redis_cluster.url)
    assert moved >= 300 * len(slots)
    assert summary["retried"] > 0, summary  # uploads met the slots half moved, were refused and came again
    print(f"\n{len(slots)} slots moved ({moved} keys) under load (WAIT {wait_replicas}): {summary}")


@pytest.mark.slow  # some 17 s: six nodes killed and started again (test_store_cluster checks the refusal fast)
def test_the_whole_cluster_down_is_unavailable_and_not_serving_until_it_is_back(
    make_redis_cluster, make_aggregator, make_device
):
    cluster = make_redis_cluster()
    serve = make_aggregator(cluster.url, store=CLUSTER_STORE).start()
    device = make_device(serve.endpoint, 0)
    assert device.reporter.wait_for_specs(30)
    batch = RawBatch(device.reporter.metrics["browser"], 200, seed=3)
    with grpc.insecure_channel(serve.endpoint) as channel:
        stub = veil_pb2_grpc.CollectorStub(channel)
        assert not stub.Upload(batch.request(os.urandom(16)), timeout=10).duplicate
        for node in cluster.nodes:
            node.kill()
        assert wait_until(lambda: serve.health() == "NOT_SERVING", 10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Upload(batch.request(os.urandom(16)), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        for node in cluster.nodes:  # same ports and directories: the cluster's own config
            node.start()
        cluster.wait_ok()
        assert wait_until(lambda: serve.health() == "SERVING", 15)
        again = batch.request(os.urandom(16))
        assert wait_until(lambda: _uploaded(stub, again), 15)


def test_several_aggregators_on_one_cluster_count_exactly_and_agree_on_the_estimates(
    redis_cluster, make_aggregator, make_device
):
    """Two aggregator processes and a `veil serve` with server.processes = 2, devices spread
    over them: exact counts, and every aggregator serves the same estimates once all is sent."""
    serves = [make_aggregator(redis_cluster.url, store=CLUSTER_STORE).start() for _ in range(2)]
    serves.append(make_aggregator(redis_cluster.url, store=CLUSTER_STORE, server={"processes": 2}).start())
    devices = [make_device(serves[seed % 3].endpoint, seed) for seed in range(6)]
    with Load(devices, rate=300):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        time.sleep(3.0)
    flush_all(devices)
    summary = assert_exact(devices, redis_cluster.url)
    seen = [_estimates(serve) for serve in serves]
    assert seen[0]["browser"]["n"] == summary["per_metric"]["browser"]
    assert seen[1] == seen[0] and seen[2] == seen[0]
    print(f"\n3 aggregators (one of 2 processes) on one cluster: {summary}")


def _estimates(serve) -> dict[str, dict]:
    # With server.processes = 2 only worker 0 listens for HTTP: its start line names the port.
    port = next(
        line["http_port"]
        for line in serve.log_lines()
        if line.get("msg") == "aggregator started" and line.get("http_port")
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/estimates?window=total", timeout=10) as r:
        body = json.load(r)
    return {e["metric"]: {"n": e["n"], "categories": e["categories"]} for e in body["estimates"]}


def _uploaded(stub, request) -> bool:
    try:
        stub.Upload(request, timeout=5)
        return True
    except grpc.RpcError:
        return False
