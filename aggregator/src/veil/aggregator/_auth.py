"""Who may call what: bearer tokens, checked in a gRPC server interceptor before any handler runs.

    Collector/GetMetricSpecs   an upload token (answered with the specs of its metrics only)
                               or a read token (every spec)
    Collector/Upload           an upload token whose metrics include the request's metric
    Estimates/Get, Watch       a read token
    grpc.health.v1, reflection open (probes, grpcurl)

A missing, malformed or unknown token is UNAUTHENTICATED; a known token used for what it does
not grant (a read token uploading, an upload token reading, a metric outside its scope) is
PERMISSION_DENIED. Tokens arrive as `authorization: Bearer <token>` metadata (the HTTP listener
takes the same header). Only SHA-256 digests are kept; a presented token's digest is compared
with every configured digest by hmac.compare_digest, so neither a token's length nor its
position in the config shows in the time taken. Logs, errors and metrics carry a token's
name, never its value.

The interceptor runs on gRPC's polling thread, so it only decides and wraps: the checks that
need the request (that it parses at all, its metric and size) run in the wrapped handler, on the worker
thread, before the servicer, so nothing of a refused call is written. The same wrappers apply
the per-token rate limit, drop uploads whose caller already gave up, bound concurrent Watch
streams, and set `caller()` (the token's name) for the servicer.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
from prometheus_client import CollectorRegistry, Counter

from veil.wire.v1 import veil_pb2

from ._errors import ConfigError
from .config import AuthConfig, TokenConfig, token_digest
from ._ratelimit import RateLimiter
from .decode import UNPARSEABLE, parse_upload

__all__ = ["ANONYMOUS", "AccessInterceptor", "Authenticator", "RETRY_AFTER_KEY", "caller", "rate_limiter",
           "token_limits"]

log = logging.getLogger("veil.aggregator")

ANONYMOUS = TokenConfig("anonymous", "any", b"")
RETRY_AFTER_KEY = "retry-after-ms"

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("veil_caller", default=None)

_OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
         "/grpc.reflection.v1.ServerReflection/")
_SPECS = "/veil.wire.v1.Collector/GetMetricSpecs"
_UPLOAD = "/veil.wire.v1.Collector/Upload"
_READ = frozenset({"/veil.wire.v1.Estimates/Get", "/veil.wire.v1.Estimates/Watch"})
_BEARER = "bearer "
_END = object()  # the end of a stream's responses


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
            raise ConfigError(f"auth: authentication is {state} and a reload cannot turn it "
                              f"{'off' if self.enabled else 'on'}; restart the aggregator for that.")
        self._tokens = tuple(auth.tokens)

    def identify(self, token: str) -> TokenConfig | None:
        digest = token_digest(token)
        found = None
        for candidate in self._tokens:  # every one, whichever matches
            match = hmac.compare_digest(digest, candidate.digest)
            found = candidate if match else found
        return found

    def from_bearer(self, values: list[str]) -> tuple[TokenConfig | None, str]:
        """The token of an `authorization` header or metadata (its every value), or None and
        why not. The reason never repeats what was sent."""
        if not values:
            return None, "No token: send `authorization: Bearer <token>`."
        if len(values) > 1:
            return None, "More than one authorization entry; send one."
        value = values[0]
        if not value[:len(_BEARER)].lower() == _BEARER:
            return None, "The authorization is not a bearer token: send `authorization: Bearer <token>`."
        token = self.identify(value[len(_BEARER):].strip())
        return (token, "") if token else (None, "Unknown token.")


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def token_limits(auth: AuthConfig) -> dict[str, tuple[float, float]]:
    """Each upload token's (rate, burst) by name; with authentication off, the anonymous one's."""
    limits = {t.name: (t.rate_limit, t.rate_burst) for t in auth.of_role("upload")}
    if not auth.enabled:
        limits[ANONYMOUS.name] = (auth.anonymous_rate_limit, auth.anonymous_rate_burst)
    return limits


def rate_limiter(auth: AuthConfig) -> RateLimiter:
    return RateLimiter(token_limits(auth))


def _rebuild(handler: grpc.RpcMethodHandler, wrap: Callable, deserializer: object = ...) -> grpc.RpcMethodHandler:
    """The handler of the same kind with its behaviour wrapped (and maybe another deserializer)."""
    request_deserializer = handler.request_deserializer if deserializer is ... else deserializer
    if handler.request_streaming and handler.response_streaming:
        make, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif handler.request_streaming:
        make, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif handler.response_streaming:
        make, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        make, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
    return make(wrap(behavior), request_deserializer=request_deserializer,
                response_serializer=handler.response_serializer)


class AccessInterceptor(grpc.ServerInterceptor):
    def __init__(self, auth: AuthConfig, *, max_streams: int, registry: CollectorRegistry | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self._auth = Authenticator(auth)
        self._limiter = limiter if limiter is not None else rate_limiter(auth)
        self._streams = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        registry = registry if registry is not None else CollectorRegistry()
        self._refused = Counter("veil_calls_refused", "gRPC calls refused before their handler, by method and code.",
                                ["method", "code"], registry=registry)
        self._admitted = Counter("veil_token_reports", "Reports in uploads admitted past authentication and rate "
                                 "limits (before validation), by token name.", ["token"], registry=registry)
        self._limited = Counter("veil_token_reports_rate_limited", "Reports in uploads refused by the rate limit, "
                                "by token name.", ["token"], registry=registry)

    @property
    def authenticator(self) -> Authenticator:
        return self._auth

    def reload(self, auth: AuthConfig, limits: dict[str, tuple[float, float]]) -> None:
        """Check calls against auth's tokens, and limit them by `limits` (token_limits of this
        process's share), from the next call on; calls in progress finish as they started.
        ConfigError, and nothing changes, when that would turn authentication on or off."""
        self._auth.replace(auth)
        self._limiter.set_limits(limits)

    # -- on the polling thread: decide, wrap, never block ------------------------------------

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if method.startswith(_OPEN):
            return self._bounded(handler, ANONYMOUS) if handler.response_streaming else handler
        if not self._auth.enabled:
            identity = ANONYMOUS
        else:
            values = [m.value for m in handler_call_details.invocation_metadata or ()
                      if m.key == "authorization" and isinstance(m.value, str)]
            identity, problem = self._auth.from_bearer(values)
            if identity is None:
                return self._refuse(handler, method, grpc.StatusCode.UNAUTHENTICATED, problem)
            needed = self._needed(method)
            if needed is None:
                return self._refuse(handler, method, grpc.StatusCode.PERMISSION_DENIED,
                                    f"No token grants {method}.")
            if needed != "any" and identity.role != needed:
                return self._refuse(handler, method, grpc.StatusCode.PERMISSION_DENIED,
                                    f"Token {identity.name!r} is {_a(identity.role)} token; this call needs "
                                    f"{_a(needed)} token.")
        if method == _UPLOAD:
            return _rebuild(handler, lambda behavior: self._upload(behavior, identity), deserializer=parse_upload)
        if method == _SPECS and identity.role == "upload":
            return _rebuild(handler, lambda behavior: self._scoped_specs(behavior, identity))
        if handler.response_streaming:
            return self._bounded(handler, identity)
        return _rebuild(handler, lambda behavior: self._as(behavior, identity))

    @staticmethod
    def _needed(method: str) -> str | None:
        if method == _UPLOAD:
            return "upload"
        if method == _SPECS:
            return "any"
        if method in _READ:
            return "read"
        return None  # a method this table does not know: refused (fail closed)

    def _refuse(self, handler, method: str, code: grpc.StatusCode, message: str):
        self._refused.labels(method, code.name).inc()
        log.debug("call refused", extra={"method": method, "code": code.name})

        def wrap(_behavior):
            def refuse(_request, context):
                context.abort(code, message)
            return refuse

        return _rebuild(handler, wrap, deserializer=None)  # the request is never parsed

    # -- on the worker thread, before the servicer ---------------------------------------------

    def _deny(self, context, method: str, code: grpc.StatusCode, message: str) -> None:
        """Count the refusal and end the call with it (context.abort raises)."""
        self._refused.labels(method, code.name).inc()
        context.abort(code, message)

    @staticmethod
    def _as(behavior, identity: TokenConfig):
        def call(request, context):
            with _calling_as(identity.name):
                return behavior(request, context)
        return call

    def _upload(self, behavior, identity: TokenConfig):
        def upload(request, context):
            if isinstance(request, bytes):
                self._deny(context, _UPLOAD, grpc.StatusCode.INVALID_ARGUMENT, UNPARSEABLE)
            if identity.role == "upload" and request.metric not in identity.metrics:
                self._deny(context, _UPLOAD, grpc.StatusCode.PERMISSION_DENIED,
                           f"Token {identity.name!r} may not report metric {request.metric!r}.")
            if not context.is_active():
                # The caller gave up (deadline or cancel): write nothing; its retry carries the same id.
                self._deny(context, _UPLOAD, grpc.StatusCode.CANCELLED, "The call ended before the batch was counted.")
            wait = self._limiter.take(identity.name, request.count)
            if wait > 0:
                self._limited.labels(identity.name).inc(request.count)
                milliseconds = max(1, math.ceil(wait * 1000))
                rate, burst = self._limiter.limit(identity.name)
                context.set_trailing_metadata(((RETRY_AFTER_KEY, str(milliseconds)),))
                self._deny(context, _UPLOAD, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Rate limit of token {identity.name!r}: {rate:g} reports per second, bursts of "
                           f"{burst:g}; retry after {milliseconds} ms with the same batch id. Nothing was counted.")
            self._admitted.labels(identity.name).inc(request.count)
            with _calling_as(identity.name):
                return behavior(request, context)
        return upload

    def _scoped_specs(self, behavior, identity: TokenConfig):
        def specs(request, context):
            with _calling_as(identity.name):
                response = behavior(request, context)
            return veil_pb2.GetMetricSpecsResponse(specs=[s for s in response.specs if s.name in identity.metrics],
                                                   max_batch=response.max_batch)
        return specs

    def _bounded(self, handler, identity: TokenConfig):
        """A server-streaming call holds a worker thread while it lasts: at most max_streams at once."""
        def wrap(behavior):
            def stream(request, context):
                return self._stream(behavior, request, context, identity.name)
            return stream
        return _rebuild(handler, wrap)

    def _stream(self, behavior, request, context, name: str) -> Iterator:
        """The responses, each computed as `name`, holding one of the stream slots from the first
        response to the end (of the stream, by an error, or by a cancel: gRPC then drops the
        iterator, which closes it). A stream never started never took a slot."""
        if not self._streams.acquire(blocking=False):
            self._deny(context, "(stream)", grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"Too many streams at once (at most {self._max_streams}, server.max_streams); "
                       f"retry later or poll instead.")
        try:
            with _calling_as(name):
                iterator = iter(behavior(request, context))
            while True:
                with _calling_as(name):
                    item = next(iterator, _END)
                if item is _END:
                    return
                yield item
        finally:
            self._streams.release()
