"""The native collector: a second gRPC listener (server.native_grpc) that serves the Collector
service (what devices call: Upload, GetMetricSpecs) through gRPC's C++ server.

grpcio's server spends some 200 us of CPU per call before a handler runs, on handing the call to
a Python thread and taking the GIL back and forth; that, not Veil's work, kept uploads per core
below the issue's goal (bench/PROFILES.md section 4). The C++ module (aggregator/native/
collector.cc, built by `make native` against Debian's libgrpc++-dev) reads the calls on gRPC's
own threads and hands them to Python in sets of up to 256; each set is answered here
by the same parts as grpcio's listener and the HTTP one. A call comes twice: first unread, for
the AccessInterceptor's checks before reading (admit_unread: its token, and an upload's upload
rate), so that a call refused there is answered without its message being read; then, read,
for the rest (admit_read: the token's scope, the report rate), and an upload then joins
CollectorService.upload_many, which writes the set's batches in as few store calls as the store
makes. The answers, statuses, messages and the retry-after-ms trailer are those of the main
listener.

The listener serves only those two methods: health, reflection and Estimates stay on
server.grpc. It has its own in-flight bytes budget of server.max_inflight_bytes, kept as the main
listener keeps its: each call reserves the largest valid upload's size before its message is
read, waiting its turn up to BUDGET_WAIT, then keeps its own size until answered; a call that
waited in vain is refused with the main listener's RESOURCE_EXHAUSTED and retry-after-ms.
With [tls] it serves the files the main listeners serve (mutual with tls.client_ca_file), through
a private copy that gRPC's file watcher reads (TlsCopy).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence

import grpc
from google.protobuf.message import DecodeError

from veil.wire.v1 import veil_pb2

from ._auth import _SPECS, _UPLOAD, BUDGET_REFUSAL, BUDGET_RETRY_MS, BUDGET_WAIT, RETRY_AFTER_KEY, AccessInterceptor
from ._calls import CallContext, Refused
from ._tls import ServerTls, TlsCopy
from .decode import parse_upload
from .errors import ConfigError
from .service import CollectorService, Refusal

__all__ = ["NativeCollector", "load_module"]

log = logging.getLogger("veil.aggregator")

_METHODS = (_UPLOAD, _SPECS)  # the C++ side passes a call's method as its index here
_MOST = 256  # calls handed over at once, at most: SQLite writes them in one transaction
_FAILED = "The aggregator failed on this call; retry it (a batch is counted at most once)."

# A call as the C++ side hands it over: (read, method index, authorization values, token name,
# whether its caller still waits, request bytes). Each call comes twice: unread (no token, no
# bytes) for the checks before reading, then read, as the token those checks admitted.
Call = tuple[bool, int, tuple[str, ...], str, bool, bytes]
# One answer to the C++ side: (status code, message, response bytes, retry-after ms). Code 0
# admits an unread call (the bytes: its token's name) or answers a read one.
Reply = tuple[int, str, bytes, int]


def load_module():
    """The C++ module; ConfigError, saying how to build it, where it is not built."""
    try:
        return importlib.import_module("veil.aggregator._native_collector")
    except ImportError as err:
        raise ConfigError(
            f"server.native_grpc: the native collector is not built here ({err}); run `make native`, "
            f"which builds it against Debian's libgrpc++-dev, or leave server.native_grpc out."
        ) from None


def _ok(message) -> Reply:
    return 0, "", message.SerializeToString(), 0


def _refused(code: grpc.StatusCode, message: str, context: CallContext) -> Reply:
    retry = next((int(value) for key, value in context.trailers if key == RETRY_AFTER_KEY), 0)
    return code.value[0], message, b"", retry


class NativeCollector:
    """The listener on `address`, answering through `access` and `collector`; start() serves,
    stop(grace) lets calls in progress finish within grace seconds, then ends."""

    def __init__(
        self,
        address: str,
        access: AccessInterceptor,
        collector: CollectorService,
        *,
        max_message_bytes: int,
        max_inflight_bytes: int,
        reuse_port: bool,
        tls: ServerTls | None,
    ) -> None:
        self._access, self._collector = access, collector
        self._native = load_module()
        self._stopping = threading.Event()
        self._tls = None if tls is None else TlsCopy(tls)
        files = None
        if self._tls is not None:
            ca = self._tls.client_ca_file
            files = (str(self._tls.cert_file), str(self._tls.key_file), None if ca is None else str(ca))
        try:
            self._listener, self.port = self._native.start(
                address,
                _METHODS,
                max_message_bytes,
                (max_inflight_bytes, BUDGET_WAIT, BUDGET_RETRY_MS, BUDGET_REFUSAL),
                reuse_port,
                files,
            )
        except OSError:
            self._close_tls()
            raise ConfigError(f"server.native_grpc: cannot listen on {address}.") from None
        # One thread checks the calls not yet read, one answers those read: a call is admitted
        # while the other waits for the store.
        self._threads = [
            threading.Thread(
                target=self._native.serve, args=(self._listener, self._answer, _MOST, read), name=name, daemon=True
            )
            for read, name in ((False, "veil-native-admit"), (True, "veil-native"))
        ]
        if self._tls is not None:
            self._threads.append(threading.Thread(target=self._copy_tls, name="veil-native-tls", daemon=True))
        self._started = self._stopped = False

    def start(self) -> None:
        self._started = True
        for thread in self._threads:
            thread.start()

    def stop(self, grace: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if not self._started:
            self.start()  # gRPC's shutdown waits for every call to be answered by serve
        self._native.stop(self._listener, grace)
        for thread in self._threads:
            thread.join()
        self._close_tls()

    def _copy_tls(self) -> None:
        """Once a second, hand gRPC's file watcher the files ServerTls serves (see TlsCopy)."""
        assert self._tls is not None
        while not self._stopping.wait(1.0):
            try:
                self._tls.refresh()
            except OSError as err:  # the copy's directory went away: keep serving the last files
                log.error("cannot copy the TLS files for server.native_grpc", extra={"problem": str(err)})

    def _close_tls(self) -> None:
        if self._tls is not None:
            self._tls.close()

    def _answer(self, calls: Sequence[Call]) -> list[Reply]:
        """The reply to each call of a set (see Call). Never raises: the C++ side would fail the set."""
        try:
            return self._replies(calls)
        except Exception:  # noqa: BLE001 (answered as INTERNAL; the set's batches may be retried)
            log.exception("the native collector failed on a set of calls", extra={"calls": len(calls)})
            return [(grpc.StatusCode.INTERNAL.value[0], _FAILED, b"", 0)] * len(calls)

    def _replies(self, calls: Sequence[Call]) -> list[Reply]:
        replies: dict[int, Reply] = {}
        admitted: list[tuple[int, veil_pb2.UploadRequest]] = []
        for i, (read, method_index, authorization, token, active, body) in enumerate(calls):
            method = _METHODS[method_index]
            context = CallContext(active)
            try:
                if not read:  # admitted by code 0, naming its token: then read, and handed over again
                    replies[i] = 0, "", self._access.admit_unread(method, list(authorization), context).encode(), 0
                elif method == _UPLOAD:
                    admitted.append((i, self._access.admit_read(_joins, method, token, parse_upload(body), context)))
                else:
                    replies[i] = _ok(self._access.admit_read(self._specs, method, token, body, context))
            except Refused as refused:
                replies[i] = _refused(refused.code, refused.message, context)
        answers = self._collector.upload_many([request for _, request in admitted]) if admitted else []
        for (i, _), answer in zip(admitted, answers):
            if isinstance(answer, Refusal):
                replies[i] = answer.code.value[0], answer.message, b"", 0
            else:
                replies[i] = _ok(answer)
        return [replies[i] for i in range(len(calls))]

    def _specs(self, body: bytes, context: CallContext) -> veil_pb2.GetMetricSpecsResponse:
        """GetMetricSpecs of a request still in bytes: parsed only once its token is admitted."""
        try:
            request = veil_pb2.GetMetricSpecsRequest.FromString(body)
        except DecodeError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The GetMetricSpecsRequest message does not parse.")
        return self._collector.GetMetricSpecs(request, context)


def _joins(request: veil_pb2.UploadRequest, _context: CallContext) -> veil_pb2.UploadRequest:
    """The behaviour admit_read calls once an upload passes its checks: it joins the set."""
    return request
