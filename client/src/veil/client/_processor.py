"""The bounded queue between report() and the background worker (OpenTelemetry's batch
processor, for randomized reports).

report() appends a randomized report, with the time it was made, under one lock and returns;
nothing here touches the network or the disk on the caller's thread. A full queue drops the
newest report and counts it. Before any spec is known (a first start, no network yet) report()
calls wait here as they were made (``early``: metric, value and time, in memory only, within the
same bound); the worker hands them back to the Reporter once specs arrive, and only then are
they randomized. The worker thread (see _worker) batches, spools, uploads and retries; force_flush
and shutdown hand it a request with a deadline and wait for its answer. The worker works on this
processor's state, so it imports this module and the Reporter hands the processor the worker's
body to start (``run_worker``): the import arrow between them points one way. After fork the
child gets new locks, an empty queue, a new worker and, later, its own gRPC channel or HTTP
connection.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

from veil.mechanism import MetricSpec

from ._config import Config
from ._counters import Counters
from ._ledger import BUDGET, PERIOD, UNWRITABLE, Ledger
from ._log import LogOnce, logger
from ._memo import MemoStore
from ._outbox import Outbox, Spool
from ._specs import SpecCache
from ._transport import open_transport

__all__ = ["BatchProcessor", "FlushRequest", "RunWorker"]

# The worker thread's body, given the processor and whether to load the spool first.
RunWorker = Callable[["BatchProcessor", bool], None]

# A weak reference to a Reporter's report() of a call made at a given time (metric, value, time).
_ReportAt = Callable[[], Callable[[str, object, float], None] | None]

_DROP_MESSAGES = {
    "full": "The Veil report queue is full; dropping new reports until it drains.",
    "closed": "The Veil Reporter is shut down; dropping new reports.",
    "refused": "A Veil metric's spec was refused; dropping its reports.",
    # A metric or category can vanish from a running app's specs (an operator removed or renamed
    # it): never an exception in the host, and a misspelt name shows up here too.
    "unknown-metric": "The aggregator declares no Veil metric named %r (removed, renamed or misspelt); "
    "dropping its reports.",
    "unknown-category": "A value is not a category of Veil metric %r in the aggregator's spec; dropping such reports.",
    # A metric of categories can become numeric (or the reverse) by the operator's config alone.
    "numeric-label": "Veil metric %r is numeric in the aggregator's specs: it takes numbers, not labels; "
    "dropping such reports.",
    "numeric-part": "Veil metric %r is a part of a numeric metric: report the number under the metric's name; "
    "dropping such reports.",
    "strings-value": "Veil metric %r is a strings metric in the aggregator's specs: it takes strings or bytes, "
    "not numbers; dropping such reports.",
    "not-strings": "Veil metric %r is not a strings metric in the aggregator's specs: it takes no bytes; "
    "dropping such reports.",
    "strings-round": "Veil metric %r is a round of a strings metric: report the string under the metric's name; "
    "dropping such reports.",
    # A round changes every period: a value made in one is only counted by that period's round.
    "strings-expired": "A string of Veil metric %r waited for its round until its period was over; "
    "dropping such reports.",
    "error": "An unexpected error prevented a Veil report; dropping it.",
}


class FlushRequest:
    """A force_flush or shutdown waiting for the worker: done when every batch created before
    it was acknowledged or failed (ok), or when it cannot finish by its deadline (not ok)."""

    def __init__(self, timeout: float | None, closing: bool = False) -> None:
        self.deadline = math.inf if timeout is None else time.monotonic() + max(0.0, timeout)
        self.closing = closing
        self.target = -1  # the last batch seq it waits for, set by the worker
        self.ok = False
        self.done = threading.Event()

    def finish(self, ok: bool) -> None:
        self.ok = ok
        self.done.set()


class BatchProcessor:
    def __init__(
        self, config: Config, specs: SpecCache, memo: MemoStore, ledger: Ledger, log: LogOnce, run_worker: RunWorker
    ) -> None:
        self.config = config
        self.specs = specs
        self.memo = memo
        self.ledger = ledger
        self.log = log
        self.transport = open_transport(config)
        spool = None
        if config.queue_dir is not None:
            try:
                spool = Spool(config.queue_dir, config.max_disk_bytes, log)
            except OSError:
                log.warning(
                    "spool:open", "The Veil queue directory cannot hold unsent batches; keeping them in memory."
                )
        self.outbox = Outbox(spool, log)
        self._run_worker = run_worker
        self.stopped = False
        self._new_state()
        self._start(load=True)
        if hasattr(os, "register_at_fork"):  # POSIX
            ref = weakref.WeakMethod(self._after_fork_in_child)
            os.register_at_fork(after_in_child=lambda: (method := ref()) is not None and method())

    def _new_state(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.pending: deque[tuple[MetricSpec, tuple[int, ...], float]] = deque()  # (spec, report, made at)
        # report() calls made before any spec was known: (the report() of the device that made it,
        # metric, value, made at); a simulated device shares this queue with its Reporter.
        self.early: list[tuple[_ReportAt, str, object, float]] = []
        # strings whose device's round was not served when reported: as early, once specs are known
        self.waiting: list[tuple[_ReportAt, str, object, float]] = []
        self.held = 0  # reports in memory: early, waiting, pending and batches not spooled
        self.outbox_reports = 0  # mirror of outbox.reports, for counters()
        self.requests: list[FlushRequest] = []
        self.accepted = self.dropped = self.sent = self.retried = self.failed = 0
        self.limited = self.over_budget = self.too_late = self.ledger_unavailable = self.clipped = 0
        # dropped + failed + too_late + ledger_unavailable when the last force_flush answered
        self.lost_at_flush = 0

    def _start(self, load: bool) -> None:
        self.thread = threading.Thread(target=self._run_worker, args=(self, load), name="veil-reporter", daemon=True)
        self.thread.start()

    # --- the app's threads ------------------------------------------------------------------

    def has_room(self) -> bool:
        """A racy early check, so a report that would be dropped is not randomized first."""
        return not self.stopped and self.held < self.config.max_queue_size

    def hold(self, report: _ReportAt, metric: str, value: object, made_at: float) -> bool:
        """Keep a report() call made before any spec is known, until specs arrive (or drop and
        count it when the queue is full); False when specs are known by now (report it)."""
        with self.lock:
            if self.specs.ready.is_set():
                return False
            if self.stopped or self.held >= self.config.max_queue_size:
                reason = "closed" if self.stopped else "full"
                self.dropped += 1
            else:
                self.early.append((report, metric, value, made_at))
                self.held += 1
                return True
        self.drop_logged(reason, count=False)
        return True

    def wait_for_round(self, report: _ReportAt, metric: str, value: object, made_at: float) -> None:
        """Keep a string whose round is not served now, until a specs answer brings it (or drop
        and count it when the queue is full)."""
        with self.lock:
            if self.stopped or self.held >= self.config.max_queue_size:
                reason = "closed" if self.stopped else "full"
                self.dropped += 1
            else:
                self.waiting.append((report, metric, value, made_at))
                self.held += 1
                return
        self.drop_logged(reason, count=False)

    def release_early(self) -> None:
        """After a specs answer (the worker): report the calls held until specs were known, and
        the strings waiting for their round, as made (those whose round is still not served wait
        again)."""
        with self.lock:
            early, self.early = self.early + self.waiting, []
            self.waiting = []
            self.held -= len(early)
        for reference, metric, value, made_at in early:
            try:
                report = reference()
                if report is None:
                    raise RuntimeError("the Reporter is gone")
                report(metric, value, made_at)
            except Exception:  # noqa: BLE001 (never raised: the call is dropped, counted)
                self.drop_logged("error")

    def submit(self, spec: MetricSpec, report: tuple[int, ...], made_at: float) -> None:
        with self.lock:
            if self.stopped or self.held >= self.config.max_queue_size:
                reason = "closed" if self.stopped else "full"
                self.dropped += 1
            else:
                self.pending.append((spec, report, made_at))
                self.held += 1
                self.accepted += 1
                if len(self.pending) in (1, self.config.max_batch_size):
                    self.wake.notify()  # start the schedule clock, or send a full batch
                return
        self.drop_logged(reason, count=False)

    def refuse(self, reason: str) -> None:
        """Count a report the privacy ledger refused (not a failure: the bound at work)."""
        with self.lock:
            if reason == PERIOD:
                self.limited += 1
            elif reason == UNWRITABLE:  # the ledger logged why
                self.ledger_unavailable += 1
            else:
                self.over_budget += 1
        if reason == BUDGET:
            self.log.warning(
                "refuse:budget",
                "A Veil metric's privacy budget is spent for now; its reports are "
                "dropped until it allows more (see Reporter.privacy_spent()).",
            )

    def count_clipped(self) -> None:
        """Count a number reported outside its metric's range (clipped to it)."""
        with self.lock:
            self.clipped += 1

    def drop_logged(self, reason: str, count: bool = True, metric: str | None = None) -> None:
        if count:
            with self.lock:
                self.dropped += 1
        if metric is None:
            self.log.warning(f"drop:{reason}", _DROP_MESSAGES[reason])
        else:
            self.log.warning(f"drop:{reason}:{metric}", _DROP_MESSAGES[reason], metric)

    def counters(self) -> Counters:
        with self.lock:
            return Counters(
                self.accepted,
                self.dropped,
                self.sent,
                self.retried,
                self.failed,
                len(self.early) + len(self.waiting) + len(self.pending) + self.outbox_reports,
                self.limited,
                self.over_budget,
                self.too_late,
                self.ledger_unavailable,
                self.clipped,
            )

    def force_flush(self, timeout: float | None) -> bool:
        if self.stopped or threading.current_thread() is self.thread:
            return False
        request = FlushRequest(timeout)
        with self.lock:
            self.requests.append(request)
            self.wake.notify()
        request.done.wait(timeout)
        with self.lock:  # honest: False when reports were lost (dropped, failed, unrecorded) since the last flush
            lost = self.dropped + self.failed + self.too_late + self.ledger_unavailable
            before = self.lost_at_flush
            self.lost_at_flush = lost
        return request.done.is_set() and request.ok and lost == before

    def shutdown(self, timeout: float | None) -> bool:
        with self.lock:
            if self.stopped:
                return True
            self.stopped = True
            request = FlushRequest(timeout, closing=True)
            self.requests.append(request)
            self.wake.notify()
        request.done.wait(timeout)
        if threading.current_thread() is not self.thread:
            self.thread.join(None if timeout is None else max(0.0, request.deadline - time.monotonic()))
        counters = self.counters()
        ok = (
            request.done.is_set()
            and request.ok
            and not (counters.dropped or counters.failed or counters.too_late or counters.queued)
            and not counters.ledger_unavailable
        )
        if ok:
            logger.info("Veil Reporter shut down (all reports delivered).")
        else:
            logger.warning(
                "Veil Reporter shut down: %d report(s) sent, %d dropped, %d failed, %d too late, %d unsent%s.",
                counters.sent,
                counters.dropped,
                counters.failed,
                counters.too_late,
                counters.queued,
                " (kept under the queue directory)" if counters.queued and self.outbox.spool is not None else "",
            )
        return ok

    # --- fork -------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # Locks may have been held by threads that do not exist in the child, the queue holds
        # the parent's reports, and the channel or connection belongs to the parent: start afresh.
        self._new_state()
        self.outbox = self.outbox.forked()
        self.transport.forget()
        self.log.after_fork()
        self.memo.after_fork()
        self.ledger.after_fork()
        if not self.stopped:
            self._start(load=False)
