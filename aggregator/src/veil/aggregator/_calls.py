"""ReadDeadlines bounds how long an admitted gRPC call may take to deliver its message: grpcio
waits for a request message as long as the client's own deadline (forever without one), and a
call waiting for its message holds a worker thread and its reservation of the in-flight budget.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ReadDeadline", "ReadDeadlines"]

log = logging.getLogger("veil.aggregator")

# Deadlines are checked this often at most: they fire up to this late, and a steady stream of
# calls wakes the checking thread no more than this often.
_GRANULARITY = 0.25
# and at least this often while any is armed, dropping those disarmed (a second of calls' worth).
_SWEEP = 1.0


class ReadDeadline:
    """One armed deadline: `expire` runs once it passes, unless disarm() came first."""

    __slots__ = ("at", "expire", "fired")

    def __init__(self, at: float, expire: Callable[[], None]) -> None:
        self.at = at
        self.expire: Callable[[], None] | None = expire
        self.fired = False

    def disarm(self) -> None:
        # Let go of `expire` at once: it holds the call (a gRPC call's context, its buffers),
        # and the queue may hold this deadline until it would have passed.
        self.expire = None


class ReadDeadlines:
    """Deadlines of one length (`seconds`), watched by one thread for all calls. Every deadline
    has the same length, so they expire in the order they were armed: a queue, not a heap."""

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"A read deadline needs a positive length, not {seconds}.")
        self.seconds = seconds
        self._armed: collections.deque[ReadDeadline] = collections.deque()
        self._changed = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None  # started by the first deadline

    def arm(self, expire: Callable[[], None]) -> ReadDeadline:
        deadline = ReadDeadline(time.monotonic() + self.seconds, expire)
        with self._changed:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._watch, name="veil-read-deadlines", daemon=True)
                self._thread.start()
            self._armed.append(deadline)
            if len(self._armed) == 1:
                self._changed.notify()
        return deadline

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while True:
            expired = []
            with self._changed:
                if self._closed:
                    return
                now = time.monotonic()
                while self._armed and (self._armed[0].expire is None or self._armed[0].at <= now):
                    deadline = self._armed.popleft()
                    if deadline.expire is not None:
                        expired.append(deadline)
                if not expired:
                    wait = min(max(self._armed[0].at - now, _GRANULARITY), _SWEEP) if self._armed else None
                    self._changed.wait(wait)
            for deadline in expired:
                expire, deadline.expire = deadline.expire, None
                if expire is not None:  # not disarmed meanwhile
                    deadline.fired = True
                    try:
                        expire()
                    except Exception:  # one call's failure must not end the deadlines of all
                        log.exception("a read deadline could not cancel its call")
