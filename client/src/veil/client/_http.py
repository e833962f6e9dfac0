"""The HTTP transport: the aggregator's HTTP listener (docs/protocol.md section 5) over the
standard library's http.client, binary protobuf bodies, one keep-alive connection, TLS by the
ssl module for an https:// endpoint (the system roots or the CA file, a client certificate for
mutual TLS), the bearer token in the Authorization header.

The calls run on one daemon thread of this transport, started by the first call (never reused
across fork), so the worker keeps batching and spooling while one is in flight, as over gRPC.
A refusal is named by its HTTP status (_status.http_name); its JSON body's message is logged
with it. GET /v1/specs asks If-None-Match with the version held: a 304 is an unchanged answer.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import queue
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from veil.wire.v1 import veil_pb2

from ._config import Config
from ._errors import ConfigError
from ._status import UNIMPLEMENTED, Refusal, hint_seconds, http_name

__all__ = ["HttpTransport", "Refused"]

_PROTOBUF = "application/x-protobuf"
_USER_AGENT = "veil-client/0.1"
_M = TypeVar("_M", bound=Message)
_Job = tuple[Future, Callable[[], object]]  # type: ignore[type-arg]  # (its future, the call)


class Refused(Exception):
    """A non-200 answer: the status it stands for, the retry-after-ms hint (seconds) and the
    refusal's message."""

    def __init__(self, name: str, hint: float, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name, self.hint, self.message = name, hint, message


class HttpTransport:
    def __init__(self, config: Config) -> None:
        parts = urllib.parse.urlsplit(config.endpoint)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path  # an aggregator behind a proxy's path
        self._config = config
        self._headers = {"User-Agent": _USER_AGENT}
        if config.token:
            self._headers["Authorization"] = f"Bearer {config.token}"
        self._context = _tls_context(config) if self._tls else None
        self._connection: http.client.HTTPConnection | None = None
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self.batches = True  # False once POST /v1/uploads was answered 404 or 405 (revision 1)

    # --- the worker's calls ----------------------------------------------------------------

    def fetch_specs(self, timeout: float, if_version: str = "") -> Future[veil_pb2.GetMetricSpecsResponse]:
        """A future of the GetMetricSpecsResponse (``unchanged`` when ``if_version`` is current)."""

        def call() -> veil_pb2.GetMetricSpecsResponse:
            headers = {"Accept": _PROTOBUF}
            if if_version:
                headers["If-None-Match"] = f'"{if_version}"'
            status, answer, body = self._exchange("GET", "/v1/specs", None, headers, timeout)
            if status == 304:
                response = veil_pb2.GetMetricSpecsResponse(unchanged=True, specs_version=if_version)
                date = answer.getheader("Date")
                if date:  # the aggregator's clock, when its answer says
                    try:
                        response.server_time_unix = int(email.utils.parsedate_to_datetime(date).timestamp())
                    except (TypeError, ValueError):
                        pass
                return response
            return self._answer(status, answer, body, veil_pb2.GetMetricSpecsResponse, "/v1/specs")

        return self._submit(call)

    def upload(self, payload: bytes, timeout: float) -> Future[veil_pb2.UploadResponse]:
        """A future of the UploadResponse of one serialized UploadRequest."""
        return self._submit(lambda: self._post("/v1/upload", payload, veil_pb2.UploadResponse, timeout))

    def upload_batches(self, payload: bytes, timeout: float) -> Future[veil_pb2.UploadBatchesResponse]:
        """A future of the UploadBatchesResponse of a serialized UploadBatchesRequest."""
        return self._submit(lambda: self._post("/v1/uploads", payload, veil_pb2.UploadBatchesResponse, timeout))

    @staticmethod
    def refusal(error: BaseException) -> Refusal:
        """A failed call's status name, hint and detail: a network error is UNAVAILABLE, a
        timeout DEADLINE_EXCEEDED (unknown whether counted: retried like it)."""
        if isinstance(error, Refused):
            return Refusal(error.name, error.hint, error.message)
        detail = type(error).__name__  # its text may name the host: never logged
        if isinstance(error, TimeoutError | socket.timeout):
            return Refusal("DEADLINE_EXCEEDED", 0.0, detail)
        if isinstance(error, OSError | http.client.HTTPException):
            return Refusal("UNAVAILABLE", 0.0, detail)
        return Refusal(None, 0.0, detail)

    def close(self) -> None:
        jobs, self._jobs = self._jobs, None
        if jobs is not None:
            jobs.put(None)  # the thread closes the connection and ends
        elif self._connection is not None:
            self._connection.close()

    def forget(self) -> None:
        """Drop the thread and the connection without closing it: in a forked child they
        belong to the parent."""
        self._jobs, self._connection = None, None

    # --- the transport's thread ------------------------------------------------------------

    def _submit(self, call: Callable[[], _M]) -> Future[_M]:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._run, args=(self._jobs,), name="veil-http", daemon=True).start()
        future: Future[_M] = Future()
        self._jobs.put((future, call))
        return future

    def _run(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            future, call = job
            try:
                future.set_result(call())
            except BaseException as error:  # noqa: BLE001 (handed to the worker, which logs it)
                future.set_exception(error)
        if self._connection is not None:
            self._connection.close()

    def _post(self, path: str, payload: bytes, kind: type[_M], timeout: float) -> _M:
        status, answer, body = self._exchange("POST", path, payload, {"Content-Type": _PROTOBUF}, timeout)
        return self._answer(status, answer, body, kind, path)

    def _answer(self, status: int, answer: http.client.HTTPResponse, body: bytes, kind: type[_M], path: str) -> _M:
        if status == 200:
            try:
                return kind.FromString(body)
            except DecodeError:
                raise Refused("UNKNOWN", 0.0, f"an unreadable answer to {path}") from None
        name = http_name(status)
        if path == "/v1/uploads" and status == 405:
            name = UNIMPLEMENTED  # a revision-1 aggregator's answer, as 404
        message = f"HTTP {status}"
        try:  # the refusal's JSON: {"error": ..., "code": ...}
            message += f": {json.loads(body)['error']}"
        except (ValueError, KeyError, TypeError):
            pass
        raise Refused(name, hint_seconds(answer.getheader("retry-after-ms") or "0"), message)

    def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, http.client.HTTPResponse, bytes]:
        """One request on the kept-alive connection (a new one when there is none or it was
        closed under us: an idle connection the server closed is tried again once, fresh)."""
        retried = False
        while True:
            fresh = self._connection is None
            connection = self._connection or self._connect(timeout)
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            try:
                connection.request(method, self._prefix + path, body, {**self._headers, **headers})
                response = connection.getresponse()
                data = response.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                connection.close()
                self._connection = None
                if fresh or retried:
                    raise
                retried = True
                continue
            except BaseException:
                connection.close()
                self._connection = None
                raise
            if response.will_close:
                connection.close()
                self._connection = None
            return response.status, response, data

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._context is None:
            self._connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        else:
            self._connection = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._context
            )
        return self._connection


def _tls_context(config: Config) -> ssl.SSLContext:
    """The system roots or the CA file's, and the client certificate for mutual TLS."""
    try:
        context = ssl.create_default_context(
            cadata=config.root_certificates.decode("ascii") if config.root_certificates else None
        )
        if config.client_cert_files is not None:
            context.load_cert_chain(*config.client_cert_files)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"The CA file or client certificate is not usable PEM ({error}).") from None
    return context
