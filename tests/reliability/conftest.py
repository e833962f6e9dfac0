"""Fixtures of the reliability tests: aggregator processes, SDK devices and Redis proxies (see
reliability_kit), all stopped after the test whatever its outcome. Redis servers come from
tests/conftest.py (make_redis_server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reliability_kit import AggregatorProcess, Device, ReplyDelayProxy


@pytest.fixture
def make_aggregator(tmp_path: Path) -> Iterator[Callable[..., AggregatorProcess]]:
    """make_aggregator(store_url, **options) -> an AggregatorProcess (not started), killed after the test."""
    made: list[AggregatorProcess] = []

    def make(store_url: str, **options: object) -> AggregatorProcess:
        made.append(AggregatorProcess(tmp_path / f"aggregator-{len(made)}", store_url, **options))
        return made[-1]

    yield make
    for process in made:
        process.close()


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
