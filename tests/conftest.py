"""Fixtures for every test directory. Keep this file small: directory-specific fixtures go in
that directory's conftest."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from redis_server import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, without persistence, killed after the test."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def make_redis_server() -> Iterator[Callable[..., RedisServer]]:
    """Start RedisServer(**options) (appendonly, appendfsync, replicaof, args); every server
    made is killed and its directory removed after the test, whatever its outcome."""
    made: list[RedisServer] = []

    def make(**options: object) -> RedisServer:
        server = RedisServer(**options)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.cleanup()
