"""Fixtures that run aggregators (see running.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from running import ServeProcess, config_dict

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator


@pytest.fixture
def start_aggregator() -> Iterator[Callable[..., Aggregator]]:
    """start_aggregator(store_url="memory", **server) -> a started in-process Aggregator."""
    started: list[Aggregator] = []

    def start(store_url: str = "memory", **server: object) -> Aggregator:
        aggregator = Aggregator(parse_config(config_dict(store_url, **server)))
        aggregator.start()
        started.append(aggregator)
        return aggregator

    yield start
    for aggregator in started:
        aggregator.stop(grace=0)


@pytest.fixture
def serve_process(tmp_path) -> Iterator[Callable[[str], ServeProcess]]:
    made: list[ServeProcess] = []

    def make(store_url: str) -> ServeProcess:
        made.append(ServeProcess(tmp_path, store_url))
        return made[-1]

    yield make
    for process in made:
        process.stop()
