"""The RESP fast path (store/_redis/resp.py) splices pre-encoded counts into redis-py's private
serializers: pinned here to the redis-py versions it supports and to the private API it relies
on, and off, with the reason logged, on any other redis-py, whose store still counts."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import redis
from redis.connection import Connection, HiredisRespSerializer, PythonRespSerializer
from store_cases import batch, key, random_counts

from veil.aggregator.store import RedisStore
from veil.aggregator.store._redis.resp import SUPPORTED_REDIS_PY, Packer, command_packer, private_api_problem


def test_the_installed_redis_py_is_one_the_fast_path_supports():
    installed = tuple(int(part) for part in redis.__version__.split(".")[:2])
    low, high = SUPPORTED_REDIS_PY
    assert low <= installed < high, f"redis-py {redis.__version__}: check resp.py's private API, then the range"
    assert private_api_problem() is None
    assert isinstance(command_packer(), Packer)


def test_the_private_api_it_relies_on_has_the_shape_it_expects():
    """What Packer and RedisStore use of redis-py's private API, as it is in this redis-py."""
    from redis._parsers import Encoder

    encode = Encoder("utf-8", "strict", False).encode
    assert PythonRespSerializer(6000, encode).pack("SET", "k", 1) == [b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"]
    assert b"".join(HiredisRespSerializer().pack("SET", "k", 1)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"
    packer = command_packer()
    assert Connection(command_packer=packer)._command_packer is packer  # how redis.Redis hands it on
    connection = Connection()
    connection._command_packer = packer  # how the cluster client's connections get it (cluster_client)
    assert connection.pack_command("PING") == [b"*1\r\n$4\r\nPING\r\n"]


def test_a_store_on_one_redis_sends_through_the_packer(redis_server):
    store = RedisStore(redis_server.url, coalesce=1)
    try:
        connection = store._redis.connection_pool.get_connection()
        try:
            assert isinstance(connection._command_packer, Packer)
        finally:
            store._redis.connection_pool.release(connection)
    finally:
        store.close()


@pytest.mark.parametrize("version", ["4.6.0", "9.0.0", "main"])
def test_a_redis_py_outside_the_supported_versions_is_refused_with_its_reason(version):
    problem = private_api_problem(version)
    assert problem is not None and problem.startswith(f"redis-py {version}: ")


def test_a_redis_py_without_the_serializers_is_refused_with_its_reason(monkeypatch):
    monkeypatch.delattr(redis.connection, "HiredisRespSerializer")
    assert "HiredisRespSerializer" in (private_api_problem() or "")


def test_on_another_redis_py_the_fast_path_is_off_said_once_and_the_store_still_counts(
    monkeypatch, redis_server, caplog
):
    monkeypatch.setattr(redis, "__version__", "99.0.0")
    with caplog.at_level(logging.WARNING, logger="veil.aggregator.store"):
        assert command_packer() is None
        store = RedisStore(redis_server.url, coalesce=1)
    try:
        said = [r for r in caplog.records if "RESP fast path is off" in r.getMessage()]
        assert len(said) == 1 and "redis-py 99.0.0" in said[0].why
        assert not store._packed
        counts = random_counts((3,), 8, np.random.default_rng(7))
        assert store.add(batch(counts, key("resp-off")))
        assert store.read(key("resp-off"), (3,), 8) == counts
    finally:
        store.close()
