"""The gRPC servicers: thin translations between the wire and the aggregator's parts.

The Collector's uploads and specs are the ingest core's (ingest.Ingest): its outcomes carry
their gRPC status (ingest.STATUSES), which the servicer ends the call with. Estimates errors are
translated here, at the boundary: an unknown metric NOT_FOUND, an unreachable store UNAVAILABLE.
Their responses' bytes are written and cached by estimates_wire.
Logs carry metric names, counts and outcomes: never reports, addresses or tokens.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator

import grpc

from veil.wire.v1 import veil_pb2, veil_pb2_grpc

from .config import AggregatorConfig
from .errors import InvalidRange, StoreUnavailable, UnknownMetric
from .estimates_wire import ResponseCache, estimates_field, warm_up
from .ingest import Ingest, Outcome
from .live import LiveEstimates, WindowEstimate, with_group

__all__ = [
    "MAX_WATCH_INTERVAL",
    "CollectorService",
    "EstimatesService",
    "add_estimates_to_server",
]

log = logging.getLogger("veil.aggregator")

MAX_WATCH_INTERVAL = 3600.0  # seconds: a longer WatchRequest.min_interval_seconds is taken as this


class CollectorService(veil_pb2_grpc.CollectorServicer):
    """The Collector over gRPC: an adapter of the ingest core (ingest.Ingest), which checks,
    targets, writes and answers; this translates its outcomes to gRPC statuses."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def GetMetricSpecs(self, request, context):
        return self.ingest.specs(request.metrics, request.if_version)

    def Upload(self, request, context):
        outcome = self.ingest.upload(request, context.is_active)
        if not outcome.counted:
            context.abort(grpc.StatusCode[outcome.grpc], outcome.message)
        return self.ingest.response(outcome)

    def UploadBatches(self, request, context):
        answer = self.ingest.upload_batches(request, context.is_active)
        if isinstance(answer, Outcome):
            context.abort(grpc.StatusCode[answer.grpc], answer.message)
        return answer


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
        return b"".join(estimates_field(e) for e in estimates)

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
                # The spec too: a strings metric's verification round changes with its period.
                marker = [(e.start, e.version, e.metric.spec.fingerprint) for e in current]
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
