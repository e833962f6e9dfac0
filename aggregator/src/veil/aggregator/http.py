"""The HTTP listener: estimates as JSON, Prometheus metrics, and a health probe.

    GET /v1/estimates                     every metric and window
    GET /v1/estimates/{metric}?window=1h  one metric (and window)
    GET /metrics                          Prometheus text format
    GET /healthz                          200 when the store answers, 503 otherwise
    GET /                                 the dashboard (pages passed in by the daemon)

Standard library server, one thread per connection. Requests are not logged with addresses.

With TLS (ServerTls) every connection is HTTPS (and must present a client certificate from the
client CA under mutual TLS); the handshake runs on the connection's own thread, bounded by the
same timeout as a request, so a slow client holds up no one else. With tokens configured,
/v1/estimates and /metrics need `Authorization: Bearer <read token>` (401 with
WWW-Authenticate when missing or unknown, 403 for a token that is not a read token);
/healthz and the dashboard's static pages stay open.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ._errors import UnknownMetric
from .live import LiveEstimates, estimates_json
from .store import StoreError

__all__ = ["HttpListener", "REQUEST_TIMEOUT"]

REQUEST_TIMEOUT = 30.0  # seconds a connection may take for its TLS handshake, or to send a request

log = logging.getLogger("veil.aggregator")

# Extra routes (e.g. the dashboard) register here: path -> (content type, body factory).
Page = Callable[[], bytes]


class HttpListener:
    """Serves the routes above on a thread of its own."""

    def __init__(self, address: str, live: LiveEstimates, registry, healthy: Callable[[], bool],
                 pages: dict[str, tuple[str, Page]] | None = None, *, tls=None, authenticator=None) -> None:
        host, _, port = address.rpartition(":")
        handler = type("Handler", (_Handler,), {"live": live, "registry": registry, "healthy": staticmethod(healthy),
                                                "pages": dict(pages or {}), "authenticator": authenticator})
        self._server = _Server((host.strip("[]"), int(port)), handler)
        self._server.tls = tls
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="veil-http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    tls = None  # ServerTls, or None for plain HTTP

    def get_request(self):
        connection, address = super().get_request()
        if self.tls is not None:
            # The handshake waits for the connection's thread (Handler.setup), not this one.
            connection = self.tls.ssl_context().wrap_socket(connection, server_side=True,
                                                            do_handshake_on_connect=False)
        return connection, address

    def handle_error(self, request, client_address) -> None:
        # The default prints a traceback with the client's address to stderr; Veil logs no addresses.
        log.debug("http connection failed", exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    live: LiveEstimates
    registry: object
    healthy: Callable[[], bool]
    pages: dict[str, tuple[str, Page]]
    authenticator = None  # veil.aggregator._auth.Authenticator, or None: no tokens
    server_version = "veil"
    sys_version = ""
    timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        super().setup()  # applies the timeout to the connection
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError) as err:
                # A plaintext client, a client certificate from another CA, a timeout: no request.
                log.debug("http TLS handshake failed", extra={"problem": type(err).__name__})
                self.close_connection = True
                try:
                    self.connection.close()
                except OSError:
                    pass
                raise _Dropped from None

    def handle(self) -> None:
        try:
            super().handle()
        except (socket.timeout, ConnectionError, ssl.SSLError):
            pass  # the client went quiet or away

    def _authorized(self) -> bool:
        """True when the request may read estimates; otherwise answers 401 or 403."""
        if self.authenticator is None or not self.authenticator.enabled:
            return True
        token, problem = self.authenticator.from_bearer(self.headers.get_all("Authorization") or [])
        if token is None:
            self._json(401, {"error": problem}, {"WWW-Authenticate": 'Bearer realm="veil"'})
            return False
        if token.role != "read":
            self._json(403, {"error": f"Token {token.name!r} is not a read token."},
                       {"WWW-Authenticate": 'Bearer realm="veil", error="insufficient_scope"'})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        try:
            if path in ("/v1/estimates", "/metrics") or path.startswith("/v1/estimates/"):
                if not self._authorized():
                    return
            if path == "/v1/estimates" or path.startswith("/v1/estimates/"):
                metric = unquote(path[len("/v1/estimates/"):]) if path != "/v1/estimates" else None
                window = parse_qs(url.query).get("window", [None])[0]
                self._estimates(metric, window)
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            elif path == "/healthz":
                ok = self.healthy()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", b"ok\n" if ok else b"store unavailable\n")
            elif path in self.pages:
                content_type, body = self.pages[path]
                self._send(200, content_type, body())
            else:
                self._json(404, {"error": f"No such resource: {url.path}"})
        except BrokenPipeError:
            pass

    def _estimates(self, metric: str | None, window: str | None) -> None:
        try:
            current = self.live.current(metric, window)
        except UnknownMetric as err:
            self._json(404, {"error": str(err)})
            return
        except StoreError:
            self._json(503, {"error": "The counter store is unavailable; try again."})
            return
        # Each window's JSON text is built once per bucket and version (WindowEstimate.json_text,
        # cached with the estimate by LiveEstimates): a read with unchanged counts only joins them.
        self._send(200, "application/json", estimates_json(current, time.time()))

    def _json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self._send(status, "application/json", json.dumps(body, allow_nan=False).encode(), headers)

    def _send(self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Nothing here is to be framed or sniffed into another type. (The dashboard's own page
        # carries the rest of its policy in a <meta> tag; frame-ancestors only works as a header.)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "frame-ancestors 'none'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's name)
        # The default writes the client's address to stderr; Veil logs no addresses.
        log.debug("http %s", args[0] if args else "")

    def do_POST(self) -> None:  # noqa: N802
        self._json(405, {"error": "Only GET is served here."})

    do_PUT = do_DELETE = do_PATCH = do_POST


class _Dropped(Exception):
    """A connection closed before any request (its TLS handshake failed)."""
