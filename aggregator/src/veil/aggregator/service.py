"""The gRPC servicers: thin translations between the wire and the aggregator's parts.

Errors are translated here, at the boundary: an unknown metric or stale spec is
FAILED_PRECONDITION (the SDK fetches specs again), a malformed batch INVALID_ARGUMENT naming the
report, an unreachable store UNAVAILABLE (retry with the same batch id), anything else INTERNAL.
Logs carry metric names, counts and outcomes: never reports, addresses or tokens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from veil.client import spec_to_proto
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

from ._errors import InvalidBatch, StaleSpec, UnknownMetric
from .config import AggregatorConfig
from .decode import decode_upload
from .instruments import Instruments
from .live import LiveEstimates, WindowEstimate
from .store import BatchWrite, CountsKey, Store, StoreError, StoreUnavailable

__all__ = ["CollectorService", "EstimatesService"]

log = logging.getLogger("veil.aggregator")

_UNAVAILABLE = "The counter store is unavailable; retry with the same batch id."


class CollectorService(veil_pb2_grpc.CollectorServicer):
    def __init__(self, config: AggregatorConfig, store: Store, instruments: Instruments,
                 clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._store = store
        self._instruments = instruments
        self._clock = clock
        self._specs = veil_pb2.GetMetricSpecsResponse(specs=[spec_to_proto(m.spec) for m in config.metrics])

    def GetMetricSpecs(self, request, context):
        if not request.metrics:
            return self._specs
        wanted = set(request.metrics)
        return veil_pb2.GetMetricSpecsResponse(specs=[s for s in self._specs.specs if s.name in wanted])

    def Upload(self, request, context):
        started = time.perf_counter()
        metric = self._config.metric(request.metric)
        name = metric.name if metric else "(undeclared)"  # bounded label values only
        outcome = "error"
        try:
            if metric is None:
                raise UnknownMetric(f"Metric {request.metric!r} is not declared by this aggregator; fetch the specs again.")
            if request.spec_fingerprint != metric.spec.fingerprint:
                raise StaleSpec(f"The batch was randomized under another spec of {metric.name!r}; fetch the specs again.")
            counts = decode_upload(request, metric.spec, max_reports=self._config.max_batch)
            if not context.is_active():
                # The caller gave up (deadline or cancel): write nothing; its retry carries the same id.
                outcome = "cancelled"
                context.abort(grpc.StatusCode.CANCELLED, "The call ended before the batch was counted.")
            now = self._clock()
            targets = tuple(
                (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), w.expiry(now))
                for w in metric.windows
            )
            applied = self._store.add(BatchWrite(metric.name, request.batch_id, counts, targets, self._config.dedupe_ttl))
            outcome = "accepted" if applied else "duplicate"
            if applied:
                self._instruments.reports.labels(name).inc(request.count)
            return veil_pb2.UploadResponse(accepted=request.count, duplicate=not applied)
        except UnknownMetric as err:
            outcome = "unknown_metric"
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except StaleSpec as err:
            outcome = "stale_spec"
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except InvalidBatch as err:
            outcome = "invalid"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except StoreUnavailable:
            outcome = "unavailable"
            context.abort(grpc.StatusCode.UNAVAILABLE, _UNAVAILABLE)
        except StoreError:
            log.exception("upload failed in the store", extra={"metric": name})
            context.abort(grpc.StatusCode.INTERNAL, "The batch could not be counted; nothing of it was counted.")
        finally:
            self._instruments.uploads.labels(name, outcome).inc()
            self._instruments.upload_seconds.labels(name).observe(time.perf_counter() - started)
            if outcome not in ("accepted", "duplicate"):
                log.info("upload refused", extra={"metric": name, "outcome": outcome, "reports": request.count})


class EstimatesService(veil_pb2_grpc.EstimatesServicer):
    def __init__(self, config: AggregatorConfig, live: LiveEstimates, stopping: threading.Event) -> None:
        self._config = config
        self._live = live
        self._stopping = stopping

    def _current(self, request, context) -> list[WindowEstimate]:
        try:
            return self._live.current(request.metric, request.window)
        except UnknownMetric as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        except StoreUnavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "The counter store is unavailable; try again.")

    def Get(self, request, context):
        return to_response(self._current(request, context))

    def Watch(self, request, context) -> Iterator[veil_pb2.EstimatesResponse]:
        interval = max(request.min_interval_seconds, self._config.watch_interval)
        last = None
        while context.is_active() and not self._stopping.is_set():
            current = self._current(request, context)
            marker = [(e.start, e.version) for e in current]
            if marker != last:
                last = marker
                yield to_response(current)
            self._stopping.wait(interval)


def to_response(estimates: list[WindowEstimate]) -> veil_pb2.EstimatesResponse:
    return veil_pb2.EstimatesResponse(estimates=[_to_proto(e) for e in estimates])


def _to_proto(e: WindowEstimate) -> veil_pb2.WindowEstimate:
    body = e.to_json()
    nan = float("nan")
    return veil_pb2.WindowEstimate(
        metric=body["metric"], window=body["window"], start_unix=e.start, end_unix=e.end, n=e.n,
        mechanism=veil_pb2.Mechanism.Value(e.metric.spec.mechanism.name.upper().replace("-", "_")),
        epsilon=e.metric.spec.mechanism.epsilon, spec_fingerprint=e.metric.spec.fingerprint,
        withheld=e.withheld, reason=e.reason,
        categories=[veil_pb2.CategoryEstimate(**{k: nan if v is None else v for k, v in c.items()})
                    for c in body["categories"]],
    )
