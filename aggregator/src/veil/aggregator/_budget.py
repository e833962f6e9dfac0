"""The in-flight upload bytes budget: how many bytes of uploads may be read at once.

gRPC reads an upload's whole message before its handler sees it, so the memory uploads take
is bounded by how many are read at once. Each upload reserves the largest valid upload's size
(max_message_bytes) before its message is read, keeps its own size once read, and gives that
back when its handler returns;
when the budget is spent, an upload waits (up to its deadline, at most a few seconds) and is
then refused with RESOURCE_EXHAUSTED (the SDK retries). Refused calls (no token, rate limits)
reserve nothing: they are answered before their message is read.
"""

from __future__ import annotations

import threading

__all__ = ["ByteBudget"]


class ByteBudget:
    """reserve(n, timeout) -> True once n bytes are reserved (release(n) gives them back),
    False when they could not be within the timeout."""

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"A byte budget needs a positive size, not {total}.")
        self.total = total
        self._free = total
        self._changed = threading.Condition()

    @property
    def free(self) -> int:
        return self._free

    def reserve(self, n: int, timeout: float) -> bool:
        if n > self.total:
            return False
        with self._changed:
            if not self._changed.wait_for(lambda: self._free >= n, timeout=max(0.0, timeout)):
                return False
            self._free -= n
            return True

    def release(self, n: int) -> None:
        with self._changed:
            self._free += n
            self._changed.notify_all()
