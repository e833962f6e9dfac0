"""The HTTP listener: estimates as JSON, Prometheus metrics, and a health probe.

    GET /v1/specs[?metric=m]              the metric specs (Collector/GetMetricSpecs)
    POST /v1/upload                       a batch of reports (Collector/Upload; docs/protocol.md)
    POST /v1/uploads                      several batches (Collector/UploadBatches)
    GET /v1/estimates                     every metric and window
    GET /v1/estimates/{metric}?window=1h  one metric (and window); &group=a,b or &top=10 (_queries)
    GET /v1/series/{metric}?window=1h     its retained buckets (&from, &to, &last, &merged, &group)
    GET /metrics                          Prometheus text format
    GET /healthz                          200 when the store answers, 503 otherwise
    GET /                                 the dashboard (pages passed in by the daemon)

aiohttp on an asyncio loop in a thread of its own: a connection costs a file descriptor and a
few kilobytes, never a thread, so slow clients hold up no one. HTTP/1.1 with keep-alive, HEAD
on every route, gzip when the client asks (Accept-Encoding). The limits:

- at most `max_connections` connections at once (TLS handshakes included). A connection
  accepted beyond them closes the one that has waited longest for its next request (slow
  clients go first, and a new client is served whatever slow ones hold); when every
  connection is being answered, the new one is closed instead;
- `request_timeout` seconds for each request: from the connection's start (its TLS handshake
  included), or from the start of the previous answer, until the request's headers and body
  are in, and for the answer to be read; a connection that misses it is closed (keep-alive
  idles likewise, and so do clients that stall or never read their answer). A connection
  half-closed in the middle of a body is closed at once (its request can never be whole);
  one half-closed after its request still gets the answer;
- an upload's body is read only once its token and upload rate are checked, within the
  in-flight bytes budget (_budget: its token's share of it); without room it is refused at
  once with 429 and Retry-After, unread. A refusal before the body closes the connection
  after the answer, so its body is never read;
- request lines and headers of at most 8 KiB each (aiohttp's limits).

The routes' work (reading the store, computing estimates) runs on a small thread pool, never
on the loop; only a current conditional specs check (304: a token check) is answered on it.
Requests are not logged, with addresses or otherwise.

With TLS (ServerTls) every connection is HTTPS (and must present a client certificate from the
client CA under mutual TLS); each handshake takes the current files (ServerTls reloads them when
they change). With tokens configured, /v1/estimates and /metrics need `Authorization: Bearer
<read token>` (401 with WWW-Authenticate when missing or unknown, 403 for a token that is not a
read token); /healthz and the dashboard's static pages stay open.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import threading
import weakref
from collections.abc import Callable
from concurrent import futures
from urllib.parse import parse_qs, unquote

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ._http_collector import UPLOAD_PATHS
from ._queries import estimates_answer, series_answer
from .live import LiveEstimates

__all__ = ["HttpListener", "Page"]

log = logging.getLogger("veil.aggregator")

# Extra routes (e.g. the dashboard) register here: path -> (content type, body factory).
Page = Callable[[], bytes]

_ROUTE_THREADS = 4  # threads that answer requests (store reads, estimates); requests beyond wait their turn
_GZIP_AT_LEAST = 1024  # bytes: smaller bodies go as they are
_SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    # Nothing here is to be framed or sniffed into another type. (The dashboard's own page
    # carries the rest of its policy in a <meta> tag; frame-ancestors only works as a header.)
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Server": "veil",
}


class HttpListener:
    """Serves the routes above on a thread of its own. The socket is bound when it is made
    (an OSError then), served from start() to stop()."""

    def __init__(
        self,
        address: str,
        live: LiveEstimates,
        registry,
        healthy: Callable[[], bool],
        pages: dict[str, tuple[str, Page]] | None = None,
        *,
        tls=None,
        authenticator=None,
        max_connections: int = 256,
        request_timeout: float = 10.0,
        collector=None,
        upload_bytes: int = 0,
        cors_origins: tuple[str, ...] = (),
    ) -> None:
        host, _, port = address.rpartition(":")
        self._socket = socket.create_server(
            (host.strip("[]"), int(port)), backlog=128, family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self._routes = _Routes(live, registry, healthy, dict(pages or {}), authenticator)
        self._collector = collector  # _http_collector.HttpCollector, or None: no upload routes
        self._body_limit = max(64 << 10, upload_bytes)
        self._cors_origins = frozenset(cors_origins)
        self._tls = tls
        self._max_connections = max_connections
        self._timeout = request_timeout
        self._loop = asyncio.new_event_loop()
        self._pool = futures.ThreadPoolExecutor(max_workers=_ROUTE_THREADS, thread_name_prefix="veil-http")
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._waiting: dict[_Connection, None] = {}  # waiting for a request, longest-waiting first
        self._by_transport: dict[object, _Connection] = {}
        self._server: asyncio.Server | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="veil-http", daemon=True)

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    @property
    def connections(self) -> int:
        """Connections open now (for tests and metrics)."""
        return len(self._connections)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._socket.close()
        self._pool.shutdown(wait=False)

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._deadline], client_max_size=self._body_limit)
        app.router.add_route("*", "/{path:.*}", self._answer)
        # access_log=None: nothing logged per request (no addresses); keepalive_timeout: idle
        # connections are closed by our deadline first, this is the library's backstop.
        runner = self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            logger=_ProtocolLog(log, {}),
            keepalive_timeout=self._timeout,
            max_line_size=8190,
            max_field_size=8190,
        )
        await runner.setup()
        server = runner.server
        assert server is not None  # made by setup(); the listener closes before the runner is cleaned up
        self._server = await self._loop.create_server(
            lambda: _Connection(self, server()),
            sock=self._socket,
            ssl=self._ssl_context(),
            ssl_handshake_timeout=self._timeout if self._tls is not None else None,
        )

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
        if self._runner is not None:
            await self._runner.cleanup()

    def _ssl_context(self):
        """A context whose every handshake switches to ServerTls's current one (reloaded files)."""
        if self._tls is None:
            return None
        context = self._tls.ssl_context()
        tls = self._tls

        def current(ssl_object, _server_name, _context) -> None:
            ssl_object.context = tls.ssl_context()

        context.sni_callback = current  # called for every handshake, with or without SNI
        return context

    def _cors(self, request: web.Request) -> dict[str, str]:
        """The CORS headers for a request from one of [server] cors_origins (none for another)."""
        origin = request.headers.get("Origin", "")
        if origin not in self._cors_origins:
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Vary": "Origin",
            "Access-Control-Expose-Headers": "retry-after-ms, Retry-After, ETag",
        }

    @web.middleware
    async def _deadline(self, request: web.Request, handler):
        """No deadline while a request is being answered, once its body is in (see _upload); the
        next starts when the answer does."""
        connection = self._by_transport.get(request.transport)
        if connection is not None:
            connection.started(request)
        try:
            return await handler(request)
        finally:
            if connection is not None:
                connection.waiting()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path.rstrip("/")
        authorization = request.headers.getall("Authorization", [])
        collector_route = self._collector is not None and path in (*UPLOAD_PATHS, "/v1/specs")
        cors = self._cors(request) if collector_route else {}
        unread = False  # a body left unread: the connection closes after the answer
        if collector_route and request.method == "OPTIONS":  # a browser's CORS preflight
            status, content_type, body, headers = (
                204,
                "text/plain",
                b"",
                {
                    **cors,
                    "Access-Control-Allow-Methods": "GET, POST",
                    "Access-Control-Max-Age": "600",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept, If-None-Match",
                }
                if cors
                else {},
            )
        elif self._collector is not None and path in UPLOAD_PATHS and request.method == "POST":
            (status, content_type, body, headers), unread = await self._upload(request, path, authorization)
        elif self._collector is not None and path == "/v1/specs" and request.method in ("GET", "HEAD"):
            if_none_match = request.headers.get("If-None-Match", "")
            specs = functools.partial(
                self._collector.specs,
                authorization,
                request.query.getall("metric", []),
                request.headers.get("Accept", ""),
                if_none_match,
            )
            if self._collector.current(if_none_match):  # a device's daily check: a 304 costs no thread hand-off
                status, content_type, body, headers = specs()
            else:
                status, content_type, body, headers = await self._loop.run_in_executor(self._pool, specs)
        elif request.method not in ("GET", "HEAD"):
            status, content_type, body, headers = _json(
                405, {"error": "Only GET and HEAD are served here."}, {"Allow": "GET, HEAD"}
            )
        else:
            status, content_type, body, headers = await self._loop.run_in_executor(
                self._pool,
                self._routes.answer,
                request.rel_url.raw_path,
                request.rel_url.raw_query_string,
                authorization,
            )
        if collector_route and status != 204:
            headers = {**headers, **cors}
        response = web.Response(
            status=status,
            body=body,
            content_type=None,
            headers={**_SECURITY_HEADERS, **headers, "Content-Type": content_type},
        )
        if len(body) >= _GZIP_AT_LEAST:
            response.headers["Vary"] = "Accept-Encoding"
            if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
                response.enable_compression(web.ContentCoding.gzip)
        if unread:
            response.force_close()  # rather than read (and throw away) a body refused unread
        return response

    async def _upload(
        self, request: web.Request, path: str, authorization: list[str]
    ) -> tuple[tuple[int, str, bytes, dict], bool]:
        """POST of one of UPLOAD_PATHS: its media type, token and upload rate (headers only), then
        its body, read within the in-flight budget and the request's deadline, then the upload on
        a route thread. The answer, and whether it left the body unread."""
        collector = self._collector
        assert collector is not None  # the route exists only with a collector
        content_type = request.headers.get("Content-Type", "")
        name, refusal = collector.admit(path, authorization, content_type)
        if refusal is not None:
            return refusal, True
        reservation = collector.reservation(name)
        if not reservation.take(0.0):  # never waits: a waiting body would hold its connection's bytes
            return collector.budget_refusal(), True
        try:
            try:
                body = await request.read()  # at most client_max_size; within the deadline
            except web.HTTPRequestEntityTooLarge:
                return collector.oversize(self._body_limit), True
            reservation.keep(len(body))
            connection = self._by_transport.get(request.transport)
            if connection is not None:
                connection.answering()
            answer = await self._loop.run_in_executor(self._pool, collector.upload, path, name, content_type, body)
            return answer, False
        finally:
            reservation.close()


class _Connection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, with the connection limit and the deadline
    around it. Counted from its accept (before a TLS handshake) until it is lost or dropped."""

    def __init__(self, listener: HttpListener, inner: asyncio.Protocol) -> None:
        self._listener = listener
        self._inner = inner
        self._transport: asyncio.Transport | None = None  # a stream protocol's
        self._timer: asyncio.TimerHandle | None = None
        self._body: web.BaseRequest | None = None  # a request whose body is due (within the deadline)
        self._ended = False  # the client half-closed: no more bytes will come
        self._refused = False
        if len(listener._connections) >= listener._max_connections:
            if listener._waiting:
                next(iter(listener._waiting)).abort()  # the one waiting longest makes room
            else:
                self._refused = True
        listener._connections.add(self)

    def connection_made(self, transport) -> None:
        self._transport = transport
        if self._refused:
            self._listener._connections.discard(self)
            transport.abort()
            return
        self._listener._by_transport[transport] = self
        self.waiting()
        self._inner.connection_made(transport)

    def started(self, request: web.BaseRequest) -> None:
        """A request's headers are in. Answered from now on when its body is in too; otherwise its
        body stays due within the same deadline (the route calls answering() once it is read)."""
        if request.content.is_eof():
            self.answering()
        elif self._ended:
            self.abort()  # half-closed before its body was whole: it never will be
        else:
            self._body = request

    def waiting(self) -> None:
        """The next request's headers (and the answer being read) are due within the timeout."""
        self.answering()
        if self not in self._listener._connections:
            return  # closed while its request was handled (aborted, or lost): nothing is due
        self._listener._waiting[self] = None
        self._timer = self._listener._loop.call_later(self._listener._timeout, self.abort)

    def answering(self) -> None:
        self._body = None
        self._listener._waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        self.answering()
        self._listener._connections.discard(self)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool:
        self._ended = True
        if self._body is not None and not self._body.content.is_eof():
            self.abort()  # half-closed in the middle of a body: aiohttp would wait for the rest forever
            return False
        self._inner.eof_received()
        # Half-closed after its request, a client still gets the answer; an idle one waits for the
        # deadline, or for a new connection to make room (it is among the waiting).
        return True

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.answering()
        self._listener._connections.discard(self)
        self._listener._by_transport.pop(self._transport, None)
        if not self._refused:
            self._inner.connection_lost(exc)


class _ProtocolLog(logging.LoggerAdapter):
    """aiohttp's protocol log. Its lines name the client's address and quote what it sent (an
    Authorization header among it), neither of which Veil logs: each becomes one DEBUG line
    naming the kind of failure only."""

    def log(self, level, msg, *args, **kwargs) -> None:
        error = kwargs.get("exc_info")
        problem = type(error).__name__ if isinstance(error, BaseException) else "request refused or failed"
        self.logger.debug("http request refused", extra={"problem": problem})


def _accepts_gzip(header: str) -> bool:
    """True when Accept-Encoding lists gzip (or *) without q=0."""
    for item in header.lower().split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


def _json(status: int, body: dict, headers: dict[str, str] | None = None) -> tuple[int, str, bytes, dict]:
    return status, "application/json", json.dumps(body, allow_nan=False).encode(), headers or {}


class _Routes:
    """The routes' answers as (status, content type, body, headers), computed off the loop."""

    def __init__(
        self,
        live: LiveEstimates,
        registry,
        healthy: Callable[[], bool],
        pages: dict[str, tuple[str, Page]],
        authenticator,
    ) -> None:
        self.live, self.registry, self.healthy, self.pages = live, registry, healthy, pages
        self.authenticator = authenticator  # _access.Authenticator, or None: no tokens

    def answer(self, raw_path: str, raw_query: str, authorization: list[str]) -> tuple[int, str, bytes, dict]:
        path = raw_path.rstrip("/") or "/"
        if path in ("/v1/estimates", "/metrics") or path.startswith(("/v1/estimates/", "/v1/series/")):
            refusal = self._refusal(authorization)
            if refusal is not None:
                return refusal
        if path == "/v1/estimates" or path.startswith("/v1/estimates/"):
            metric = unquote(path[len("/v1/estimates/") :]) if path != "/v1/estimates" else None
            status, body = estimates_answer(self.live, metric, parse_qs(raw_query))
            return status, "application/json", body, {}
        if path.startswith("/v1/series/"):
            status, body = series_answer(self.live, unquote(path[len("/v1/series/") :]), parse_qs(raw_query))
            return status, "application/json", body, {}
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry), {}
        if path == "/healthz":
            ok = self.healthy()
            return 200 if ok else 503, "text/plain; charset=utf-8", b"ok\n" if ok else b"store unavailable\n", {}
        if path in self.pages:
            content_type, page = self.pages[path]
            return 200, content_type, page(), {}
        return _json(404, {"error": f"No such resource: {raw_path[:200]}"})

    def _refusal(self, authorization: list[str]) -> tuple[int, str, bytes, dict] | None:
        """None when the request may read estimates; otherwise its 401 or 403."""
        if self.authenticator is None or not self.authenticator.enabled:
            return None
        token, problem = self.authenticator.from_bearer(authorization)
        if token is None:
            return _json(401, {"error": problem}, {"WWW-Authenticate": 'Bearer realm="veil"'})
        if token.role != "read":
            return _json(
                403,
                {"error": f"Token {token.name!r} is not a read token."},
                {"WWW-Authenticate": 'Bearer realm="veil", error="insufficient_scope"'},
            )
        return None
