"""Fixtures of the SDK's tests: the loopback collector (see loopback_collector) and Reporters
with fast timings that are shut down after each test.

The collector speaks gRPC; a test module that overrides the ``transport`` fixture (e.g. with
params ["grpc", "http"]) runs its tests over each transport it names."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from loopback_collector import FAST, CollectorServer, CollectorState, HttpCollectorServer

from veil.client import Reporter


@pytest.fixture
def state() -> CollectorState:
    return CollectorState()


@pytest.fixture
def transport() -> str:
    return "grpc"


@pytest.fixture
def collector(state: CollectorState, transport: str) -> Iterator[CollectorServer | HttpCollectorServer]:
    server = HttpCollectorServer(state) if transport == "http" else CollectorServer(state)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_reporter(collector: CollectorServer | HttpCollectorServer) -> Iterator[Callable[..., Reporter]]:
    """Reporter(**FAST, **overrides) against the test collector, shut down after the test."""
    made: list[Reporter] = []

    def make(endpoint: str | None = None, **overrides: object) -> Reporter:
        reporter = Reporter(endpoint or collector.endpoint, **{**FAST, **overrides})
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.shutdown(timeout=2)


@pytest.fixture
def ready_reporter(make_reporter: Callable[..., Reporter]) -> Callable[..., Reporter]:
    """make_reporter that also waits until the specs are known."""

    def make(**overrides: object) -> Reporter:
        reporter = make_reporter(**overrides)
        assert reporter.wait_for_specs(10)
        return reporter

    return make
