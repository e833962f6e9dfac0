"""The time the privacy ledger and the reports use: the device's clock, bounded by the
aggregator's.

A device's clock can be set anywhere (a user, a dual boot, an RTC reset). Set far ahead, it would
open future reporting periods, each with a fresh allowance. Every specs answer of a revision-2
aggregator carries its clock (``server_time_unix``; ``SpecCache.server_now()`` moves it on by the
time since the answer, sleep included): the device's time is at most that plus ``ALLOWANCE``, for the
aggregator's own error and the answer's time in flight. A clock behind is left as it is (the
ledger's high-water mark keeps it from reopening a period). Before any answer of this process
said the time (a revision-1 aggregator, or specs from the queue directory before the network
answers), the device's clock is used as it is: the elapsed-time clock does not survive a restart.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ALLOWANCE", "bounded_clock"]

ALLOWANCE = 300.0  # seconds a device's time may run ahead of the aggregator's


def bounded_clock(wall: Callable[[], float], server_now: Callable[[], float | None]) -> Callable[[], float]:
    """A clock (Unix seconds) reading ``wall``, but at most ``server_now()`` + ALLOWANCE when the
    aggregator's time is known (``server_now()`` not None)."""

    def now() -> float:
        device, server = wall(), server_now()
        return device if server is None else min(device, server + ALLOWANCE)

    return now
