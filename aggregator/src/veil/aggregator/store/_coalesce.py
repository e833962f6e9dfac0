"""Group commit for store writes: concurrent batches bound for the same place go out together.

Callers (gRPC handler threads) submit their batch and block until it is written. The first
caller to find its group idle becomes the group's leader: it takes every batch queued for the
group so far (itself first, at most ``max_batches``) and writes them in one call of ``flush``,
while batches arriving meanwhile queue up behind. When the leader is done it hands the
leadership to the oldest queued caller, which writes the next group. So there is no timer and
no thread of its own: an idle store writes a lone batch at once, and a busy one writes as many
batches per call as arrived during the previous call. Memory is bounded by the callers: each
queued entry is a caller blocked in ``submit``.

``flush(writes)`` returns one result per write, in order, or raises; when it raises, every
caller in that group gets the exception (the store cannot tell which were applied; each
caller retries its own batch with the same id, and the store counts an id at most once).

``submit_many`` queues several batches as one entry, which goes out whole in one group (with
what else is queued, up to ``max_batches`` in all, though an entry larger than that goes alone):
a caller holding a set of calls waits once for all of them.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from ._base import FlushObserver

__all__ = ["Coalescer"]

W = TypeVar("W")
R = TypeVar("R")


class _Entry(Generic[W, R]):
    __slots__ = ("writes", "results", "error", "lead", "ready")

    def __init__(self, writes: Sequence[W]) -> None:
        self.writes = writes
        self.results: Sequence[R] = ()
        self.error: BaseException | None = None
        self.lead = False  # set when this entry's caller is to write the next group
        # Released once there is a result (or error), or the leadership: its caller waits by
        # acquiring it. A bare lock, not an Event: an Event's condition costs a second lock and,
        # when the woken caller finds the waker still holding it, a second sleep and wake-up per
        # batch, which the group's leader pays for every batch it answers.
        self.ready = threading.Lock()
        self.ready.acquire()


class Coalescer(Generic[W, R]):
    """Writes submitted batches in groups; see the module docstring."""

    def __init__(self, flush: Callable[[Sequence[W]], Sequence[R]], *, max_batches: int = 64) -> None:
        if max_batches < 1:
            raise ValueError("max_batches must be at least 1.")
        self._flush = flush
        self._max = max_batches
        self._lock = threading.Lock()
        self._queues: dict[Hashable, deque[_Entry[W, R]]] = {}  # a group is busy while it has a queue
        self._observers: list[FlushObserver] = []

    def observe(self, observer: FlushObserver) -> None:
        """Call observer(batches, seconds, failed) after every flush."""
        self._observers.append(observer)

    def submit(self, group: Hashable, write: W) -> R:
        """Write ``write`` with others of the same group; its result, or the flush's exception."""
        return self.submit_many(group, (write,))[0]

    def submit_many(self, group: Hashable, writes: Sequence[W]) -> Sequence[R]:
        """Write ``writes`` together, with others of the same group; their results in order, or
        the flush's exception."""
        if not writes:
            return ()
        entry: _Entry[W, R] = _Entry(writes)
        with self._lock:
            queue = self._queues.get(group)
            if queue is None:
                queue = self._queues[group] = deque()
                entry.lead = True
            queue.append(entry)
        if not entry.lead:
            entry.ready.acquire()
        if entry.lead:
            self._lead(group, queue, entry)
        error, entry.error = entry.error, None
        if error is None:
            return entry.results
        # No reference cycles through the exception (entry -> error -> traceback -> a frame
        # holding entry or error): refused batches must be freed as soon as they are answered,
        # without waiting for the cyclic garbage collector. So entries let go of the error, and
        # this frame of its local before the exception leaves it.
        try:
            if entry.lead:
                raise error
            # Each other caller raises its own copy: one exception object raised in several
            # threads at once would have its traceback rewritten under the others' feet.
            fresh = _copy(error)
            try:
                if fresh is error:
                    raise fresh
                raise fresh from error
            finally:
                del fresh
        finally:
            del error, entry

    def _lead(self, group: Hashable, queue: deque[_Entry[W, R]], entry: _Entry[W, R]) -> None:
        """Write the oldest queued entries (entry's among them: it is the oldest), then pass the
        leadership on, or retire the group when nobody is waiting."""
        try:
            with self._lock:
                taken = [queue.popleft()]
                size = len(entry.writes)
                while queue and size + len(queue[0].writes) <= self._max:
                    size += len(queue[0].writes)
                    taken.append(queue.popleft())
            assert taken[0] is entry
            self._write(taken)
        finally:
            with self._lock:
                if queue:
                    following = queue[0]
                    following.lead = True
                    following.ready.release()
                else:
                    del self._queues[group]

    def _write(self, taken: list[_Entry[W, R]]) -> None:
        started = time.perf_counter()
        failed = False
        e: _Entry[W, R] | None
        writes = [w for e in taken for w in e.writes]
        try:
            results = self._flush(writes)
            if len(results) != len(writes):
                raise RuntimeError(f"flush returned {len(results)} results for {len(writes)} writes")
            start = 0
            for e in taken:
                e.results = results[start : start + len(e.writes)]
                start += len(e.writes)
        except BaseException as error:  # noqa: BLE001 (handed to every caller, re-raised there)
            failed = True
            for e in taken:
                e.error = error
        finally:
            for e in taken:
                if not e.lead:
                    e.ready.release()
            e = None  # this frame is in the error's traceback: hold no entry
            seconds = time.perf_counter() - started
            for observer in self._observers:
                try:
                    observer(len(writes), seconds, failed)
                except Exception:  # noqa: BLE001 (a metric must never fail a write)
                    pass


def _copy(error: BaseException) -> BaseException:
    try:
        return copy.copy(error)
    except Exception:  # noqa: BLE001 (an exception that cannot be copied is raised as it is)
        return error
