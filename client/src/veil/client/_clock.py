"""The time the privacy ledger and the reports use: the device's clock, bounded by the
aggregator's.

A device's clock can be set anywhere (a user, a dual boot, an RTC reset). Set far ahead, it would
open future reporting periods, each with a fresh allowance. Every specs answer of a revision-2
aggregator carries its clock (``server_time_unix``); from then on the device's time is at most
that clock plus the monotonic time elapsed since the answer, plus ``ALLOWANCE`` for the
aggregator's own error and the answer's time in flight. A clock behind is left as it is (the
ledger's high-water mark keeps it from reopening a period). Before any answer of this process
said the time (a revision-1 aggregator, or specs from the queue directory before the network
answers), the device's clock is used as it is: the monotonic clock does not survive a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ALLOWANCE", "BoundedClock"]

ALLOWANCE = 300.0  # seconds a device's time may run ahead of the aggregator's last word


def _since_boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# The time elapsed since an answer, counting time suspended where the platform can (Linux and
# Android): time.monotonic stops while a device sleeps, which would hold a device that slept
# overnight in the day before until the next specs answer.
_ELAPSED = _since_boot if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


class BoundedClock:
    """``now()``: the device's clock (``wall``, Unix seconds), at most the aggregator's last
    observed time plus the ``monotonic`` time since, plus ALLOWANCE."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = _ELAPSED) -> None:
        self._wall = wall
        self._monotonic = monotonic
        # (the aggregator's Unix time, the monotonic time it arrived): replaced whole, read without a lock
        self._said: tuple[float, float] | None = None

    def observe(self, server_time_unix: int) -> None:
        """Record the aggregator's clock from a specs answer (0: a revision-1 aggregator did not
        say it, and the last time said still holds)."""
        if server_time_unix > 0:
            self._said = (float(server_time_unix), self._monotonic())

    def now(self) -> float:
        wall = self._wall()
        said = self._said
        if said is None:
            return wall
        return min(wall, said[0] + (self._monotonic() - said[1]) + ALLOWANCE)
