"""The access policy (_access) in grpcio's server: an interceptor that checks every call before
its handler runs, and ends a refused one with its status (Denied's code, the retry hint as
`retry-after-ms` trailing metadata).

The interceptor runs on gRPC's polling thread, so it only decides and wraps. Every handler it
returns is request-streaming (which the wire does not tell from unary), because grpcio reads a
unary request whole before the handler runs, and a streaming one only when asked. So a call
refused here is answered without its message being read (a tokenless flood of large uploads
costs no memory for their bodies), and every other call reads its requests within the
in-flight bytes budget (_Reading; tokenless health and reflection calls within a budget of
their own), a token within its share of it (_budget: the share rule), each message within
server.read_timeout of being asked for (_calls.ReadDeadlines: a call whose message does not
come is cancelled, freeing its thread and its reservation). An upload's own checks
(_access.Access) run in its wrapped handler, on the worker thread, before the servicer: the
token's upload rate before the message is read, its reservation of the budget, then the
message is read and parsed and the rest of the checks run.

Streams hold a thread while they last, so each kind runs on a pool of its own, with a bound
of its own: Estimates/Watch (server.max_streams) and the tokenless health Watch and
reflection streams (server.max_health_streams). Neither can take the other's slots, nor the
worker threads of unary calls (uploads).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from types import EllipsisType
from typing import NoReturn

import grpc

from ._access import OPEN, RETRY_AFTER_KEY, SPECS, UPLOAD, UPLOAD_BATCHES, UPLOADS, Access, Denied
from ._budget import BUDGET_REFUSAL, BUDGET_RETRY_MS, BUDGET_WAIT, ByteBudget, Reservation
from ._calls import ReadDeadline, ReadDeadlines
from .config import TokenConfig
from .decode import parse_batches, parse_upload

__all__ = ["AccessInterceptor"]

log = logging.getLogger("veil.aggregator")

_DESERIALIZERS = {UPLOAD: parse_upload, UPLOAD_BATCHES: parse_batches}  # of each of _access.UPLOADS
_SPARE_STREAM_THREADS = 2  # per stream kind: they only refuse streams over its limit


def _abort(context: grpc.ServicerContext, denied: Denied) -> NoReturn:
    """End the call with the refusal (context.abort raises)."""
    if denied.retry_after_ms is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(denied.retry_after_ms)),))
    context.abort(grpc.StatusCode[denied.code], denied.message)


@contextmanager
def _answering(context: grpc.ServicerContext) -> Iterator[None]:
    """Inside, a Denied ends the call with its status."""
    try:
        yield
    except Denied as denied:
        _abort(context, denied)


def _rebuild(
    handler: grpc.RpcMethodHandler,
    wrap: Callable,
    deserializer: Callable[[bytes], object] | None | EllipsisType = ...,
    *,
    request_streaming: bool | None = None,
) -> grpc.RpcMethodHandler:
    """The handler of the same kind with its behaviour wrapped (and maybe another deserializer).
    request_streaming=True makes a unary-request handler one that reads its request only when
    the behaviour asks (next on the iterator it gets): grpcio reads a unary request whole
    before the behaviour runs."""
    request_deserializer = handler.request_deserializer if deserializer is ... else deserializer
    streaming_in = handler.request_streaming if request_streaming is None else request_streaming
    behavior = handler.stream_stream or handler.stream_unary or handler.unary_stream or handler.unary_unary
    if streaming_in and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif streaming_in:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        wrap(behavior), request_deserializer=request_deserializer, response_serializer=handler.response_serializer
    )


class _StreamKind:
    """Streams of one kind: at most `limit` at once, each on a thread of the kind's own pool,
    which has threads to spare so that a stream over the limit is refused at once (rather than
    queued behind the ones that hold the slots)."""

    def __init__(self, limit: int, key: str, name: str) -> None:
        self.limit, self.key = limit, key
        self.slots = threading.BoundedSemaphore(limit)
        self.pool = futures.ThreadPoolExecutor(
            max_workers=limit + _SPARE_STREAM_THREADS, thread_name_prefix=f"veil-{name}"
        )


class AccessInterceptor(grpc.ServerInterceptor):
    def __init__(self, access: Access, *, max_streams: int, max_health_streams: int, read_timeout: float) -> None:
        """access: the policy (its budget and token shares too); read_timeout: seconds a call
        has to deliver a message once it is asked for."""
        self._access = access
        # Tokenless reads (health, reflection) have a budget of their own: a flood of them can
        # take neither memory nor the uploads' budget.
        self._open_budget = ByteBudget(access.upload_bytes * max_health_streams)
        self._read_deadlines = ReadDeadlines(read_timeout)
        self._watches = _StreamKind(max_streams, "server.max_streams", "watch")
        self._probes = _StreamKind(max_health_streams, "server.max_health_streams", "health")

    def close(self) -> None:
        """Let the stream pools' threads and the read deadlines' go (the server has stopped: its
        calls have ended)."""
        for kind in (self._watches, self._probes):
            kind.pool.shutdown(wait=False)
        self._read_deadlines.close()

    # -- on the polling thread: decide, wrap, never block ------------------------------------

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if method.startswith(OPEN):
            if handler.response_streaming:
                return self._bounded(handler, self._probes, self._open_budget)
            return self._read_first(handler, lambda behavior: behavior, self._open_budget, None)
        values = [
            m.value
            for m in handler_call_details.invocation_metadata or ()
            if m.key == "authorization" and isinstance(m.value, str)
        ]
        try:
            identity = self._access.identify(method, values)
        except Denied as denied:
            return self._refuse(handler, method, denied)
        if method in UPLOADS:
            return _rebuild(
                handler,
                lambda behavior: self._upload(behavior, identity),
                deserializer=_DESERIALIZERS[method],
                request_streaming=True,
            )
        if handler.response_streaming:
            return self._bounded(handler, self._watches, self._access.budget)
        budget, holder = self._access.budget, self._access.holder(identity.name)
        if method == SPECS and identity.role == "upload":
            return self._read_first(handler, lambda behavior: self._scoped_specs(behavior, identity), budget, holder)
        return self._read_first(handler, lambda behavior: behavior, budget, holder)

    def _refuse(self, handler, method: str, denied: Denied):
        """A handler that answers the refusal without reading the request (see _rebuild)."""
        log.debug("call refused", extra={"method": method, "code": denied.code})

        def wrap(_behavior):
            def refuse(_requests, context):
                _abort(context, denied)

            return refuse

        return _rebuild(handler, wrap, deserializer=None, request_streaming=True)

    def _read_first(self, handler, wrap: Callable, budget: ByteBudget, holder: str | None):
        """A unary-request handler, its behaviour wrapped, whose request is read within the
        budget, as `holder` (see _Reading)."""

        def budgeted(behavior):
            def call(requests, context):
                reading = _Reading(self, Reservation(budget, self._access.upload_bytes, holder), requests, context)
                try:
                    return behavior(reading.one(), context)
                finally:
                    reading.close()

            return call

        return _rebuild(handler, lambda behavior: budgeted(wrap(behavior)), request_streaming=True)

    # -- on the worker thread, before the servicer ---------------------------------------------

    def _upload(self, behavior, identity: TokenConfig):
        def upload(requests, context):
            with _answering(context):
                self._access.take_upload(identity)  # before the message is read
            reading = _Reading(self, self._access.reservation(identity.name), requests, context)
            try:
                with _answering(context):
                    request = self._access.admit_read(identity, reading.one(), context.is_active)
                return behavior(request, context)
            finally:
                reading.close()

        return upload

    @staticmethod
    def _scoped_specs(behavior, identity: TokenConfig):
        def specs(request, context):
            return Access.scoped_specs(behavior(request, context), identity)

        return specs

    def _bounded(self, handler, kind: _StreamKind, budget: ByteBudget):
        """A streaming call of `kind`: on the kind's own threads, at most its limit at once, its
        requests read within the in-flight bytes budget."""
        one = not handler.request_streaming

        def wrap(behavior):
            def stream(requests, context):
                # No share: a kind's streams are at most its limit at once, on threads of its own.
                reading = _Reading(self, Reservation(budget, self._access.upload_bytes, None), requests, context)
                return self._stream(behavior, reading, one, context, kind)

            stream.experimental_thread_pool = kind.pool  # type: ignore[attr-defined]  # grpcio runs the behaviour on this pool
            return stream

        return _rebuild(handler, wrap, request_streaming=True)

    def _stream(self, behavior, reading: _Reading, one: bool, context, kind: _StreamKind) -> Iterator:
        """The responses, holding one of the kind's slots from the first response to the end (of
        the stream, by an error, or by a cancel: gRPC then closes this iterator). A stream never
        started never took a slot, nor read a request."""
        if not kind.slots.acquire(blocking=False):
            self._deny(
                context,
                "(stream)",
                "RESOURCE_EXHAUSTED",
                f"Too many streams at once (at most {kind.limit}, {kind.key}); retry later or poll instead.",
            )
        try:
            yield from behavior(reading.one() if one else reading, context)
        finally:
            reading.close()
            kind.slots.release()

    def _deny(self, context, method: str, code: str, message: str, retry_after_ms: int | None = None) -> NoReturn:
        """Count the refusal (veil_calls_refused) and end the call with it."""
        try:
            self._access.deny(method, code, message, retry_after_ms)
        except Denied as denied:
            _abort(context, denied)


class _Reading:
    """A call's requests, read within the in-flight bytes budget (a Reservation): before each
    read the largest message's size is reserved (waiting up to BUDGET_WAIT, within the call's
    deadline, then RESOURCE_EXHAUSTED; at once when the token holds its share); once read, the
    message keeps its own size until the next read or close(). gRPC reads a request only when
    asked (next), so nothing is read unreserved; a message that does not come within the read
    deadline cancels the call."""

    def __init__(self, interceptor: AccessInterceptor, reservation: Reservation, requests: Iterator, context) -> None:
        self._interceptor, self._reservation = interceptor, reservation
        self._requests, self._context = requests, context

    def __iter__(self) -> _Reading:
        return self

    def __next__(self):
        interceptor, context = self._interceptor, self._context
        if not self._reservation.take(min(BUDGET_WAIT, context.time_remaining() or 0.0)):
            interceptor._deny(context, "(read)", "RESOURCE_EXHAUSTED", BUDGET_REFUSAL, BUDGET_RETRY_MS)
        deadline: ReadDeadline = interceptor._read_deadlines.arm(context.cancel)
        try:
            request = next(self._requests, None)
        finally:
            deadline.disarm()
        if deadline.fired:
            interceptor._deny(
                context,
                "(read)",
                "DEADLINE_EXCEEDED",
                "The call's message did not arrive within server.read_timeout; it was cancelled.",
            )
        size = len(request) if isinstance(request, bytes) else request.ByteSize() if request is not None else 0
        self._reservation.keep(size)
        if request is None:
            self.close()
            raise StopIteration
        return request

    def one(self):
        """The call's one request; INVALID_ARGUMENT when it carried none."""
        request = next(self, None)
        if request is None:
            self._interceptor._deny(self._context, "(read)", "INVALID_ARGUMENT", "The call carried no request message.")
        return request

    def close(self) -> None:
        self._reservation.close()
