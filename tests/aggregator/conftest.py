"""Fixtures that run aggregators (see running.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from chromium import BrowserError, ensure_chromium
from running import InProcessAggregators, Pki, ServeProcess

from veil.aggregator.daemon import Aggregator


@pytest.fixture
def start_aggregator() -> Iterator[Callable[..., Aggregator]]:
    """start_aggregator(store_url="memory", *, sections=None, clock=None, **server) -> a started
    in-process Aggregator (InProcessAggregators.start), stopped after the test."""
    aggregators = InProcessAggregators()
    yield aggregators.start
    aggregators.stop_all()


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


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    try:
        return ensure_chromium()
    except BrowserError as err:
        pytest.fail(str(err))
