"""The background worker: batch, spool, upload, retry. It never raises into the app.

One daemon thread per Reporter (per process). Each turn it waits until there is something to
do (a full batch, the schedule delay, a due retry or spec check, a flush or shutdown request),
then: batches the queued reports (one metric, one spec fingerprint and one time slot per batch:
made_unix, the start of the slot of the spec's time resolution the reports were made in; a fresh
16-byte random batch id each), spools them under the queue directory, checks the specs when due,
and uploads the outbox oldest first, as many batches per UploadBatches call as fit (64 batches,
the aggregator's max_batch reports), or one per Upload to a revision-1 aggregator. While a call
is in flight it keeps batching and spooling what falls due, so a crash loses at most the reports
of the last schedule delay, and a slow upload never fills the memory queue when a queue
directory can take the batches.

Specs are checked at start and then every spec_ttl with the version held (an ``unchanged``
answer costs the aggregator almost nothing), and at once when an upload answer names another
specs_version.

Each batch's answer is handled alone, whether it came from an Upload or as a BatchResult. Only
what can never succeed (_status.FINAL) fails a batch: FAILED_PRECONDITION (a stale spec, whose
reports cannot be re-randomized) also fetches the specs again, and TOO_LATE is counted as
too_late. Everything else keeps the batch and waits a backoff with full jitter (the first wait
uniform in [0, initial], then [0, min(max, initial * 2^failures)]), or the aggregator's
retry-after-ms hint when that is longer, before resending the same bytes, batch id included; a
refused token is logged as such, not as an outage.
"""

from __future__ import annotations

import math
import random
import secrets
import time
from collections.abc import Sequence
from typing import TypeVar

from veil.mechanism import MetricSpec, encoding, report_bytes

from ._config import RETRY_HORIZON_SECONDS
from ._encoding import MAX_BATCH_BYTES, encode_batch, encode_batches, made_slot
from ._log import logger
from ._outbox import Batch
from ._processor import BatchProcessor, FlushRequest
from ._status import CODE_NAMES, FINAL, OK, STALE_SPEC, TOKEN_REFUSED, TOO_LATE, UNIMPLEMENTED
from ._transport import Call

__all__ = ["Worker", "Backoff", "run_worker"]

_Response = TypeVar("_Response")  # what a call answers: _await waits for any
_CALLS_PER_TURN = 64  # upload calls between two looks at the queue
_BATCHES_PER_CALL = 64  # the most batches an UploadBatches call may carry (docs/protocol.md)
_Queued = tuple[MetricSpec, tuple[int, ...], float]  # (spec, report, made at): a queued report


class Backoff:
    """Exponential backoff with full jitter, capped."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.failures = initial, maximum, 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.failures, 64))
        self.failures += 1
        return random.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.failures = 0


class Worker:
    def __init__(self, processor: BatchProcessor, load: bool) -> None:
        self.p = processor
        self.load = load
        config = processor.config
        self.next_drain: float | None = None  # the clock starts with the first queued report
        self.spec_due = 0.0  # fetch specs at start
        self.retry_at = 0.0
        self.uploads = Backoff(config.backoff_initial, config.backoff_max)
        self.fetches = Backoff(config.backoff_initial, config.backoff_max)
        self.active: list[FlushRequest] = []
        self.seq = 0

    def run(self) -> None:
        p = self.p
        if self.load:
            try:
                self.seq = p.outbox.load(self.seq)
                self._mirror(memory_delta=0)
                if len(p.outbox):
                    logger.info("Veil found %d unsent batch(es) under the queue directory.", len(p.outbox))
            except Exception:
                p.log.warning(
                    "spool:load", "Unsent Veil batches cannot be read from the queue directory.", exc_info=True
                )
        while True:
            try:
                if not self._turn():
                    return
            except Exception:
                p.log.warning("worker:error", "The Veil worker hit an unexpected error and carries on.", exc_info=True)
                with p.lock:
                    p.wake.wait(p.config.backoff_initial)

    # --- one turn -----------------------------------------------------------------------------

    def _turn(self) -> bool:
        p = self.p
        with p.lock:
            reports, requests = self._wait()
        if reports:
            self._drain(reports)
        for request in requests:
            request.target = self.seq - 1
            self.retry_at = 0.0  # a flush tries at once, whatever the backoff
            self.active.append(request)
        closing = any(r.closing for r in self.active)
        if not closing and time.monotonic() >= self.spec_due:
            self._fetch_specs()
        self._deliver()
        answers = self._settle()
        closed = any(request.closing for request, _ in answers)
        if closed:
            self._close()  # before shutdown() hears its answer: its counts are final then
        for request, ok in answers:
            request.finish(ok)
        return not closed
        return True

    def _drain_due(self, now: float) -> bool:
        """Under the lock: whether the queued reports are to be batched now (starts the clock)."""
        p, config = self.p, self.p.config
        pending = len(p.pending)
        if not pending:
            self.next_drain = None
            return False
        if self.next_drain is None:
            self.next_drain = now + config.schedule_delay
        return pending >= config.max_batch_size or now >= self.next_drain or bool(self.active)

    def _take(self) -> list[_Queued]:
        """Under the lock: the queued reports, leaving the queue empty. They count as outbox
        reports from now on, so counters() sees them queued while _drain turns them into batches."""
        reports = list(self.p.pending)
        self.p.pending.clear()
        self.p.outbox_reports += len(reports)
        self.next_drain = None
        return reports

    def _wait(self) -> tuple[list[_Queued], list[FlushRequest]]:
        """Under the lock: sleep until there is work; take the queue when it is due."""
        p = self.p
        while True:
            now = time.monotonic()
            closing = any(r.closing for r in self.active)
            due = self._drain_due(now)
            if (
                p.requests
                or due
                or (len(p.outbox) and now >= self.retry_at)
                or (not closing and now >= self.spec_due)
                or any(now >= r.deadline for r in self.active)
            ):
                break
            wake = math.inf if closing else self.spec_due
            if self.next_drain is not None:
                wake = min(wake, self.next_drain)
            if len(p.outbox):
                wake = min(wake, self.retry_at)
            wake = min([wake, *(r.deadline for r in self.active)])
            p.wake.wait(None if wake == math.inf else max(wake - now, 0.0005))
        requests, p.requests = p.requests, []
        return (self._take() if due or requests else []), requests

    def _await(self, future: Call[_Response]) -> None:
        """Wait for a call in flight, batching (and spooling) the queued reports as they fall due
        (also after a quick call: a backlog's uploads follow each other without a turn between)."""
        p = self.p
        done = []

        def wake(_: object) -> None:
            with p.lock:
                done.append(True)
                p.wake.notify()

        future.add_done_callback(wake)
        while True:
            reports = []
            with p.lock:
                while True:
                    now = time.monotonic()
                    if self._drain_due(now):
                        reports = self._take()
                        break
                    if done:
                        break
                    p.wake.wait(None if self.next_drain is None else max(self.next_drain - now, 0.0005))
            if not reports:
                return
            self._drain(reports)

    # --- batching -----------------------------------------------------------------------------

    def _drain(self, reports: list[_Queued]) -> None:
        """Turn queued reports into batches in the outbox (spooled when there is a spool)."""
        p = self.p
        p.memo.sync()  # a memoized response is durable before any report of it leaves
        p.ledger.sync()  # and so is the spending that admitted it
        groups: dict[tuple[str, int], tuple[MetricSpec, list[tuple[int, ...]]]] = {}
        for spec, report, made_at in reports:
            slot = made_slot(made_at, p.specs.resolution(spec))
            groups.setdefault((spec.fingerprint, slot), (spec, []))[1].append(report)
        before = p.outbox.in_memory
        dropped = failed = 0
        for (_, slot), (spec, group) in groups.items():
            size = max(
                1,
                min(
                    p.config.max_batch_size,
                    p.specs.max_batch or p.config.max_batch_size,
                    MAX_BATCH_BYTES // report_bytes(spec.mechanism, encoding(spec.mechanism)),
                ),
            )
            for start in range(0, len(group), size):
                chunk = group[start : start + size]
                try:
                    dropped += self._add(spec, chunk, slot)
                except Exception:
                    failed += len(chunk)
                    p.log.warning(
                        "encode", "Veil reports could not be encoded; counting them as failed.", exc_info=True
                    )
        if dropped:
            p.log.warning("drop:disk", "The Veil queue directory is at its size cap; dropping new batches.")
        # One lock: the reports leave the mirrored outbox count as they are counted dropped or failed.
        self._mirror(memory_delta=p.outbox.in_memory - before - len(reports), dropped=dropped, failed=failed)

    def _add(self, spec: MetricSpec, chunk: Sequence[tuple[int, ...]], made_unix: int) -> int:
        batch = Batch(self.seq, secrets.token_bytes(16), len(chunk), time.time())
        payload = encode_batch(spec, chunk, batch.batch_id, made_unix)
        self.seq += 1
        return 0 if self.p.outbox.add(batch, payload) else len(chunk)

    def _mirror(self, memory_delta: int, **tallies: int) -> None:
        p = self.p
        with p.lock:
            p.held += memory_delta
            p.outbox_reports = p.outbox.reports
            for name, value in tallies.items():
                setattr(p, name, getattr(p, name) + value)

    # --- the network --------------------------------------------------------------------------

    def _timeout(self) -> float:
        now = time.monotonic()
        return min([self.p.config.export_timeout, *(r.deadline - now for r in self.active)])

    def _fetch_specs(self) -> None:
        p = self.p
        timeout = self._timeout()
        if timeout <= 0:
            return
        try:
            future = p.transport.fetch_specs(timeout, p.specs.version)
            self._await(future)
            response = future.result()
        except Exception as error:
            self.spec_due = time.monotonic() + self.fetches.next_delay()
            code, _, detail = p.transport.refusal(error)
            if code in TOKEN_REFUSED:
                p.log.warning(
                    f"specs:fetch:{code}",
                    "The aggregator refused the Veil token (%s) when fetching "
                    "metric specs: check the token; retrying with backoff.",
                    code,
                )
            else:
                p.log.warning(
                    f"specs:fetch:{code}",
                    "Cannot fetch Veil metric specs (%s%s); retrying with backoff.",
                    code or type(error).__name__,
                    f": {detail}" if code and detail else "",
                    exc_info=code is None,
                )
            return
        p.specs.update(response)
        self.spec_due = time.monotonic() + p.config.spec_ttl
        self.fetches.reset()
        if p.log.rearm("specs:fetch:"):
            logger.info("Fetched Veil metric specs again.")
        p.release_early()

    def _heard(self, specs_version: str) -> None:
        """An upload answer named the aggregator's specs_version: another than ours, fetch now."""
        if specs_version and specs_version != self.p.specs.version:
            self.spec_due = 0.0

    def _deliver(self) -> None:
        for _ in range(_CALLS_PER_TURN):
            if time.monotonic() < self.retry_at:
                return
            call = self._next_call()
            if not call:
                return
            timeout = self._timeout()
            if timeout <= 0:
                return
            # One batch goes in an Upload, which every revision answers alike.
            if not (self._upload_batches(call, timeout) if len(call) > 1 else self._upload(*call[0], timeout)):
                return

    def _next_call(self) -> list[tuple[Batch, bytes]]:
        """The batches (and their bytes) of the next upload call, oldest first: as many as one
        UploadBatches call takes, or one for a revision-1 aggregator (its specs say no version, or
        it answered UploadBatches UNIMPLEMENTED). Batches that can never be sent are settled on
        the way."""
        p = self.p
        limit = p.specs.max_batch or p.config.max_batch_size
        # Only a revision-2 aggregator says a specs_version; a revision-1 one with tokens would refuse
        # UploadBatches as PERMISSION_DENIED (no token grants a method it does not know), not UNIMPLEMENTED.
        most = _BATCHES_PER_CALL if p.transport.batches and p.specs.version else 1
        call: list[tuple[Batch, bytes]] = []
        reports = size = 0
        for batch in p.outbox.oldest(_BATCHES_PER_CALL):
            if len(call) == most:
                break
            if time.time() - batch.created > RETRY_HORIZON_SECONDS:
                p.log.warning("upload:horizon", "A Veil batch outlived the retry horizon; counting it as failed.")
                self._finish(batch, "failed")
                continue
            if p.specs.max_batch and batch.count > p.specs.max_batch:
                # Made before the aggregator lowered its limit (a spooled batch): it would be refused
                # on every attempt, and splitting it could count reports an earlier attempt counted.
                p.log.warning(
                    "upload:oversize", "A Veil batch is larger than the aggregator accepts; counting it as failed."
                )
                self._finish(batch, "failed")
                continue
            payload = p.outbox.payload(batch)
            if payload is None:  # sent and removed by another process sharing the queue directory
                self._finish(batch, None)
                continue
            if call and (reports + batch.count > limit or size + len(payload) > MAX_BATCH_BYTES):
                break
            call.append((batch, payload))
            reports += batch.count
            size += len(payload)
        return call

    def _upload(self, batch: Batch, payload: bytes, timeout: float) -> bool:
        """One batch in one Upload; False when the outbox must wait for a retry."""
        try:
            future = self.p.transport.upload(payload, timeout)
            self._await(future)
            response = future.result()
        except Exception as error:  # noqa: BLE001 (every failure goes through the retry policy)
            self._attempted([batch])
            code, hint, detail = self.p.transport.refusal(error)
            return self._answered([batch], code, hint, error, detail)
        self._attempted([batch])
        self._heard(response.specs_version)
        self.uploads.reset()
        return self._answered([batch], OK, 0.0, None)

    def _upload_batches(self, call: list[tuple[Batch, bytes]], timeout: float) -> bool:
        """Several batches in one UploadBatches call, each answered alone; False when the outbox
        must wait for a retry."""
        p = self.p
        batches = [batch for batch, _ in call]
        try:
            future = p.transport.upload_batches(encode_batches([payload for _, payload in call]), timeout)
            self._await(future)
            response = future.result()
        except Exception as error:  # noqa: BLE001 (every failure goes through the retry policy)
            code, hint, detail = p.transport.refusal(error)
            if code == UNIMPLEMENTED:
                # A revision-1 aggregator: one Upload per batch from now on, on this channel.
                p.transport.batches = False
                logger.info("The Veil aggregator predates UploadBatches; uploading one batch per call.")
                return True  # not an attempt: the call was not understood
            self._attempted(batches)
            return self._answered(batches, code, hint, error, detail)  # the call refused whole
        self._attempted(batches)
        self._heard(response.specs_version)
        if len(response.results) != len(batches):
            return self._answered(batches, None, 0.0, ValueError("UploadBatches answered a result count unasked"))
        waiting: list[Batch] = []
        waiting_code: str | None = None
        for batch, result in zip(batches, response.results, strict=True):
            code = CODE_NAMES.get(result.code, f"code {result.code}")
            if code in FINAL or code == OK:
                self._answered([batch], code, 0.0, None, result.message)
            else:  # to retry: one backoff for all of them, as for a call refused whole
                waiting.append(batch)
                waiting_code = waiting_code or code
        if not waiting:
            self.uploads.reset()
            return True
        return self._answered(waiting, waiting_code, 0.0, None)

    def _attempted(self, batches: list[Batch]) -> None:
        """Count an answered attempt of each batch (a repeated one as retried)."""
        repeated = sum(1 for batch in batches if batch.attempts)
        for batch in batches:
            batch.attempts += 1
        if repeated:
            self._mirror(0, retried=repeated)

    def _answered(
        self,
        batches: list[Batch],
        code: str | None,
        hint: float,
        error: Exception | None,
        message: str = "",
    ) -> bool:
        """Settle batches by their answer (OK, a final status, or one to retry: None when no
        status came); False when they must wait for a retry."""
        p = self.p
        if code == OK:  # the caller resets the backoff when nothing in the call waits
            for batch in batches:
                self._finish(batch, "sent")
            if p.log.rearm("upload:"):
                logger.info("Veil uploads succeed again.")
            return True
        name = code or type(error).__name__
        if code not in FINAL:
            self.retry_at = time.monotonic() + max(self.uploads.next_delay(), hint)
            if code in TOKEN_REFUSED:
                p.log.warning(
                    f"upload:{name}",
                    "The aggregator refused the Veil token (%s): check the token; "
                    "keeping the batches and retrying with backoff.",
                    name,
                )
            else:
                p.log.warning(
                    f"upload:{name}",
                    "Veil upload failed (%s%s); retrying the same batch with backoff.",
                    name,
                    f": {message}" if code and message else "",
                    exc_info=code is None and error is not None,  # called in its except clause
                )
            return False
        outcome = "failed"
        if code == STALE_SPEC:
            self.spec_due = 0.0  # the spec is stale: fetch again; these reports cannot be re-randomized
            p.log.warning(
                f"upload:{name}",
                "The aggregator refused a Veil batch for a stale spec (%s); fetching "
                "specs again and counting the batch as failed.",
                name,
            )
        elif code == TOO_LATE:
            outcome = "too_late"
            p.log.warning(
                f"upload:{name}",
                "The aggregator refused a Veil batch as made too long ago (%s); counting it as too_late.",
                name,
            )
        else:
            p.log.warning(
                f"upload:{name}",
                "The aggregator refused a Veil batch (%s%s); counting it as failed.",
                name,
                f": {message}" if message else "",
            )
        for batch in batches:
            self._finish(batch, outcome)
        return True

    def _finish(self, batch: Batch, outcome: str | None) -> None:
        in_memory = batch.path is None
        self.p.outbox.pop(batch)
        tallies = {outcome: batch.count} if outcome else {}
        self._mirror(-batch.count if in_memory else 0, **tallies)

    # --- flush and shutdown -------------------------------------------------------------------

    def _settle(self) -> list[tuple[FlushRequest, bool]]:
        """The flush requests that are done or cannot finish in time, with their answers (the
        caller gives them); the others stay active."""
        head = self.p.outbox.head()
        now = time.monotonic()
        spooled = self.p.outbox.spool is not None
        with self.p.lock:
            early = bool(self.p.early)  # calls waiting for the first specs: not delivered yet
        answers, still = [], []
        for request in self.active:
            if (head is None or head.seq > request.target) and not early:
                answers.append((request, True))
            elif early and request.closing:
                answers.append((request, False))  # no specs to randomize them under: shutdown drops them
            elif (
                now >= request.deadline
                or self.retry_at > request.deadline
                or (request.closing and spooled and self.retry_at > now)
            ):
                answers.append((request, False))  # with a spool, shutdown leaves the batches on disk
            else:
                still.append(request)
        self.active = still
        return answers

    def _close(self) -> None:
        p = self.p
        lost = p.outbox.clear_memory()
        with p.lock:
            lost += len(p.pending) + len(p.early) + len(p.waiting)
            p.pending.clear()
            p.early.clear()
            p.waiting.clear()
            p.dropped += lost
            p.held = 0
            p.outbox_reports = p.outbox.reports
        if lost:
            logger.warning("Veil dropped %d unsent report(s) at shutdown (no queue directory keeps them).", lost)
        for close in (p.memo.close, p.ledger.close, p.transport.close):
            try:
                close()
            except Exception:  # noqa: BLE001 (shutting down: the others are closed all the same)
                pass
        for request in p.requests:
            request.finish(False)


def run_worker(processor: BatchProcessor, load: bool) -> None:
    """The worker thread's body (the processor's run_worker): load the spool when `load`, then
    serve the processor until it shuts down."""
    Worker(processor, load).run()
