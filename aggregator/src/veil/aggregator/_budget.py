"""The in-flight upload bytes budget: how many bytes of uploads may be read at once, and by whom.

gRPC reads an upload's whole message before its handler sees it, so the memory uploads take
is bounded by how many are read at once. Each upload reserves the largest valid upload's size
(max_message_bytes) before its message (or HTTP body) is read, keeps its own size once read,
and gives that back when its handler returns; when the budget is spent, an upload waits (up to
its deadline, at most a few seconds) and is then refused with RESOURCE_EXHAUSTED (HTTP 429;
the SDKs retry). Refused calls (no token, rate limits) reserve nothing: they are answered
before their message is read.

The share rule: no one holder (a token, by name) may hold more than `share` bytes at once
(token_share: a quarter of the budget, and no more than a quarter of the gRPC worker threads'
worth of largest uploads, at least one upload). A holder at its share is
refused at once rather than made to wait: what it holds is its own calls, and a waiting call
would hold a worker thread. Calls that name no holder (authentication off: callers cannot be
told apart) share the whole budget, as do streams (bounded by their own limits, on threads of
their own); the read deadline (_calls.ReadDeadlines) bounds how long any of them holds it. A
token's reads that overlap beyond its share, as a burst of its devices' uploads may, are
refused too: the SDKs retry after the hint.

A call holds its bytes through a Reservation; a read that finds none free within BUDGET_WAIT
(over gRPC; at once over HTTP, where a waiting body would hold its connection) is refused with
BUDGET_REFUSAL and a retry hint of BUDGET_RETRY_MS.
"""

from __future__ import annotations

import threading

__all__ = ["BUDGET_REFUSAL", "BUDGET_RETRY_MS", "BUDGET_WAIT", "ByteBudget", "Reservation", "token_share"]

SHARE = 4  # a token holds at most 1/SHARE of the budget, and of the worker threads' reads
# An upload waits this long at most for the in-flight bytes budget, then is refused with this
# message and hint (the HTTP listener's too); one over its token's share is refused at once.
BUDGET_WAIT = 5.0
BUDGET_RETRY_MS = 1000
BUDGET_REFUSAL = (
    "The aggregator is reading as much as its memory allows (server.max_inflight_bytes, of which "
    "one token may hold a quarter); retry (an upload with the same batch id). Nothing was counted."
)


def token_share(total: int, largest: int, workers: int) -> int:
    """The bytes one token may hold of a budget of `total` where each read reserves `largest`:
    a quarter of the budget, and no more than a quarter of the `workers` gRPC threads' worth
    of reads (a call waiting for its message holds a thread), but always one read."""
    return max(largest, min(total // SHARE, largest * max(1, workers // SHARE)))


class ByteBudget:
    """reserve(n, timeout, holder) -> True once n bytes are reserved (release(n, holder) gives
    them back), False when they could not be: over the holder's share (at once), or not free
    within the timeout."""

    def __init__(self, total: int, share: int | None = None) -> None:
        if total <= 0:
            raise ValueError(f"A byte budget needs a positive size, not {total}.")
        self.total = total
        self.share = total if share is None else min(total, share)
        self._free = total
        self._held: dict[str, int] = {}  # by holder, those holding anything
        self._changed = threading.Condition()

    @property
    def free(self) -> int:
        return self._free

    def held(self, holder: str) -> int:
        return self._held.get(holder, 0)

    def reserve(self, n: int, timeout: float, holder: str | None = None) -> bool:
        if n > self.total:
            return False
        with self._changed:
            if holder is not None and self._held.get(holder, 0) + n > self.share:
                return False

            def fits() -> bool:  # the share again: the holder's other calls may take it meanwhile
                return self._free >= n and (holder is None or self._held.get(holder, 0) + n <= self.share)

            if not self._changed.wait_for(fits, timeout=max(0.0, timeout)):
                return False
            self._free -= n
            if holder is not None:
                self._held[holder] = self._held.get(holder, 0) + n
            return True

    def release(self, n: int, holder: str | None = None) -> None:
        if n == 0:
            return
        with self._changed:
            self._free += n
            if holder is not None:
                left = self._held[holder] - n
                if left:
                    self._held[holder] = left
                else:
                    del self._held[holder]
            self._changed.notify_all()


class Reservation:
    """A call's bytes of the in-flight budget, as its holder: take() the largest message's size
    before a read, keep() the message's own size once it is read, close() when the call is
    answered."""

    def __init__(self, budget: ByteBudget, largest: int, holder: str | None) -> None:
        self._budget, self._largest, self._holder = budget, largest, holder
        self._held = 0

    def take(self, timeout: float) -> bool:
        """The largest message's size (after letting go of what was held), or False: none free
        within the timeout, or the holder at its share (at once)."""
        self.close()
        if not self._budget.reserve(self._largest, timeout, self._holder):
            return False
        self._held = self._largest
        return True

    def keep(self, size: int) -> None:
        self._release(self._held - min(size, self._held))

    def _release(self, n: int) -> None:
        self._held -= n
        self._budget.release(n, self._holder)

    def close(self) -> None:
        self._release(self._held)
