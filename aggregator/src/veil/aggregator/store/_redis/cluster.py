"""A Redis Cluster for RedisStore: the client from a ``redis+cluster://`` URL's seeds, and a
sharded bucket's version and counts from its shards'.

``redis+cluster://host:port,host:port`` (``rediss+cluster://`` for TLS, with
``?ssl_ca_certs=/path/to/ca.crt`` for a private CA): the hosts are where to start, the client
finds the rest. Each metric's counters are split over S shards (keys.shard_tags), so that a
hot metric is not bound by one core of one node; a batch goes to the shard crc32(batch id) mod
S, all of it (dedupe key and counter hashes, one slot, one atomic script): a retry lands on the
same shard, so exactly once holds as on one Redis. Reads sum the shards, with one pipeline per
node (sent to all nodes at once); a bucket's version is then the tuple of its shards' versions.
S is ``shards`` (default: one per master), recorded in the cluster (keys.SHARDS_KEY) by the
first aggregator to use it: later ones use the recorded number, and one configured with
another raises StoreError (its ping too, so health says NOT_SERVING), as a batch id's shard,
and so exactly once, depends on it. A write call (one per master) sums its batches' counts per
metric and shard, so more shards mean smaller groups and more Redis CPU per batch
(bench_capacity.py measures it); more shards than masters only leave room to spread over
masters added later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from ...counts import Counts
from .._base import Version
from .resp import Packer

__all__ = ["cluster_client", "cluster_seeds", "joined_version", "shard_version", "summed_shards"]


def shard_version(shards: int, shard: int, version: int) -> tuple[int | None, ...]:
    """A sharded bucket's version as one write sees it: its shard's, None at the others."""
    return tuple(version if s == shard else None for s in range(shards))


def joined_version(versions: list[int]) -> Version:
    """A bucket's version from its shards': the one shard's number, or the tuple of them; 0
    (no version) while no shard has one."""
    return versions[0] if len(versions) == 1 or not any(versions) else tuple(versions)


def summed_shards(shards: Sequence[tuple[int, Counts]]) -> tuple[Version, Counts]:
    """A bucket's (version, counts) from its shards' (version, counts)."""
    return joined_version([version for version, _ in shards]), Counts.summed([c for _, c in shards])


def cluster_seeds(url: str) -> dict[str, Any]:
    """RedisCluster's startup nodes, credentials and TLS from a
    ``redis+cluster://[user:password@]host:port,host:port`` URL (``rediss+cluster://`` for TLS,
    verifying the nodes against the system's roots or ``?ssl_ca_certs=/path/to/ca.crt``);
    ValueError when it is not one."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    tls = parts.scheme == "rediss+cluster"
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.path not in ("", "/", "/0") or parts.fragment or set(query) - ({"ssl_ca_certs"} if tls else set()):
        raise ValueError(
            "a cluster URL names hosts only (a cluster has one database, 0), and rediss+cluster:// "
            "may add ?ssl_ca_certs=/path/to/ca.crt."
        )
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"expected host:port, got {host!r}.")
        nodes.append(ClusterNode(name.strip("[]"), int(port)))
    seeds: dict[str, object] = {
        "startup_nodes": nodes,
        "username": unquote(username) or None,
        "password": unquote(password) or None,
        "ssl": tls,
    }
    if "ssl_ca_certs" in query:
        seeds["ssl_ca_certs"] = query["ssl_ca_certs"][-1]
    return seeds


def cluster_client(seeds: dict[str, Any], packer: Packer | None, options: dict[str, Any]) -> RedisCluster:
    if packer is not None:
        # The cluster client makes each node's client itself, taking no packer; every new
        # connection gets it here, before its first command.
        def use_packer(connection: redis.Connection) -> None:
            connection._command_packer = packer

        options = {**options, "redis_connect_func": use_packer}
    return RedisCluster(**seeds, **options)
