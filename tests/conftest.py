"""Fixtures for every test directory. Keep this file small: directory-specific fixtures go in
that directory's conftest."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from veil_testing.processes import making
from veil_testing.redis_cluster import RedisClusterServers
from veil_testing.redis_server import RedisServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked starts_first run first: pytest-xdist hands out files in this order, and a
    file of minutes handed out last would run on alone after the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("starts_first") is None)


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


@pytest.fixture(scope="session")
def _shared_redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def shared_redis_server(_shared_redis_server: RedisServer) -> RedisServer:
    """One redis-server for the whole run (of this worker), emptied (FLUSHALL) for this test: for
    tests that only write and read keys; a test that stops, stalls or reconfigures its server
    takes redis_server."""
    assert _shared_redis_server.command("FLUSHALL") == b"+OK\r\n"
    return _shared_redis_server


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


_TALLY = pytest.StashKey[Counter]()


@pytest.fixture
def tally(request) -> Counter:
    """Counts kept for the terminal summary (the fuzzers' inputs tried): tally["name"] += n."""
    return request.config.stash.setdefault(_TALLY, Counter())


def pytest_sessionfinish(session) -> None:
    """A pytest-xdist worker hands its tally to the controller, which prints the summary."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["tally"] = dict(session.config.stash.get(_TALLY, {}))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    node.config.stash.setdefault(_TALLY, Counter()).update(getattr(node, "workeroutput", {}).get("tally", {}))


def pytest_terminal_summary(terminalreporter, config) -> None:
    counts = config.stash.get(_TALLY, None)
    if counts:
        terminalreporter.section("fuzzers: inputs tried")
        for name, value in sorted(counts.items()):
            terminalreporter.write_line(f"{name}: {value}")
