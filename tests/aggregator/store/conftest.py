"""The store under test: MemoryStore, RedisStore on a redis-server and on a real Redis Cluster
(its counters split over shards), each server shared by the run and emptied for the test, and
SqliteStore on a fresh file."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from store_cases import PATIENT

from veil.aggregator.store import MemoryStore, RedisStore, SqliteStore, Store


@pytest.fixture(params=["memory", "redis", "cluster", "sqlite"])
def make_handle(request: pytest.FixtureRequest) -> Iterator[Callable[[], Store]]:
    """Opens a handle on one store: the same MemoryStore or SqliteStore every time (a SQLite file
    has one process writing it; its threads share the store), or a new RedisStore (its own
    connections) on the test's (emptied) server. Every handle is closed after the test."""
    handles: list[Store] = []
    if request.param in ("memory", "sqlite"):
        tmp_path = request.getfixturevalue("tmp_path")
        one = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "veil.db")
        handles.append(one)

        def make() -> Store:
            return one
    else:
        server = request.getfixturevalue("shared_redis_server" if request.param == "redis" else "redis_cluster")
        url = server.url

        def make() -> Store:
            handles.append(RedisStore(url, **PATIENT))
            return handles[-1]

    yield make
    for handle in handles:
        handle.close()


@pytest.fixture
def store(make_handle: Callable[[], Store]) -> Store:
    return make_handle()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240604)
