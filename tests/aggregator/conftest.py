"""Fixtures that run aggregators (see running.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from running import Pki, ServeProcess, config_dict

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator


@pytest.fixture
def start_aggregator() -> Iterator[Callable[..., Aggregator]]:
    """start_aggregator(store_url="memory", *, sections=None, **server) -> a started in-process
    Aggregator; sections adds tables to the config (e.g. {"tls": ..., "auth": ...})."""
    started: list[Aggregator] = []

    def start(store_url: str = "memory", *, sections: dict | None = None, **server: object) -> Aggregator:
        aggregator = Aggregator(parse_config({**config_dict(store_url, **server), **(sections or {})}))
        aggregator.start()
        started.append(aggregator)
        return aggregator

    yield start
    for aggregator in started:
        aggregator.stop(grace=0)


@pytest.fixture
def serve_process(tmp_path) -> Iterator[Callable[[str], ServeProcess]]:
    made: list[ServeProcess] = []

    def make(store_url: str, **options: object) -> ServeProcess:
        made.append(ServeProcess(tmp_path, store_url, **options))
        return made[-1]

    yield make
    for process in made:
        process.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an
    unrelated CA with a client certificate of its own; made for this run, never committed."""
    return Pki(tmp_path_factory.mktemp("pki"))
