"""Waiting for a condition that other threads or processes bring about."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll predicate every `interval` seconds until it is true (True) or `timeout` seconds have
    passed (its last answer), so a test asserts on the outcome instead of sleeping."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
