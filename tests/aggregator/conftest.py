"""Fixtures that run aggregators (see veil_testing.running)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from veil_testing.chromium import BrowserError, ensure_chromium
from veil_testing.pki import Pki
from veil_testing.processes import ServeProcess, making
from veil_testing.running import InProcessAggregators, serve_config

from veil.aggregator.daemon import Aggregator


@pytest.fixture
def start_aggregator() -> Iterator[Callable[..., Aggregator]]:
    """start_aggregator(store_url="memory", *, sections=None, clock=None, **server) -> a started
    in-process Aggregator (InProcessAggregators.start), stopped after the test."""
    aggregators = InProcessAggregators()
    yield aggregators.start
    aggregators.stop_all()


@pytest.fixture
def serve_process(tmp_path) -> Iterator[Callable[..., ServeProcess]]:
    """serve_process(store_url, *, sections=None, server=None) -> a `veil serve` process (not
    started) of running.serve_config in tmp_path, killed after the test."""

    def make(store_url: str, *, sections: dict | None = None, server: dict | None = None) -> ServeProcess:
        return ServeProcess(tmp_path, serve_config(store_url, sections=sections, **(server or {})))

    yield from making(make, start=False)


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
