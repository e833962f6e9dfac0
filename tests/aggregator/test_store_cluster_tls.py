"""rediss+cluster://: a real Redis Cluster (veil_testing.redis_cluster, 3 masters and 3 replicas)
whose nodes take clients over TLS and speak TLS among themselves (tls-cluster, tls-replication),
with certificates made for the run (veil_testing.pki). The aggregator reaches every master over TLS,
trusting the CA named in the URL, and counts exactly once; a node it cannot verify is unavailable."""

from __future__ import annotations

import random

import grpc
import pytest
from redis.crc import key_slot
from veil_testing.redis_cluster import RedisClusterServers, TlsFiles
from veil_testing.running import counted, make_upload

from veil.aggregator.errors import StoreUnavailable
from veil.aggregator.store import RedisStore, open_store
from veil.aggregator.store._redis import shard_of, shard_tags
from veil.wire.v1 import veil_pb2_grpc

FAST = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}


@pytest.fixture(scope="module")
def tls_cluster(pki):
    with RedisClusterServers(
        tls=TlsFiles(pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)
    ) as cluster:
        yield cluster


def test_an_aggregator_on_a_tls_cluster_counts_every_batch_once_on_every_master(tls_cluster, start_aggregator):
    tls_cluster.flush()
    url = tls_cluster.tls_url
    assert url.startswith("rediss+cluster://") and "ssl_ca_certs=" in url
    aggregator = start_aggregator(url)
    rng = random.Random(17)
    batch_ids = [rng.randbytes(16) for _ in range(30)]
    with grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}") as channel:
        upload = veil_pb2_grpc.CollectorStub(channel).Upload
        for attempt in range(2):  # every batch sent again, as a retry: counted once
            for i, batch_id in enumerate(batch_ids):
                reply = upload(make_upload("browser", 10, batch_id=batch_id, seed=i), timeout=10)
                assert (reply.accepted, reply.duplicate) == (10, attempt == 1)
    assert counted(aggregator, "browser") == 300
    # The batches' shards cover every shard, one per master: each master was written over TLS.
    shards = aggregator.store.shard_count()
    assert shards == len(tls_cluster.masters()) == 3
    assert {shard_of(b, shards) for b in batch_ids} == set(range(shards))
    owners = {tls_cluster.owner(key_slot(tag.encode())).port for tag in shard_tags("browser", shards)}
    assert owners == {m.port for m in tls_cluster.masters()}
    for master in tls_cluster.masters():
        assert int(tls_cluster.call(master, "DBSIZE")) > 0


def test_a_tls_cluster_the_client_cannot_verify_or_reaches_in_plaintext_is_unavailable(tls_cluster, pki):
    hosts = ",".join(f"127.0.0.1:{port}" for port in tls_cluster.tls_ports)
    for url in (
        f"rediss+cluster://{hosts}?ssl_ca_certs={pki.other_ca}",  # a CA that did not issue the nodes'
        f"rediss+cluster://{hosts}",  # the system's roots
        f"redis+cluster://{hosts}",
    ):  # plaintext to TLS ports
        store = RedisStore(url, **FAST, retries=0)
        try:
            with pytest.raises(StoreUnavailable):
                store.ping()
        finally:
            store.close()


def test_a_cluster_url_takes_a_ca_file_with_tls_only():
    with pytest.raises(ValueError, match="ssl_ca_certs"):
        open_store("redis+cluster://127.0.0.1:7000?ssl_ca_certs=/etc/ca.crt")
    with pytest.raises(ValueError, match="ssl_ca_certs"):
        open_store("rediss+cluster://127.0.0.1:7000?ssl_keyfile=/etc/key.pem")
    open_store("rediss+cluster://127.0.0.1:7000?ssl_ca_certs=/etc/ca.crt").close()  # nothing asked until used
