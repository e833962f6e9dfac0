"""The ingest core: what becomes of an upload, whichever listener it came on (docs/design.md, 5).

The gRPC servicer (service.CollectorService) and the HTTP routes (_http_collector) are adapters:
they parse the wire, run the access checks (_access), and hand the batches here. This module does
the rest, with no gRPC or HTTP of its own:

- checking: the metric is declared, the spec fingerprint is current, the store is not known to be
  down, the reports decode (decode.decode_upload), the caller still waits;
- targeting: the buckets of every window holding the time the reports were made (`made_unix`,
  revision 2; the arrival time when it is 0), refusing a slot that ended more than
  server.max_lateness ago (too late) or starts in the future beyond one time resolution of clock
  skew, and leaving out a bucket whose retention has passed (it was purged: never resurrected);
- writing in sets: one batch through Store.add, several through Store.add_many, each in one
  store call (SQLite and Redis group concurrent calls into one write, whatever their listener);
- the outcome: the Status of STATUSES it ends with, counted in veil_uploads and logged.

STATUSES is the one table of every answer the aggregator gives a collector client: its
veil_uploads label, gRPC status, HTTP status and whether the client is done with the batch.
docs/protocol.md section 5's answers table is tested against it, both ways.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from veil.client import spec_to_proto
from veil.wire.v1 import veil_pb2

from .config import AggregatorConfig, MetricConfig
from .decode import decode_upload
from .decode import warm_up as decode_warm_up
from .errors import InvalidBatch, StaleSpec, StoreError, StoreUnavailable, UnknownMetric, quoted
from .instruments import Instruments
from .rounds import Rounds
from .store import BatchWrite, CountsKey, Store

__all__ = [
    "GRPC_CODES",
    "MAX_BATCHES",
    "STATUSES",
    "Ingest",
    "Outcome",
    "Status",
    "http_status",
    "time_resolution",
]

log = logging.getLogger("veil.aggregator")

MAX_BATCHES = 64  # batches in one UploadBatches call, at most


@dataclass(frozen=True)
class Status:
    """One answer: `label` its veil_uploads outcome (None: refused before ingest, counted in
    veil_calls_refused, or not an upload's answer), `grpc` the gRPC status name (None: HTTP only),
    `http` the HTTP status (None: gRPC only), `final` whether the client is done with the batch
    (True: it drops it; False: it keeps it and retries the same bytes), `message` the answer's
    message when it has a fixed one."""

    label: str | None
    grpc: str | None
    http: int | None
    final: bool
    message: str = ""


_UNAVAILABLE = "The counter store is unavailable; retry with the same batch id."

# Every answer, by name (docs/protocol.md section 5). A refusal that carries a gRPC status is
# answered over HTTP with the status of the first row of that gRPC status (http_status): later
# rows of the same gRPC status are answers only one transport tells apart (HTTP 304, 413).
STATUSES: dict[str, Status] = {
    "accepted": Status("accepted", "OK", 200, True),
    "unchanged": Status(None, "OK", 304, True),
    "duplicate": Status("duplicate", "OK", 200, True),
    "invalid": Status("invalid", "INVALID_ARGUMENT", 400, True),
    "future": Status("future", "INVALID_ARGUMENT", 400, True),
    "too_late": Status("too_late", "OUT_OF_RANGE", 410, True),
    "unknown_metric": Status("unknown_metric", "FAILED_PRECONDITION", 409, True),
    "stale_spec": Status("stale_spec", "FAILED_PRECONDITION", 409, True),
    "unauthenticated": Status(None, "UNAUTHENTICATED", 401, False),
    "permission_denied": Status(None, "PERMISSION_DENIED", 403, False),
    "rate_limited": Status(None, "RESOURCE_EXHAUSTED", 429, False),
    "oversize": Status(None, "RESOURCE_EXHAUSTED", 413, True),
    "cancelled": Status("cancelled", "CANCELLED", 503, False, "The call ended before the batch was counted."),
    "deadline": Status(None, "DEADLINE_EXCEEDED", None, False),
    "unavailable": Status("unavailable", "UNAVAILABLE", 503, False, _UNAVAILABLE),
    "error": Status("error", "INTERNAL", 500, False, "The batch could not be counted; nothing of it was counted."),
    "unimplemented": Status(None, "UNIMPLEMENTED", 404, False),
    "not_found": Status(None, "NOT_FOUND", 404, True),
    "method_not_allowed": Status(None, None, 405, True),
    "unsupported_media_type": Status(None, None, 415, True),
}

# Reversed: the first row of each gRPC status is the last written, so it stays.
_HTTP_OF_GRPC = {s.grpc: s.http for s in reversed(STATUSES.values()) if s.grpc and s.http}


def http_status(grpc_name: str) -> int:
    """The HTTP status of a refusal with this gRPC status name (500 for one not in STATUSES)."""
    return _HTTP_OF_GRPC.get(grpc_name, 500)


# The numbers of the gRPC statuses a batch's outcome can have (BatchResult.code): gRPC's own.
GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "INVALID_ARGUMENT": 3,
    "FAILED_PRECONDITION": 9,
    "OUT_OF_RANGE": 11,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


@dataclass(frozen=True)
class Outcome:
    """What became of one batch (or a call refused whole): its Status, the message for the
    caller, and when counted (status OK) the reports accepted and whether it was a duplicate."""

    status: Status
    message: str = ""
    accepted: int = 0
    duplicate: bool = False

    @property
    def grpc(self) -> str:
        """The gRPC status name (every outcome of the core has one)."""
        assert self.status.grpc is not None
        return self.status.grpc

    @property
    def counted(self) -> bool:
        """Whether the batch is counted (accepted now or before: a duplicate)."""
        return self.status.grpc == "OK"


class _TooLate(Exception):
    """The batch's slot ended more than max_lateness ago, or every bucket it targets is purged."""


class _Future(Exception):
    """The batch's slot starts after now, beyond one time resolution of clock skew."""


class _Cancelled(Exception):
    """The caller left before its batch was written."""


# The status of an upload refused by an error, by the nearest class of the error's.
_REFUSED: dict[type[Exception], str] = {
    UnknownMetric: "unknown_metric",
    StaleSpec: "stale_spec",
    InvalidBatch: "invalid",
    _Future: "future",
    _TooLate: "too_late",
    _Cancelled: "cancelled",
    StoreUnavailable: "unavailable",
    StoreError: "error",
}
_REFUSABLE: tuple[type[Exception], ...] = tuple(_REFUSED)  # what an upload's checks and write may raise to refuse it


def time_resolution(metric: MetricConfig) -> int:
    """The granularity of made_unix for the metric: the greatest common divisor of its period
    and every time window's span, so that a slot lies in one bucket of every window."""
    return math.gcd(metric.spec.period, *(w.span for w in metric.windows if w.span is not None))


Targets = tuple[tuple[CountsKey, int | None], ...]


@dataclass(frozen=True)
class _View:
    """The metrics served in one epoch (Rounds.epoch), by name, with their time resolutions and
    the specs answer that names them."""

    epoch: tuple
    metrics: dict[str, MetricConfig]
    resolutions: dict[str, int]
    answer: veil_pb2.GetMetricSpecsResponse
    version: str

    @classmethod
    def of(cls, epoch: tuple, metrics: Sequence[MetricConfig], config: AggregatorConfig) -> _View:
        resolutions = {m.name: time_resolution(m) for m in metrics}
        specs = []
        for m in metrics:
            spec = spec_to_proto(m.spec)
            spec.time_resolution_seconds = resolutions[m.name]
            specs.append(spec)
        answer = veil_pb2.GetMetricSpecsResponse(
            specs=specs, max_batch=config.max_batch, max_lateness_seconds=config.max_lateness
        )
        # Names the answer's every field but the clock (specs, budgets, resolutions, max_batch,
        # max_lateness): deterministic serialization, so the same config gives the same version.
        version = hashlib.sha256(answer.SerializeToString(deterministic=True)).hexdigest()[:32]
        answer.specs_version = version
        return cls(epoch, {m.name: m for m in metrics}, resolutions, answer, version)


class Ingest:
    """Checks, targets, writes and answers uploads (see the module docstring). `clock` is the
    time windows go by; `store_down` is True while the daemon's last ping of the store failed:
    uploads are then refused without a store call, which would only time out."""

    def __init__(
        self,
        config: AggregatorConfig,
        store: Store,
        instruments: Instruments,
        clock: Callable[[], float] = time.time,
        store_down: Callable[[], bool] = lambda: False,
        rounds: Rounds | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._store_down = store_down
        self._instruments = instruments
        self._clock = clock
        self._rounds = Rounds(config, store, clock) if rounds is None else rounds
        self._declared = tuple(config.metrics)
        # Every name an upload may carry: the declared metrics and every round of the strings ones.
        self._names = frozenset(m.name for m in config.metrics) | {r for s in config.strings for r in s.round_names}
        self._view_lock = threading.Lock()
        self._view: _View | None = None
        # Per (metric, fingerprint), the targets of the buckets current when last asked: (since, until, targets).
        self._targets: dict[tuple[str, str], tuple[float, float, Targets]] = {}
        self._since_recorded: set[tuple[str, str]] = set()
        self._children: dict[tuple[str, str], tuple] = {}  # Prometheus children per (metric, outcome)
        decode_warm_up()  # the first upload must not wait for numba

    # -- specs ---------------------------------------------------------------------------------

    def _current(self, now: float) -> _View:
        """The metrics served at `now` and their specs answer: the declared ones, and the rounds
        of strings metrics, which change with the period (Rounds.epoch)."""
        epoch = self._rounds.epoch(now)
        view = self._view
        if view is not None and view.epoch == epoch:
            return view
        with self._view_lock:
            if self._view is None or self._view.epoch != epoch:
                self._view = _View.of(epoch, (*self._declared, *self._rounds.current(now)), self._config)
            return self._view

    @property
    def specs_version(self) -> str:
        """The current specs answer's version (docs/protocol.md 1)."""
        return self._current(self._clock()).version

    def specs(self, metrics: Sequence[str] = (), if_version: str = "") -> veil_pb2.GetMetricSpecsResponse:
        """The specs answer (of the named metrics; all when none), or `unchanged` without specs
        when if_version is the current specs_version."""
        now = int(self._clock())
        view = self._current(now)
        if if_version and if_version == view.version:
            return veil_pb2.GetMetricSpecsResponse(specs_version=view.version, unchanged=True, server_time_unix=now)
        answer = veil_pb2.GetMetricSpecsResponse()
        answer.CopyFrom(view.answer)
        if metrics:
            wanted = set(metrics)
            del answer.specs[:]
            answer.specs.extend(s for s in view.answer.specs if s.name in wanted)
        answer.server_time_unix = now
        return answer

    # -- uploads -------------------------------------------------------------------------------

    def upload(self, request: veil_pb2.UploadRequest, active: Callable[[], bool] = lambda: True) -> Outcome:
        """The outcome of one batch (Upload), written alone (the store may group it with others')."""
        started = time.perf_counter()
        try:
            result: bool | Exception = self._store.add(self._batch(request, self._clock(), active))
        except _REFUSABLE as err:
            result = err
        outcome = self._outcome(request, result, started)
        # A refusal's error holds this frame in its traceback, and the frame the request: let
        # go of it, so the request is freed when answered, not by the cyclic collector.
        del result
        return outcome

    def call_refusal(self, requests: Sequence[veil_pb2.UploadRequest]) -> Outcome | None:
        """Why a call of several batches (UploadBatches) is refused whole, before any batch is
        checked: more than MAX_BATCHES batches, none, or more than max_batch reports in all."""
        reports = sum(r.count for r in requests)
        if not requests or len(requests) > MAX_BATCHES or reports > self._config.max_batch:
            return Outcome(
                STATUSES["invalid"],
                f"An upload of several batches carries 1 to {MAX_BATCHES} batches and at most "
                f"{self._config.max_batch} reports in all (server.max_batch); this one has "
                f"{len(requests)} batches and {reports} reports.",
            )
        return None

    def upload_many(
        self, requests: Sequence[veil_pb2.UploadRequest], active: Callable[[], bool] = lambda: True
    ) -> list[Outcome]:
        """The outcome of each batch, as if each had come alone, with the batches that pass their
        checks written in one store call (Store.add_many); a batch id repeated among them is
        counted once (its later copies are duplicates)."""
        started = time.perf_counter()
        now = self._clock()
        results: list[bool | Exception] = [False] * len(requests)
        writes, positions = [], []
        for i, request in enumerate(requests):
            try:
                writes.append(self._batch(request, now, active))
                positions.append(i)
            except _REFUSABLE as err:
                results[i] = err
        for i, result in zip(positions, self._store.add_many(writes) if writes else ()):
            results[i] = result
        outcomes = [self._outcome(request, result, started) for request, result in zip(requests, results)]
        results.clear()  # the errors' tracebacks hold this frame (see upload)
        return outcomes

    def upload_batches(
        self, request: veil_pb2.UploadBatchesRequest, active: Callable[[], bool] = lambda: True
    ) -> veil_pb2.UploadBatchesResponse | Outcome:
        """UploadBatches: each batch's result (upload_many), or the Outcome refusing the call whole."""
        refused = self.call_refusal(request.batches)
        if refused is not None:
            return refused
        return veil_pb2.UploadBatchesResponse(
            results=[
                veil_pb2.BatchResult(
                    code=GRPC_CODES[o.grpc],
                    message="" if o.counted else o.message,
                    accepted=o.accepted,
                    duplicate=o.duplicate,
                )
                for o in self.upload_many(request.batches, active)
            ],
            specs_version=self.specs_version,
        )

    def response(self, outcome: Outcome) -> veil_pb2.UploadResponse:
        """The UploadResponse of a counted batch's outcome."""
        return veil_pb2.UploadResponse(
            accepted=outcome.accepted, duplicate=outcome.duplicate, specs_version=self.specs_version
        )

    def _batch(self, request: veil_pb2.UploadRequest, now: float, active: Callable[[], bool]) -> BatchWrite:
        """The checked batch of an upload, with the buckets it goes to; UnknownMetric, StaleSpec,
        StoreUnavailable (known down: no store call, which would only time out), _Future,
        _TooLate, InvalidBatch, or _Cancelled (its caller no longer `active`)."""
        view = self._current(now)
        metric = view.metrics.get(request.metric)
        if metric is None:
            if self._rounds.owner(request.metric) is not None:
                raise StaleSpec(f"Round {quoted(request.metric)} is not served now; fetch the specs again.")
            raise UnknownMetric(
                f"Metric {quoted(request.metric)} is not declared by this aggregator; fetch the specs again."
            )
        if request.spec_fingerprint != metric.spec.fingerprint:
            raise StaleSpec(f"The batch was randomized under another spec of {metric.name!r}; fetch the specs again.")
        if self._store_down():
            raise StoreUnavailable(_UNAVAILABLE)
        made = self._made(metric, request.made_unix, now, view.resolutions[metric.name])
        if metric.spec.strings is not None and int(made // metric.spec.period) != int(now // metric.spec.period):
            # Its counts chose the next round's parents when its period ended (veil.aggregator.rounds).
            raise StaleSpec(f"Round {metric.name!r} of the period the batch was made in is over; it is not counted.")
        targets = self._targets_at(metric, made, now)
        counts = decode_upload(request, metric.spec, max_reports=self._config.max_batch)
        if not active():
            # The caller gave up (deadline or cancel): write nothing; its retry carries the same id.
            raise _Cancelled
        if (metric.name, metric.spec.fingerprint) not in self._since_recorded:
            # Before the first write of this process: the all-time window's intervals count
            # the periods since counting began (Store.since), never from after a report.
            self._store.since(metric.name, metric.spec.fingerprint, int(min(now, made)))
            self._since_recorded.add((metric.name, metric.spec.fingerprint))
        return BatchWrite(
            metric.name,
            request.batch_id,
            counts,
            targets,
            self._config.dedupe_ttl,
            period=int(made // metric.spec.period),
        )

    def _made(self, metric: MetricConfig, made_unix: int, now: float, resolution: int) -> float:
        """When the batch's reports were made: the start of its slot (made_unix floored to the
        time resolution: a revision-1-era client that sends an exact time is not refused for
        it), or `now` when it does not say (0); _TooLate or _Future outside the accepted span."""
        if made_unix == 0:
            return now
        slot = made_unix // resolution * resolution
        if now > slot + resolution + self._config.max_lateness:
            raise _TooLate(
                f"Too late: the batch was made in the slot starting at {slot} (Unix s), which ended more "
                f"than server.max_lateness ({self._config.max_lateness} s) ago; it is not counted, "
                f"do not retry it."
            )
        if slot > now + resolution:
            raise _Future(
                f"made_unix {made_unix} is a slot starting after the aggregator's clock ({int(now)}) by more "
                f"than one time resolution ({resolution} s); set the device's clock by server_time_unix."
            )
        return slot

    def _targets_at(self, metric: MetricConfig, made: float, now: float) -> Targets:
        """Every window's bucket holding `made`, with its expiry, but those already expired at
        `now` (purged: a late batch never brings one back); _TooLate when none is left. The
        buckets current at `now` are kept per metric and reused until one of them ends."""
        held = self._targets.get((metric.name, metric.spec.fingerprint))
        if held is not None and held[0] <= made < held[1] and held[0] <= now < held[1]:
            return held[2]
        targets = tuple(
            (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(made)[0]), w.expiry(made))
            for w in metric.windows
        )
        spans = [w.bucket(made) for w in metric.windows if w.span is not None]
        since = max((start for start, _ in spans), default=-math.inf)
        until = min((end for _, end in spans), default=math.inf)
        if since <= now < until:
            self._targets[metric.name, metric.spec.fingerprint] = (since, until, targets)
            return targets
        kept = tuple((key, expiry) for key, expiry in targets if expiry is None or expiry > now)
        if not kept:
            raise _TooLate(
                f"Too late: every bucket of {metric.name!r} the batch belongs in has passed its retention; "
                "it is not counted, do not retry it."
            )
        return kept

    def _outcome(self, request: veil_pb2.UploadRequest, result: bool | Exception, started: float) -> Outcome:
        """The batch's outcome (result: whether the store applied it, or why it was refused),
        counted in the instruments and logged."""
        name = request.metric if request.metric in self._names else "(undeclared)"  # bounded label values only
        if isinstance(result, bool):
            status = STATUSES["accepted" if result else "duplicate"]
            outcome = Outcome(status, accepted=request.count, duplicate=not result)
            if result:
                self._counters(name, "accepted")[2].inc(request.count)
        else:
            status = STATUSES[next(_REFUSED[t] for t in type(result).__mro__ if t in _REFUSED)]
            outcome = Outcome(status, status.message or str(result))
            if status is STATUSES["error"]:
                log.error("upload failed in the store", extra={"metric": name}, exc_info=result)
        assert status.label is not None  # every status an ingested batch ends with is counted
        uploads, seconds, _ = self._counters(name, status.label)
        uploads.inc()
        seconds.observe(time.perf_counter() - started)
        if status.grpc != "OK":
            log.info("upload refused", extra={"metric": name, "outcome": status.label, "reports": request.count})
        return outcome

    def _counters(self, name: str, label: str) -> tuple:
        """The Prometheus children of (metric, outcome): uploads, upload seconds, reports."""
        children = self._children.get((name, label))
        if children is None:
            i = self._instruments
            children = (i.uploads.labels(name, label), i.upload_seconds.labels(name), i.reports.labels(name))
            self._children[name, label] = children
        return children
