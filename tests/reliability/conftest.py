"""Fixtures of the reliability tests: aggregator processes, SDK devices and Redis proxies (see
reliability_kit and veil_testing.processes), all stopped after the test whatever its outcome.
Redis servers come from tests/conftest.py (make_redis_server)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reliability_kit import Device, ReplyDelayProxy, aggregator_config
from veil_testing.processes import ServeProcess, making


@pytest.fixture
def make_aggregator(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """make_aggregator(store_url, *, log_level="info", server=None, store=None, auth=None) -> a
    `veil serve` process of reliability_kit.aggregator_config (not started), killed after the test."""
    directories = (tmp_path / f"aggregator-{i}" for i in itertools.count())

    def make(store_url: str, *, log_level: str = "info", **options: dict) -> ServeProcess:
        return ServeProcess(next(directories), aggregator_config(store_url, **options), log_level=log_level)

    yield from making(make, start=False)


@pytest.fixture
def make_device() -> Iterator[Callable[..., Device]]:
    """make_device(endpoint, seed, **options) -> a Device, its Reporter shut down after the test."""
    made: list[Device] = []

    def make(endpoint: str, seed: int, **options: object) -> Device:
        made.append(Device(endpoint, seed, **options))
        return made[-1]

    yield make
    for device in made:
        device.reporter.shutdown(0.5)


@pytest.fixture
def make_proxy() -> Iterator[Callable[[int, float], ReplyDelayProxy]]:
    """make_proxy(redis_port, delay) -> a ReplyDelayProxy, closed after the test."""
    made: list[ReplyDelayProxy] = []

    def make(port: int, delay: float) -> ReplyDelayProxy:
        made.append(ReplyDelayProxy(port, delay))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()
