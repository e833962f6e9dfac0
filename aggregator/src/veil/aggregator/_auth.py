"""Who may call what: bearer tokens, checked in a gRPC server interceptor before any handler runs.

    Collector/GetMetricSpecs   an upload token (answered with the specs of its metrics only)
                               or a read token (every spec)
    Collector/Upload           an upload token whose metrics include the request's metric
    Collector/UploadBatches    an upload token whose metrics include every batch's metric
    Estimates/Get, Watch, Series  a read token
    grpc.health.v1, reflection open (probes, grpcurl)

A missing, malformed or unknown token is UNAUTHENTICATED; a known token used for what it does
not grant (a read token uploading, an upload token reading, a metric outside its scope) is
PERMISSION_DENIED. Tokens arrive as `authorization: Bearer <token>` metadata (the HTTP listener
takes the same header). Only SHA-256 digests are kept; a presented token's digest is compared
with every configured digest by hmac.compare_digest, so neither a token's length nor its
position in the config shows in the time taken. Logs, errors and metrics carry a token's
name, never its value.

The interceptor runs on gRPC's polling thread, so it only decides and wraps. Every handler it
returns is request-streaming (which the wire does not tell from unary), because grpcio reads a
unary request whole before the handler runs, and a streaming one only when asked. So a call
refused here is answered without its message being read (a tokenless flood of large uploads
costs no memory for their bodies), and every other call reads its requests within the
in-flight bytes budget (_Reading; tokenless health and reflection calls within a budget of
their own), a token within its share of it (_budget: the share rule), each message within
server.read_timeout of being asked for (_calls.ReadDeadlines: a call whose message does not
come is cancelled, freeing its thread and its reservation). An upload's own checks run in its
wrapped handler, on the worker thread, before the servicer, in this order: the token's upload
rate (before the message is read), its reservation of the budget, then the message is read and
parsed; an
undeclared metric goes on to the servicer (FAILED_PRECONDITION, as for every caller), a
declared metric outside the token's scope is PERMISSION_DENIED; then the token's report rate,
charged with the reports the payload holds (decode.reports_held), not the count it claims.
UploadBatches passes the same checks as one upload, with its batches' reports together, one
upload of the upload rate per batch (the rest taken once it is read), and one declared metric
outside the token's scope refusing the whole call.
Nothing of a refused call is written.

Streams hold a thread while they last, so each kind runs on a pool of its own, with a bound
of its own: Estimates/Watch (server.max_streams) and the tokenless health Watch and
reflection streams (server.max_health_streams). Neither can take the other's slots, nor the
worker threads of unary calls (uploads).

With no tokens configured, authentication is off: every call is `anonymous`.

Tokens can be replaced while serving (`AccessInterceptor.reload`, on SIGHUP in `veil serve`): a
call is checked against the tokens of the moment it arrives. Turning authentication on or off
takes a restart, so that no reload can open a server by leaving its tokens out.
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from types import EllipsisType
from typing import NoReturn

import grpc
from prometheus_client import CollectorRegistry, Counter

from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2

from ._budget import ByteBudget
from ._calls import ReadDeadline, ReadDeadlines
from ._ratelimit import RateLimiter
from .config import AuthConfig, TokenConfig, token_digest
from .decode import UNPARSEABLE, parse_batches, parse_upload, reports_held
from .errors import ConfigError, quoted

__all__ = [
    "ANONYMOUS",
    "AccessInterceptor",
    "Authenticator",
    "BUDGET_REFUSAL",
    "BUDGET_RETRY_MS",
    "BUDGET_WAIT",
    "Limits",
    "RETRY_AFTER_KEY",
    "Reservation",
    "caller",
    "token_limits",
]

log = logging.getLogger("veil.aggregator")

ANONYMOUS = TokenConfig("anonymous", "any", b"")
RETRY_AFTER_KEY = "retry-after-ms"

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("veil_caller", default=None)

_OPEN = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_SPECS = "/veil.wire.v1.Collector/GetMetricSpecs"
_UPLOAD = "/veil.wire.v1.Collector/Upload"
_UPLOAD_BATCHES = "/veil.wire.v1.Collector/UploadBatches"
_UPLOADS = {_UPLOAD: parse_upload, _UPLOAD_BATCHES: parse_batches}  # each upload method's deserializer
_READ = frozenset({"/veil.wire.v1.Estimates/Get", "/veil.wire.v1.Estimates/Watch", "/veil.wire.v1.Estimates/Series"})
_BEARER = "bearer "
_END = object()  # the end of a stream's responses
_SPARE_STREAM_THREADS = 2  # per stream kind: they only refuse streams over its limit
# An upload waits this long at most for the in-flight bytes budget, then is refused with this
# message and hint (the HTTP listener's too); one over its token's share is refused at once.
BUDGET_WAIT = 5.0
BUDGET_RETRY_MS = 1000
BUDGET_REFUSAL = (
    "The aggregator is reading as much as its memory allows (server.max_inflight_bytes, of which "
    "one token may hold a quarter); retry (an upload with the same batch id). Nothing was counted."
)

# A token's limits: (reports per second, report burst, uploads per second, upload burst).
Limits = tuple[float, float, float, float]


@contextmanager
def _calling_as(name: str) -> Iterator[None]:
    """Inside, caller() is `name`: the servicer's code runs as the token that called."""
    reset = _CALLER.set(name)
    try:
        yield
    finally:
        _CALLER.reset(reset)


def caller() -> str | None:
    """The name of the token of the call being handled on this thread ("anonymous" with
    authentication off), or None outside a Veil call. For per-token metrics and logs."""
    return _CALLER.get()


class Authenticator:
    """Finds the configured token a presented one matches, in constant time."""

    def __init__(self, auth: AuthConfig) -> None:
        self._tokens = tuple(auth.tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def replace(self, auth: AuthConfig) -> None:
        """Know auth's tokens from now on, instead of the ones before (one assignment: a check
        sees either set whole). ConfigError, and nothing changes, when that would turn
        authentication on or off."""
        if auth.enabled != self.enabled:
            state = "on" if self.enabled else "off"
            raise ConfigError(
                f"auth: authentication is {state} and a reload cannot turn it "
                f"{'off' if self.enabled else 'on'}; restart the aggregator for that."
            )
        self._tokens = tuple(auth.tokens)

    def identify(self, token: str) -> TokenConfig | None:
        digest = token_digest(token)
        found = None
        for candidate in self._tokens:  # every one, whichever matches
            match = hmac.compare_digest(digest, candidate.digest)
            found = candidate if match else found
        return found

    def named(self, name: str) -> TokenConfig | None:
        """The token of this name among those known now (ANONYMOUS with authentication off)."""
        if not self.enabled:
            return ANONYMOUS if name == ANONYMOUS.name else None
        return next((t for t in self._tokens if t.name == name), None)

    def from_bearer(self, values: list[str]) -> tuple[TokenConfig | None, str]:
        """The token of an `authorization` header or metadata (its every value), or None and
        why not. The reason never repeats what was sent."""
        if not values:
            return None, "No token: send `authorization: Bearer <token>`."
        if len(values) > 1:
            return None, "More than one authorization entry; send one."
        value = values[0]
        if not value[: len(_BEARER)].lower() == _BEARER:
            return None, "The authorization is not a bearer token: send `authorization: Bearer <token>`."
        token = self.identify(value[len(_BEARER) :].strip())
        return (token, "") if token else (None, "Unknown token.")


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def token_limits(auth: AuthConfig) -> dict[str, Limits]:
    """Each upload token's limits by name; with authentication off, the anonymous one's."""
    limits = {
        t.name: (t.rate_limit, t.rate_burst, t.upload_rate_limit, t.upload_rate_burst) for t in auth.of_role("upload")
    }
    if not auth.enabled:
        limits[ANONYMOUS.name] = (
            auth.anonymous_rate_limit,
            auth.anonymous_rate_burst,
            auth.anonymous_upload_rate_limit,
            auth.anonymous_upload_rate_burst,
        )
    return limits


def _reports(limits: Mapping[str, Limits]) -> dict[str, tuple[float, float]]:
    return {name: (rate, burst) for name, (rate, burst, _, _) in limits.items()}


def _uploads(limits: Mapping[str, Limits]) -> dict[str, tuple[float, float]]:
    return {name: (rate, burst) for name, (_, _, rate, burst) in limits.items()}


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
    def __init__(
        self,
        auth: AuthConfig,
        *,
        metrics: Mapping[str, MetricSpec],
        max_streams: int,
        max_health_streams: int,
        upload_bytes: int,
        budget: ByteBudget,
        read_timeout: float,
        limits: Mapping[str, Limits] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """metrics: the declared metrics' specs by name; upload_bytes: what each upload reserves
        of the budget (the largest valid upload); budget: with its share per token (_budget);
        read_timeout: seconds a call has to deliver a message once it is asked for;
        limits: token_limits of this process's share."""
        self._auth = Authenticator(auth)
        limits = token_limits(auth) if limits is None else limits
        self._report_limiter = RateLimiter(_reports(limits))
        self._upload_limiter = RateLimiter(_uploads(limits))
        self._metrics = dict(metrics)
        self._upload_bytes = upload_bytes
        self._budget = budget
        # Tokenless reads (health, reflection) have a budget of their own: a flood of them can
        # take neither memory nor the uploads' budget.
        self._open_budget = ByteBudget(upload_bytes * max_health_streams)
        self._read_deadlines = ReadDeadlines(read_timeout)
        self._watches = _StreamKind(max_streams, "server.max_streams", "watch")
        self._probes = _StreamKind(max_health_streams, "server.max_health_streams", "health")
        registry = registry if registry is not None else CollectorRegistry()
        self._refused = Counter(
            "veil_calls_refused",
            "gRPC calls refused before their handler, by method and code.",
            ["method", "code"],
            registry=registry,
        )
        self._admitted = Counter(
            "veil_token_reports",
            "Reports in uploads admitted past authentication and rate limits (before validation), by token name.",
            ["token"],
            registry=registry,
        )
        self._limited = Counter(
            "veil_token_reports_rate_limited",
            "Reports in uploads refused by the rate limit, by token name.",
            ["token"],
            registry=registry,
        )

    @property
    def authenticator(self) -> Authenticator:
        return self._auth

    def reload(self, auth: AuthConfig, limits: Mapping[str, Limits]) -> None:
        """Check calls against auth's tokens, and limit them by `limits` (token_limits of this
        process's share), from the next call on; calls in progress finish as they started.
        ConfigError, and nothing changes, when that would turn authentication on or off."""
        self._auth.replace(auth)
        self._report_limiter.set_limits(_reports(limits))
        self._upload_limiter.set_limits(_uploads(limits))

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
        if method.startswith(_OPEN):
            if handler.response_streaming:
                return self._bounded(handler, ANONYMOUS, self._probes, self._open_budget)
            return self._read_first(handler, lambda behavior: behavior, self._open_budget, None)
        values = [
            m.value
            for m in handler_call_details.invocation_metadata or ()
            if m.key == "authorization" and isinstance(m.value, str)
        ]
        identity, code, problem = self._identify(method, values)
        if identity is None:
            return self._refuse(handler, method, code, problem)
        if method in _UPLOADS:
            return _rebuild(
                handler,
                lambda behavior: self._upload(behavior, identity),
                deserializer=_UPLOADS[method],
                request_streaming=True,
            )
        if handler.response_streaming:
            return self._bounded(handler, identity, self._watches, self._budget)
        holder = self._holder(identity.name)
        if method == _SPECS and identity.role == "upload":
            return self._read_first(
                handler, lambda behavior: self._scoped_specs(behavior, identity), self._budget, holder
            )
        return self._read_first(handler, lambda behavior: self._as(behavior, identity), self._budget, holder)

    def _identify(self, method: str, authorization: list[str]) -> tuple[TokenConfig | None, grpc.StatusCode, str]:
        """Who calls `method` with these authorization values, or None with the refusal's code
        and message."""
        if not self._auth.enabled:
            return ANONYMOUS, grpc.StatusCode.OK, ""
        identity, problem = self._auth.from_bearer(authorization)
        if identity is None:
            return None, grpc.StatusCode.UNAUTHENTICATED, problem
        needed = self._needed(method)
        if needed is None:
            return None, grpc.StatusCode.PERMISSION_DENIED, f"No token grants {method}."
        if needed != "any" and identity.role != needed:
            return (
                None,
                grpc.StatusCode.PERMISSION_DENIED,
                (f"Token {identity.name!r} is {_a(identity.role)} token; this call needs {_a(needed)} token."),
            )
        return identity, grpc.StatusCode.OK, ""

    # -- calls outside grpcio's server (HTTP): the same checks ----------------------------------

    def admit_upload_unread(self, authorization: list[str], context, *, batches: bool = False) -> str:
        """An upload arriving outside grpcio's server (Upload, or UploadBatches with `batches`),
        before its body is read: its token and one upload of its upload rate, as over gRPC
        (refusals end in context.abort). The token's name, for reservation() and admit_upload."""
        return self.admit_unread(_UPLOAD_BATCHES if batches else _UPLOAD, authorization, context)

    def admit_upload(self, behavior, name: str, request, context, *, batches: bool = False):
        """The rest of that upload, once its body is read (`request` parsed, or its bytes when it
        does not parse), as token `name`: the scope of every batch's metric, the report rate
        (and for UploadBatches one upload per further batch), then `behavior`."""
        return self.admit_read(behavior, _UPLOAD_BATCHES if batches else _UPLOAD, name, request, context)

    def reservation(self, name: str) -> Reservation:
        """The in-flight budget for a body token `name` reads (its share, see _budget)."""
        return Reservation(self._budget, self._upload_bytes, self._holder(name))

    def admit_specs(self, behavior, authorization: list[str], request, context):
        """GetMetricSpecs arriving outside grpcio's server: an upload token sees the specs of its
        metrics only."""
        return self.admit_read(behavior, _SPECS, self.admit_unread(_SPECS, authorization, context), request, context)

    def admit_unread(self, method: str, authorization: list[str], context) -> str:
        """The checks of a call (Upload or GetMetricSpecs) before its message is read: its token,
        and for an upload one of the token's upload rate. The token's name, for admit_read."""
        identity, code, problem = self._identify(method, authorization)
        if identity is None:
            self._deny(context, method, code, problem)
        if method in _UPLOADS:
            self._take_upload(identity, context)
        return identity.name

    def admit_read(self, behavior, method: str, name: str, request, context):
        """The rest, once the message is read, as the token admit_unread named (UNAUTHENTICATED
        when a reload has withdrawn it meanwhile), then `behavior`."""
        identity = self._auth.named(name)
        if identity is None:
            self._deny(context, method, grpc.StatusCode.UNAUTHENTICATED, f"Token {name!r} was withdrawn by a reload.")
        if method in _UPLOADS:
            return self._admit(behavior, request, context, identity)
        if identity.role == "upload":
            return self._scoped_specs(behavior, identity)(request, context)
        return self._as(behavior, identity)(request, context)

    def _holder(self, name: str) -> str | None:
        """Whose share of the budget a call of token `name` takes: none with authentication off,
        where callers cannot be told apart (_budget)."""
        return name if self._auth.enabled else None

    def _read_first(self, handler, wrap: Callable, budget: ByteBudget, holder: str | None):
        """A unary-request handler, its behaviour wrapped, whose request is read within the
        budget, as `holder` (see _Reading)."""

        def budgeted(behavior):
            def call(requests, context):
                reading = _Reading(self, Reservation(budget, self._upload_bytes, holder), requests, context)
                try:
                    return behavior(reading.one(), context)
                finally:
                    reading.close()

            return call

        return _rebuild(handler, lambda behavior: budgeted(wrap(behavior)), request_streaming=True)

    @staticmethod
    def _needed(method: str) -> str | None:
        if method in _UPLOADS:
            return "upload"
        if method == _SPECS:
            return "any"
        if method in _READ:
            return "read"
        return None  # a method this table does not know: refused (fail closed)

    def _refuse(self, handler, method: str, code: grpc.StatusCode, message: str):
        """A handler that answers `code` without reading the request (see _rebuild)."""
        self._refused.labels(method, code.name).inc()
        log.debug("call refused", extra={"method": method, "code": code.name})

        def wrap(_behavior):
            def refuse(_requests, context):
                context.abort(code, message)

            return refuse

        return _rebuild(handler, wrap, deserializer=None, request_streaming=True)

    # -- on the worker thread, before the servicer ---------------------------------------------

    def _deny(self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, message: str) -> NoReturn:
        """Count the refusal and end the call with it (context.abort raises)."""
        self._refused.labels(method, code.name).inc()
        context.abort(code, message)

    def _rate_limited(self, context: grpc.ServicerContext, wait: float, what: str) -> NoReturn:
        """Refuse an upload over a rate limit, with the retry hint (context.abort raises)."""
        milliseconds = max(1, math.ceil(wait * 1000))
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(milliseconds)),))
        self._deny(
            context,
            _UPLOAD,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what}; retry after {milliseconds} ms with the same batch id. Nothing was counted.",
        )

    @staticmethod
    def _as(behavior, identity: TokenConfig):
        def call(request, context):
            with _calling_as(identity.name):
                return behavior(request, context)

        return call

    def _upload(self, behavior, identity: TokenConfig):
        def upload(requests, context):
            self._take_upload(identity, context)  # before the message is read
            reading = _Reading(self, self.reservation(identity.name), requests, context)
            try:
                return self._admit(behavior, reading.one(), context, identity)
            finally:
                reading.close()

        return upload

    def _take_upload(self, identity: TokenConfig, context, n: int = 1) -> None:
        """n uploads of the token's upload rate, or the refusal with its retry hint."""
        name = identity.name
        wait = self._upload_limiter.take(name, n)
        if wait > 0:
            limit = self._upload_limiter.limit(name)
            assert limit is not None  # a wait comes from a limit
            rate, burst = limit
            self._rate_limited(
                context, wait, f"Upload rate limit of token {name!r}: {rate:g} uploads per second, bursts of {burst:g}"
            )

    def _admit(self, behavior, request, context, identity: TokenConfig):
        """The upload's checks once its message is read (an UploadRequest, or an
        UploadBatchesRequest whose batches are checked together), then the servicer."""
        if isinstance(request, bytes):
            self._deny(context, _UPLOAD, grpc.StatusCode.INVALID_ARGUMENT, UNPARSEABLE)
        batches = request.batches if isinstance(request, veil_pb2.UploadBatchesRequest) else (request,)
        if len(batches) > 1:
            # Each batch leaves its id in the store: the call's first was taken before reading.
            self._take_upload(identity, context, len(batches) - 1)
        name = identity.name
        for batch in batches:
            if identity.role == "upload" and batch.metric in self._metrics and batch.metric not in identity.metrics:
                self._deny(
                    context,
                    _UPLOAD,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"Token {name!r} may not report metric {quoted(batch.metric)}.",
                )
        if not context.is_active():
            # The caller gave up (deadline or cancel): write nothing; its retry carries the same id.
            self._deny(context, _UPLOAD, grpc.StatusCode.CANCELLED, "The call ended before the batch was counted.")
        held = sum(reports_held(batch, self._metrics.get(batch.metric)) for batch in batches)
        wait = self._report_limiter.take(name, held)
        if wait > 0:
            self._limited.labels(name).inc(held)
            limit = self._report_limiter.limit(name)
            assert limit is not None  # a wait comes from a limit
            rate, burst = limit
            self._rate_limited(
                context, wait, f"Rate limit of token {name!r}: {rate:g} reports per second, bursts of {burst:g}"
            )
        self._admitted.labels(name).inc(held)
        with _calling_as(name):
            return behavior(request, context)

    def _scoped_specs(self, behavior, identity: TokenConfig):
        def specs(request, context):
            with _calling_as(identity.name):
                response = behavior(request, context)
            scoped = veil_pb2.GetMetricSpecsResponse()
            scoped.CopyFrom(response)  # the version, clock and limits as they are
            del scoped.specs[:]
            scoped.specs.extend(s for s in response.specs if s.name in identity.metrics)
            return scoped

        return specs

    def _bounded(self, handler, identity: TokenConfig, kind: _StreamKind, budget: ByteBudget):
        """A streaming call of `kind`: on the kind's own threads, at most its limit at once, its
        requests read within the in-flight bytes budget."""
        one = not handler.request_streaming

        def wrap(behavior):
            def stream(requests, context):
                # No share: a kind's streams are at most its limit at once, on threads of its own.
                reading = _Reading(self, Reservation(budget, self._upload_bytes, None), requests, context)
                return self._stream(behavior, reading, one, context, identity.name, kind)

            stream.experimental_thread_pool = kind.pool  # type: ignore[attr-defined]  # grpcio runs the behaviour on this pool
            return stream

        return _rebuild(handler, wrap, request_streaming=True)

    def _stream(self, behavior, reading: _Reading, one: bool, context, name: str, kind: _StreamKind) -> Iterator:
        """The responses, each computed as `name`, holding one of the kind's slots from the first
        response to the end (of the stream, by an error, or by a cancel: gRPC then drops the
        iterator, which closes it). A stream never started never took a slot, nor read a request."""
        if not kind.slots.acquire(blocking=False):
            self._deny(
                context,
                "(stream)",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Too many streams at once (at most {kind.limit}, {kind.key}); retry later or poll instead.",
            )
        try:
            with _calling_as(name):
                iterator = iter(behavior(reading.one() if one else reading, context))
            while True:
                with _calling_as(name):
                    item = next(iterator, _END)
                if item is _END:
                    return
                yield item
        finally:
            reading.close()
            kind.slots.release()


class Reservation:
    """A call's bytes of the in-flight budget, as its holder (_budget): take() the largest
    message's size before a read, keep() the message's own size once it is read, close() when
    the call is answered."""

    def __init__(self, budget: ByteBudget, largest: int, holder: str | None) -> None:
        self._budget, self._largest, self._holder = budget, largest, holder
        self._held = 0

    def take(self, timeout: float) -> bool:
        """The largest message's size (after letting go of what was held), or False: none free
        within the timeout, or the holder at its share (at once)."""
        self.close()
        if not self._budget.reserve(self._largest, timeout, self._holder):
            return False
        self._held = self._largest
        return True

    def keep(self, size: int) -> None:
        self._release(self._held - min(size, self._held))

    def _release(self, n: int) -> None:
        self._held -= n
        self._budget.release(n, self._holder)

    def close(self) -> None:
        self._release(self._held)


class _Reading:
    """A call's requests, read within the in-flight bytes budget (a Reservation): before each
    read the largest message's size is reserved (waiting up to BUDGET_WAIT, within the call's
    deadline, then RESOURCE_EXHAUSTED; at once when the token holds its share); once read, the
    message keeps its own size until the next read or close(). gRPC reads a request only when
    asked (next), so nothing is read unreserved; a message that does not come within the read
    deadline cancels the call."""

    def __init__(self, access: AccessInterceptor, reservation: Reservation, requests: Iterator, context) -> None:
        self._access, self._reservation, self._requests, self._context = access, reservation, requests, context

    def __iter__(self) -> _Reading:
        return self

    def __next__(self):
        access, context = self._access, self._context
        if not self._reservation.take(min(BUDGET_WAIT, context.time_remaining() or 0.0)):
            context.set_trailing_metadata(((RETRY_AFTER_KEY, str(BUDGET_RETRY_MS)),))
            access._deny(context, "(read)", grpc.StatusCode.RESOURCE_EXHAUSTED, BUDGET_REFUSAL)
        deadline: ReadDeadline = access._read_deadlines.arm(context.cancel)
        try:
            request = next(self._requests, None)
        finally:
            deadline.disarm()
        if deadline.fired:
            access._deny(
                context,
                "(read)",
                grpc.StatusCode.DEADLINE_EXCEEDED,
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
            self._access._deny(
                self._context, "(read)", grpc.StatusCode.INVALID_ARGUMENT, "The call carried no request message."
            )
        return request

    def close(self) -> None:
        self._reservation.close()
