"""The gRPC servicers: thin translations between the wire and the aggregator's parts.

Errors are translated here, at the boundary: an unknown metric or stale spec is
FAILED_PRECONDITION (the SDK fetches specs again), a malformed batch INVALID_ARGUMENT naming the
report, an unreachable store UNAVAILABLE (retry with the same batch id), anything else INTERNAL.
Logs carry metric names, counts and outcomes: never reports, addresses or tokens.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import grpc
import numpy as np

from veil.client import spec_to_proto
from veil.mechanism import wire_shape
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

from . import _kernels
from .config import AggregatorConfig, MetricConfig
from .decode import decode_upload
from .decode import warm_up as decode_warm_up
from .errors import InvalidBatch, InvalidRange, StaleSpec, StoreError, StoreUnavailable, UnknownMetric, quoted
from .instruments import Instruments
from .live import LiveEstimates, WindowEstimate, with_group
from .store import BatchWrite, CountsKey, Store, Version

__all__ = [
    "MAX_WATCH_INTERVAL",
    "CollectorService",
    "EstimatesService",
    "Refusal",
    "ResponseCache",
    "add_estimates_to_server",
    "encode_window",
]

log = logging.getLogger("veil.aggregator")

_UNAVAILABLE = "The counter store is unavailable; retry with the same batch id."
MAX_WATCH_INTERVAL = 3600.0  # seconds: a longer WatchRequest.min_interval_seconds is taken as this


@dataclass(frozen=True)
class Refusal:
    """An upload refused: the gRPC status it ends with, and the message for the caller."""

    code: grpc.StatusCode
    message: str


class _Cancelled(Exception):
    """The caller left before its batch was written."""


# An upload's outcome (the veil_uploads label) and status by what refused it (the nearest class
# of the error's); an empty message is the error's own.
_REFUSED: dict[type[Exception], tuple[str, grpc.StatusCode, str]] = {
    UnknownMetric: ("unknown_metric", grpc.StatusCode.FAILED_PRECONDITION, ""),
    StaleSpec: ("stale_spec", grpc.StatusCode.FAILED_PRECONDITION, ""),
    InvalidBatch: ("invalid", grpc.StatusCode.INVALID_ARGUMENT, ""),
    _Cancelled: ("cancelled", grpc.StatusCode.CANCELLED, "The call ended before the batch was counted."),
    StoreUnavailable: ("unavailable", grpc.StatusCode.UNAVAILABLE, _UNAVAILABLE),
    StoreError: ("error", grpc.StatusCode.INTERNAL, "The batch could not be counted; nothing of it was counted."),
}
_REFUSABLE: tuple[type[Exception], ...] = tuple(_REFUSED)  # what an upload's checks and write may raise to refuse it


class CollectorService(veil_pb2_grpc.CollectorServicer):
    def __init__(
        self,
        config: AggregatorConfig,
        store: Store,
        instruments: Instruments,
        clock: Callable[[], float] = time.time,
        store_down: Callable[[], bool] = lambda: False,
    ) -> None:
        self._config = config
        self._store = store
        # True while the daemon's last ping of the store failed: uploads are then refused without
        # a store call, which would only time out (and keep the request alive in its traceback).
        self._store_down = store_down
        self._instruments = instruments
        self._clock = clock
        self._specs = veil_pb2.GetMetricSpecsResponse(
            specs=[spec_to_proto(m.spec) for m in config.metrics], max_batch=config.max_batch
        )
        self._metrics = {m.name: m for m in config.metrics}
        self._targets: dict[str, tuple[float, float, tuple[tuple[CountsKey, int | None], ...]]] = {}
        self._since_recorded: set[str] = set()
        self._children: dict[tuple[str, ...], tuple] = {}  # Prometheus children per (metric, outcome)
        decode_warm_up()  # the first upload must not wait for numba

    def GetMetricSpecs(self, request, context):
        if not request.metrics:
            return self._specs
        wanted = set(request.metrics)
        return veil_pb2.GetMetricSpecsResponse(
            specs=[s for s in self._specs.specs if s.name in wanted], max_batch=self._specs.max_batch
        )

    def Upload(self, request, context):
        started = time.perf_counter()
        try:
            write = self._batch(request, self._clock(), context.is_active)
            result: bool | Exception = self._store.add(write)
        except _REFUSABLE as err:
            result = err
        answer = self._answer(request, result, started)
        # A refusal's error holds this frame in its traceback, and the frame the request: let
        # go of it, so the request is freed when answered, not by the cyclic collector.
        del result
        if isinstance(answer, Refusal):
            context.abort(answer.code, answer.message)
        return answer

    def upload_many(self, requests: Sequence[veil_pb2.UploadRequest]) -> list[veil_pb2.UploadResponse | Refusal]:
        """Upload of each request, as if each had come alone, with the batches that pass their
        checks written in as few store calls as the store can make (Store.add_many): for a
        caller holding several uploads at once."""
        started = time.perf_counter()
        now = self._clock()
        results: list[bool | Exception] = [False] * len(requests)
        writes, positions = [], []
        for i, request in enumerate(requests):
            try:
                writes.append(self._batch(request, now))
                positions.append(i)
            except _REFUSABLE as err:
                results[i] = err
        for i, result in zip(positions, self._store.add_many(writes) if writes else ()):
            results[i] = result
        answers = [self._answer(request, result, started) for request, result in zip(requests, results)]
        results.clear()  # the errors' tracebacks hold this frame (see Upload)
        return answers

    def _batch(
        self, request: veil_pb2.UploadRequest, now: float, active: Callable[[], bool] = lambda: True
    ) -> BatchWrite:
        """The checked batch of an upload, with the buckets it goes to at `now`; UnknownMetric,
        StaleSpec, StoreUnavailable (known down: no store call, which would only time out),
        InvalidBatch, or _Cancelled (its caller no longer `active`) when it is not to be written."""
        metric = self._metrics.get(request.metric)
        if metric is None:
            raise UnknownMetric(
                f"Metric {quoted(request.metric)} is not declared by this aggregator; fetch the specs again."
            )
        if request.spec_fingerprint != metric.spec.fingerprint:
            raise StaleSpec(f"The batch was randomized under another spec of {metric.name!r}; fetch the specs again.")
        if self._store_down():
            raise StoreUnavailable(_UNAVAILABLE)
        counts = decode_upload(request, metric.spec, max_reports=self._config.max_batch)
        if not active():
            # The caller gave up (deadline or cancel): write nothing; its retry carries the same id.
            raise _Cancelled
        if metric.name not in self._since_recorded:
            # Before the first write of this process: the all-time window's intervals count
            # the periods since counting began (Store.since), never from after a report.
            self._store.since(metric.name, metric.spec.fingerprint, int(now))
            self._since_recorded.add(metric.name)
        return BatchWrite(metric.name, request.batch_id, counts, self._targets_at(metric, now), self._config.dedupe_ttl)

    def _answer(
        self, request: veil_pb2.UploadRequest, result: bool | Exception, started: float
    ) -> veil_pb2.UploadResponse | Refusal:
        """The upload's response (result: whether the store applied it) or its refusal (result:
        why not), counted in the instruments and logged as Upload's outcome."""
        metric = self._metrics.get(request.metric)
        name = metric.name if metric else "(undeclared)"  # bounded label values only
        answer: veil_pb2.UploadResponse | Refusal
        if isinstance(result, bool):
            outcome = "accepted" if result else "duplicate"
            answer = veil_pb2.UploadResponse(accepted=request.count, duplicate=not result)
            if result:
                self._counters(name, outcome)[2].inc(request.count)
        else:
            outcome, code, message = next(_REFUSED[t] for t in type(result).__mro__ if t in _REFUSED)
            answer = Refusal(code, message or str(result))
            if outcome == "error":
                log.error("upload failed in the store", extra={"metric": name}, exc_info=result)
        uploads, seconds, _ = self._counters(name, outcome)
        uploads.inc()
        seconds.observe(time.perf_counter() - started)
        if outcome not in ("accepted", "duplicate"):
            log.info("upload refused", extra={"metric": name, "outcome": outcome, "reports": request.count})
        return answer

    def _counters(self, name: str, outcome: str) -> tuple:
        """The Prometheus children of (metric, outcome): uploads, upload seconds, reports."""
        children = self._children.get((name, outcome))
        if children is None:
            i = self._instruments
            children = (i.uploads.labels(name, outcome), i.upload_seconds.labels(name), i.reports.labels(name))
            self._children[name, outcome] = children
        return children

    def _targets_at(self, metric: MetricConfig, now: float) -> tuple[tuple[CountsKey, int | None], ...]:
        """Every window's current bucket of the metric, with its expiry: the same tuple until
        one of the buckets ends (or the clock goes back past one's start)."""
        held = self._targets.get(metric.name)
        if held is not None and held[0] <= now < held[1]:
            return held[2]
        targets = tuple(
            (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), w.expiry(now))
            for w in metric.windows
        )
        spans = [w.bucket(now) for w in metric.windows if w.span is not None]
        since = max((start for start, _ in spans), default=-math.inf)
        until = min((end for _, end in spans), default=math.inf)
        self._targets[metric.name] = (since, until, targets)
        return targets


class EstimatesService(veil_pb2_grpc.EstimatesServicer):
    def __init__(self, config: AggregatorConfig, live: LiveEstimates, stopping: threading.Event) -> None:
        self._config = config
        self._live = live
        self._stopping = stopping
        self._responses = ResponseCache()
        self._lock = threading.Lock()
        self._ended: set[threading.Event] = set()  # one per Watch stream in progress
        warm_up()  # the first Get must not wait for numba

    def _current(self, request, context: grpc.ServicerContext) -> list[WindowEstimate]:
        try:
            return self._live.current(request.metric, request.window)
        except UnknownMetric as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        except StoreUnavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "The counter store is unavailable; try again.")

    def Get(self, request, context):
        current = self._current(request, context)
        if request.group:  # a group is computed per request; the cache keeps the common case
            return self._encode(context, current, list(request.group))
        return self._responses.response((request.metric, request.window), current)

    def Series(self, request, context):
        start, end = request.from_unix or None, request.to_unix or None
        try:
            if request.merged:
                found = [self._live.merged(request.metric, request.window, start, end)]
            else:
                found = self._live.series(request.metric, request.window, start, end)
        except InvalidRange as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except UnknownMetric as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        except StoreUnavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "The counter store is unavailable; try again.")
        return self._encode(context, found, list(request.group))

    @staticmethod
    def _encode(context, estimates: list[WindowEstimate], group: list[str]) -> bytes:
        try:
            if group:
                estimates = [with_group(e, group) for e in estimates]
        except UnknownMetric as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        return b"".join(_field(_ESTIMATES_TAG, encode_window(e)) for e in estimates)

    def Watch(self, request, context) -> Iterator[bytes]:
        asked = request.min_interval_seconds
        if not math.isfinite(asked) or asked < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"min_interval_seconds: expected a number of seconds "
                f"from 0 (at most {MAX_WATCH_INTERVAL:g} is used), got {asked}.",
            )
        interval = max(min(asked, MAX_WATCH_INTERVAL), self._config.watch_interval)
        # Woken when the call ends (a cancel, its deadline) or the aggregator stops: a stream
        # closed between two updates frees its thread and slot at once, not an interval later.
        ended = threading.Event()
        with self._lock:
            self._ended.add(ended)
        try:
            if not context.add_callback(ended.set) or self._stopping.is_set():
                return
            last = None
            while not ended.is_set():
                current = self._current(request, context)
                marker = [(e.start, e.version) for e in current]
                if marker != last:
                    last = marker
                    yield self._responses.response((request.metric, request.window), current)
                ended.wait(interval)
        finally:
            with self._lock:
                self._ended.discard(ended)

    def stop(self) -> None:
        """End every Watch stream now (the aggregator is stopping)."""
        with self._lock:
            for ended in self._ended:
                ended.set()


def add_estimates_to_server(servicer: EstimatesService, server: grpc.Server) -> None:
    """Register the Estimates service as the generated add_EstimatesServicer_to_server does,
    except that its responses are already serialized (ResponseCache): no response serializer."""
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "Get": grpc.unary_unary_rpc_method_handler(
            servicer.Get, request_deserializer=veil_pb2.EstimatesRequest.FromString
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, request_deserializer=veil_pb2.WatchRequest.FromString
        ),
        "Series": grpc.unary_unary_rpc_method_handler(
            servicer.Series, request_deserializer=veil_pb2.SeriesRequest.FromString
        ),
    }
    name = veil_pb2.DESCRIPTOR.services_by_name["Estimates"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


# --- estimates on the wire ----------------------------------------------------------------
#
# A response of k = 1024 categories over 3 windows is some 3000 CategoryEstimate messages:
# built one message at a time it takes longer than the estimates themselves. So the wire bytes
# of the categories are written by one numba kernel from the estimate's arrays (every record a
# prefix that depends only on the label and on how many of its numbers are non-zero, cached per
# label set, then the tagged numbers), and cached per window bucket and version. The bytes are exactly what
# SerializeToString writes for the message the fields describe (tests compare them): fields in
# number order, proto3 defaults (0.0, "", false) left out, an undefined number as NaN.

_NUMBERS = ("estimate", "stderr", "lower", "upper", "projected")  # CategoryEstimate fields 2..6
_NUMBER_TAGS = np.array([(field << 3) | 1 for field in range(2, 7)], np.uint8)  # 64-bit wire type
_CATEGORY_TAG = (11 << 3) | 2  # WindowEstimate.categories: length-delimited
_ESTIMATES_TAG = (1 << 3) | 2  # EstimatesResponse.estimates: length-delimited
_NUMBER_BYTES = 1 + 8  # tag and double


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


class _Prefixes:
    """For each category j and each count c of non-zero numbers, the bytes of its record before
    the numbers (tag, length, label), padded into one array: bytes[c, j, :length[c, j]]."""

    def __init__(self, labels: tuple[str, ...]) -> None:
        label_fields = [_field(0x0A, label.encode()) if label else b"" for label in labels]
        rows = [
            [bytes((_CATEGORY_TAG,)) + _varint(len(f) + _NUMBER_BYTES * c) + f for f in label_fields]
            for c in range(len(_NUMBERS) + 1)
        ]
        width = max(len(b) for row in rows for b in row)
        self.length = np.array([[len(b) for b in row] for row in rows], np.int64)
        self.bytes = np.zeros((len(rows), len(labels), width), np.uint8)
        for c, row in enumerate(rows):
            for j, b in enumerate(row):
                self.bytes[c, j, : len(b)] = np.frombuffer(b, np.uint8)


@functools.lru_cache(maxsize=256)
def _prefixes(labels: tuple[str, ...]) -> _Prefixes:
    return _Prefixes(labels)


def encode_categories(labels: tuple[str, ...], columns: Sequence[np.ndarray]) -> bytes:
    """The repeated WindowEstimate.categories field (field 11) of the categories with these
    labels and the five number columns (estimate, stderr, lower, upper, projected) as
    SerializeToString writes it; a number that is not finite goes as NaN."""
    k = len(labels)
    numbers = np.empty((k, len(_NUMBERS)), np.float64)
    for i, column in enumerate(columns):
        numbers[:, i] = column
    prefixes = _prefixes(labels)
    out = np.empty(k * (prefixes.bytes.shape[2] + _NUMBER_BYTES * len(_NUMBERS)), np.uint8)
    size = _kernels.encode_categories(numbers, _NUMBER_TAGS, prefixes.bytes, prefixes.length, out)
    return out[:size].tobytes()


def warm_up() -> None:
    """Compile, or load from numba's cache, the encoder's kernel and the estimator's
    (EstimatesService does)."""
    encode_categories(("a", "b"), [np.array([0.5, np.nan])] * len(_NUMBERS))
    _kernels.score_intervals(np.zeros((1, 1)), np.zeros(1), np.ones(1), 1.0, 0.5, 2.0, *np.zeros((3, 1, 1)))
    _kernels.simplex_projections(*np.zeros((2, 1, 1)))


def encode_window(e: WindowEstimate) -> bytes:
    """One WindowEstimate message, serialized exactly as the message SerializeToString would."""
    spec = e.metric.spec
    head = veil_pb2.WindowEstimate(
        metric=spec.name,
        window=e.window.name,
        start_unix=e.start,
        end_unix=e.end,
        n=e.n,
        mechanism=cast(veil_pb2.Mechanism, wire_shape(spec.mechanism.name).proto),  # protoc's .pyi: no int
        epsilon=spec.mechanism.epsilon,
        spec_fingerprint=spec.fingerprint,
        withheld=e.withheld,
        reason=e.reason,
    ).SerializeToString()
    group = (
        None
        if e.group is None
        else veil_pb2.GroupEstimate(
            labels=e.group.labels,
            estimate=e.group.estimate,
            stderr=e.group.stderr,
            lower=e.group.lower,
            upper=e.group.upper,
        )
    )
    tail = veil_pb2.WindowEstimate(
        estimand=e.estimand, reports_per_device=e.reports_per_device, period_seconds=spec.period, group=group
    ).SerializeToString()
    if e.estimate is None:
        return head + tail
    est = e.estimate
    assert est.projection is not None  # live estimates are always projected
    # Fields go in number order: 1..10, then 11 (the categories), then 12.. .
    return (
        head + encode_categories(spec.labels, (est.estimate, est.stderr, est.lower, est.upper, est.projection)) + tail
    )


class ResponseCache:
    """Serialized EstimatesResponse messages of recent requests, and each window's encoded
    bytes, reused while the windows' buckets and versions stay the same: a repeated Get with
    unchanged counts costs a dict lookup, and gRPC sends the bytes as they are (see
    add_estimates_to_server). Bounded by the config: one entry per (metric, window) pair and
    one per request shape (metric name or "", window name or ""), names the config declares."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], tuple[int, Version, int, bytes]] = {}
        self._responses: dict[tuple[str, str], tuple[tuple, bytes]] = {}

    def response(self, shape: tuple[str, str], estimates: list[WindowEstimate]) -> bytes:
        marker = tuple((e.metric.name, e.window.name, e.start, e.version, e.reports_per_device) for e in estimates)
        held = self._responses.get(shape)
        if held is not None and held[0] == marker:
            return held[1]
        data = b"".join(self._window(e) for e in estimates)
        self._responses[shape] = (marker, data)
        return data

    def _window(self, e: WindowEstimate) -> bytes:
        key = (e.metric.name, e.window.name)
        held = self._windows.get(key)
        if held is not None and held[:3] == (e.start, e.version, e.reports_per_device):
            return held[3]
        encoded = _field(_ESTIMATES_TAG, encode_window(e))
        self._windows[key] = (e.start, e.version, e.reports_per_device, encoded)
        return encoded
