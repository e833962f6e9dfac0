"""Fixtures for every test directory. Keep this file small: directory-specific fixtures go in
that directory's conftest."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from veil_testing.processes import making
from veil_testing.redis_cluster import RedisClusterServers
from veil_testing.redis_server import RedisServer


@pytest.fixture(autouse=True, scope="session")
def _data_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The default SQLite store of any config without a store URL goes to a directory of this
    session, never the user's data directory (VEIL_DATA_DIR; `veil serve` processes inherit it)."""
    os.environ["VEIL_DATA_DIR"] = str(tmp_path_factory.mktemp("veil-data"))


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, without persistence, killed after the test."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def make_redis_server() -> Iterator[Callable[..., RedisServer]]:
    """Start RedisServer(**options) (appendonly, appendfsync, replicaof, args); every server
    made is killed and its directory removed after the test, whatever its outcome."""
    yield from making(RedisServer)


@pytest.fixture(scope="session")
def shared_redis_cluster() -> Iterator[RedisClusterServers]:
    """One real Redis Cluster (3 masters, 3 replicas) for the whole run: start it once (a few
    seconds); tests that kill or move its nodes make their own with make_redis_cluster."""
    with RedisClusterServers() as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(shared_redis_cluster: RedisClusterServers) -> RedisClusterServers:
    """The shared cluster, emptied (FLUSHALL on every master) for this test."""
    shared_redis_cluster.wait_ok()
    shared_redis_cluster.flush()
    return shared_redis_cluster


@pytest.fixture
def make_redis_cluster() -> Iterator[Callable[..., RedisClusterServers]]:
    """Start a fresh RedisClusterServers(**options), all of its nodes killed after the test."""
    yield from making(RedisClusterServers)
