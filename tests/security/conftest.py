"""Fixtures of the security tests: an in-process aggregator on a frozen clock (the tally of the
inputs the fuzzers tried is tests/conftest.py's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from veil_testing.running import InProcessAggregators

from veil.aggregator.daemon import Aggregator


@pytest.fixture
def start_frozen_aggregator() -> Iterator[Callable[..., Aggregator]]:
    """start_frozen_aggregator(**server) -> a started in-process Aggregator on the memory store
    whose clock stands still, so that a window's current bucket ("1h") cannot roll over between
    two reads of the counters (the store's own expiry clock is far from any bucket's end)."""
    aggregators = InProcessAggregators()
    now = time.time()

    def start(**server: object) -> Aggregator:
        aggregator = aggregators.start("memory", clock=lambda: now, **server)
        aggregator.frozen_now = now  # what the bucket of a window is, for reading the store
        return aggregator

    yield start
    aggregators.stop_all()
