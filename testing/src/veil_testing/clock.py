"""A simulated clock, apart from the helpers that run aggregators: the SDK's tests use it where
only the SDK is installed (make test-oldest)."""

from __future__ import annotations

__all__ = ["SimulatedTime"]


class SimulatedTime:
    """The time of a simulated world (Unix seconds, settable): the clock of in-process
    aggregators (Aggregator(clock=)) and of their simulated devices, time passing for both
    (Reporter(clock=, elapsed_clock=))."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
