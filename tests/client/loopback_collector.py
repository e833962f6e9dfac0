"""A real Collector on loopback for the SDK's tests: a grpc.server on 127.0.0.1 implementing
veil.wire.v1.Collector (CollectorServer), or the same over HTTP (HttpCollectorServer: GET
/v1/specs, POST /v1/upload and /v1/uploads with binary protobuf bodies and the HTTP statuses of
docs/protocol.md section 5, written here from that table), with its own decoder of the wire
format (not the SDK's; a strings round's hashed reports counted by the candidates each holds),
dedupe by batch id, per-weight Counts for the estimators, and fault
injection. It speaks revision 2 (UploadBatches, specs_version and if_version, the server's time,
made_unix recorded per batch and checked against max_lateness when one is set: OUT_OF_RANGE)
or, with ``revision=1``, revision 1 (UploadBatches UNIMPLEMENTED, no version, no time).

CollectorState is the "store": it survives stopping and restarting the server on the same
port, as Redis survives an aggregator restart.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np

from veil.aggregator.counts import Counts
from veil.mechanism import CODE_BYTES, REPORT_BYTES, REPORT_WORDS, MetricSpec
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

# Fast settings for tests: small delays so retries and batching happen within milliseconds.
FAST = dict(
    tls=False, schedule_delay_ms=20, retry_initial_backoff_ms=5, retry_max_backoff_ms=50, export_timeout_ms=3000
)

_MECHANISM = {name.lower().replace("_", "-"): value for name, value in veil_pb2.Mechanism.items() if value}


# The delivery tests send many reports from one Reporter: their metrics allow that many per
# period (the device-level bounds have tests of their own).
MANY = 10**9


def default_specs() -> list[MetricSpec]:
    many = dict(reports_per_period=MANY)
    return [
        MetricSpec.create("browser", ["chrome", "safari", "edge", "firefox"], "subset", epsilon=1.0, **many),
        MetricSpec.create("screen", [f"s{i}" for i in range(8)], "rappor-admissible", epsilon=2.0, **many),
        MetricSpec.create("theme", ["light", "dark", "auto"], "rappor", epsilon=1.0, **many),
        MetricSpec.create("country", [f"c{i}" for i in range(6)], "krr", epsilon=2.0, **many),
        MetricSpec.create("opt_in", ["no", "yes"], "warner", epsilon=1.0, **many),
        MetricSpec.create("page", [f"p{i}" for i in range(64)], "subset", epsilon=1.0, **many),
    ]


def to_proto(spec: MetricSpec, time_resolution: int = 0) -> veil_pb2.MetricSpec:
    # Written here from the proto's field comments, independently of the SDK's converter.
    strings = spec.strings
    return veil_pb2.MetricSpec(
        time_resolution_seconds=time_resolution,
        name=spec.name,
        labels=[] if strings is not None else list(spec.labels),
        strings=None
        if strings is None
        else veil_pb2.StringsRound(
            metric=strings.metric,
            round=strings.round,
            rounds=strings.rounds,
            buckets=strings.buckets,
            parents=list(strings.parents),
        ),
        mechanism=_MECHANISM[spec.mechanism.name],
        epsilon=spec.mechanism.epsilon,
        q=spec.mechanism.q or 0,
        fingerprint=spec.fingerprint,
        period_seconds=spec.period,
        reports_per_period=spec.reports_per_period,
        period_budget=spec.period_budget or 0,
        lifetime_budget=spec.lifetime_budget or 0,
    )


class Reject(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_ms = retry_after_ms


def decode(spec: MetricSpec, request: veil_pb2.UploadRequest) -> np.ndarray:
    """The batch as a (count, k) 0/1 matrix, or Reject with the reason."""
    k, q, count = spec.k, spec.mechanism.q, request.count
    if len(request.batch_id) != 16:
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "batch_id must be 16 bytes")
    if count < 1:
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "empty batch")
    kind = request.WhichOneof("reports")
    rows = np.zeros((count, k), dtype=np.int64)
    if kind == "hashed" and spec.strings is not None:
        if len(request.hashed.words) != REPORT_BYTES * count:
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, f"hashed reports are {REPORT_BYTES} bytes each")
        words = np.frombuffer(request.hashed.words, dtype="<u4").reshape(count, REPORT_WORDS).tolist()
        for r, report in enumerate(words):
            if any(a >= 2**31 - 1 for a in report[: CODE_BYTES + 1]) or report[-1] >= spec.strings.buckets:
                raise Reject(grpc.StatusCode.INVALID_ARGUMENT, f"report {r}: a coefficient or bucket out of range")
            rows[r, spec.mechanism.support(report, spec.strings.candidates)] = 1  # type: ignore[attr-defined]
    elif kind == "index_sets" and q is not None:
        if request.index_sets.set_size != q:
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "index sets must have q indices")
        raw = request.index_sets.indices
        if len(raw) != 4 * q * count:
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "wrong number of indices")
        sets = np.frombuffer(raw, dtype="<u4").reshape(count, q).astype(np.int64)
        if (sets >= k).any() or (np.diff(sets, axis=1) <= 0).any():
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "indices out of range or not increasing")
        rows[np.arange(count)[:, None], sets] = 1
    elif kind == "bitmaps":
        width = (k + 7) // 8
        if len(request.bitmaps.bits) != width * count:
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "bitmaps must be ceil(k/8) bytes per report")
        bytes_ = np.frombuffer(request.bitmaps.bits, dtype=np.uint8).reshape(count, width)
        bits = np.unpackbits(bytes_, axis=1, bitorder="little").astype(np.int64)
        if bits[:, k:].any():
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "padding bits set")
        rows = bits[:, :k]
        weights = rows.sum(axis=1)
        if q is not None and (weights != q).any():
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "a q-subset bitmap must have q bits set")
        if spec.mechanism.name == "rappor-admissible" and ((weights == 0) | (weights == k)).any():
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "admissible RAPPOR never sends all zeros or ones")
    else:
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "RAPPOR reports must be bitmaps")
    return rows


@dataclass
class CollectorState:
    specs: list[MetricSpec] = field(default_factory=default_specs)
    token: str | None = None
    max_batch: int = 0  # advertised with the specs and enforced when set
    retry_after_ms: int | None = None  # the hint sent with injected RESOURCE_EXHAUSTED faults
    lock: threading.Condition = field(default_factory=threading.Condition)
    counted: dict[bytes, int] = field(default_factory=dict)  # batch id -> reports counted
    calls: list[tuple[bytes, str]] = field(default_factory=list)  # every Upload: (batch id, outcome)
    counts: dict[str, Counts] = field(default_factory=dict)  # by fingerprint
    responses: dict[str, collections.Counter] = field(default_factory=dict)  # distinct reports by fingerprint
    spec_calls: int = 0
    faults: collections.deque = field(default_factory=collections.deque)  # codes for the next uploads
    lost_acks: int = 0  # count the next uploads, then answer UNAVAILABLE (the ack is lost)
    gate: tuple[threading.Event, threading.Event] | None = None  # (in flight, release) for the next upload
    revision: int = 2  # 1: UploadBatches is UNIMPLEMENTED, and no specs_version or time is said
    upload_batches: bool = True  # False: UploadBatches is UNIMPLEMENTED even at revision 2 (e.g. a proxy)
    resolutions: dict[str, int] = field(default_factory=dict)  # metric -> time_resolution_seconds served
    clock: Callable[[], float] = time.time  # the aggregator's clock
    max_lateness: int = 0  # seconds; 0: not said nor enforced (tests of a simulated clock in the past)
    made: dict[bytes, int] = field(default_factory=dict)  # batch id -> made_unix of the batch counted
    batch_calls: list[list[bytes]] = field(default_factory=list)  # every UploadBatches: its batch ids
    call_faults: collections.deque = field(default_factory=collections.deque)  # codes for whole UploadBatches
    if_versions: list[str] = field(default_factory=list)  # every GetMetricSpecs: the if_version it said
    unchanged_answers: int = 0

    @property
    def specs_version(self) -> str:
        if self.revision < 2:
            return ""
        text = repr(([(s.fingerprint, s.period_budget, s.lifetime_budget) for s in self.specs], self.max_batch))
        return hashlib.sha256((text + repr(sorted(self.resolutions.items()))).encode()).hexdigest()[:16]

    def by_name(self, name: str) -> MetricSpec:
        return next(s for s in self.specs if s.name == name)

    def fail_next(self, n: int, code: grpc.StatusCode) -> None:
        with self.lock:
            self.faults.extend([code] * n)

    def total(self, name: str | None = None) -> int:
        with self.lock:
            return sum(c.total for fp, c in self.counts.items() if name is None or fp == self.by_name(name).fingerprint)

    def distinct(self, name: str) -> collections.Counter:
        with self.lock:
            return collections.Counter(self.responses.get(self.by_name(name).fingerprint, {}))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        with self.lock:
            return self.lock.wait_for(predicate, timeout)

    def upload(self, request: veil_pb2.UploadRequest) -> veil_pb2.UploadResponse:
        with self.lock:
            gate, self.gate = self.gate, None
        if gate is not None:  # hold this call in flight until the test releases it
            gate[0].set()
            gate[1].wait(10)
        with self.lock:
            try:
                if self.faults:
                    code = self.faults.popleft()
                    hint = self.retry_after_ms if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
                    raise Reject(code, "injected fault", hint)
                spec = next((s for s in self.specs if s.name == request.metric), None)
                if spec is None or spec.fingerprint != request.spec_fingerprint:
                    raise Reject(grpc.StatusCode.FAILED_PRECONDITION, "unknown metric or stale fingerprint")
                if self.max_batch and request.count > self.max_batch:
                    # As the aggregator's message size limit answers it (retryable: a limit may rise).
                    raise Reject(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many reports")
                if request.batch_id in self.counted:
                    self._log(request.batch_id, "duplicate")
                    return veil_pb2.UploadResponse(
                        accepted=request.count, duplicate=True, specs_version=self.specs_version
                    )
                resolution = self.resolutions.get(spec.name) or spec.period
                if self.revision >= 2 and request.made_unix:
                    if request.made_unix % resolution:
                        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "made_unix is not a slot start")
                    if self.max_lateness and request.made_unix + resolution + self.max_lateness <= self.clock():
                        raise Reject(grpc.StatusCode.OUT_OF_RANGE, "reports made too long ago")
                rows = decode(spec, request)
                self._count(spec, rows, request)
                self.counted[request.batch_id] = request.count
                self.made[request.batch_id] = request.made_unix
                if self.lost_acks:
                    self.lost_acks -= 1
                    raise Reject(grpc.StatusCode.UNAVAILABLE, "counted, but the ack is lost")
                self._log(request.batch_id, "counted")
                return veil_pb2.UploadResponse(accepted=request.count, specs_version=self.specs_version)
            except Reject as reject:
                self._log(request.batch_id, reject.code.name)
                raise

    def _log(self, batch_id: bytes, outcome: str) -> None:
        self.calls.append((batch_id, outcome))
        self.lock.notify_all()

    def _count(self, spec: MetricSpec, rows: np.ndarray, request: veil_pb2.UploadRequest) -> None:
        counts = self.counts.setdefault(spec.fingerprint, Counts.zeros(spec.mechanism))
        if spec.strings is not None:  # hashed reports have no weight: one row (weight 0)
            weight_rows = np.zeros(len(rows), np.int64)
        else:
            weight_rows = counts.row_of_weight()[rows.sum(axis=1)]
        assert (weight_rows >= 0).all()
        np.add.at(counts.n, weight_rows, 1)
        np.add.at(counts.v, weight_rows, rows)
        seen = self.responses.setdefault(spec.fingerprint, collections.Counter())
        if spec.strings is not None:  # a hashed report is its words
            seen.update(map(tuple, np.frombuffer(request.hashed.words, "<u4").reshape(-1, REPORT_WORDS).tolist()))
        else:
            seen.update(tuple(np.flatnonzero(row).tolist()) for row in rows)


class Servicer(veil_pb2_grpc.CollectorServicer):
    def __init__(self, state: CollectorState) -> None:
        self.state = state

    def _authorize(self, context: grpc.ServicerContext) -> None:
        if self.state.token is not None:
            metadata = dict(context.invocation_metadata())
            if metadata.get("authorization") != f"Bearer {self.state.token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    def GetMetricSpecs(self, request, context):
        self._authorize(context)
        state = self.state
        with state.lock:
            state.spec_calls += 1
            state.if_versions.append(request.if_version)
            state.lock.notify_all()
            if state.revision < 2:
                return veil_pb2.GetMetricSpecsResponse(
                    specs=[to_proto(s) for s in state.specs], max_batch=state.max_batch
                )
            version, now = state.specs_version, int(state.clock())
            if request.if_version == version:
                state.unchanged_answers += 1
                return veil_pb2.GetMetricSpecsResponse(
                    specs_version=version, unchanged=True, server_time_unix=now, max_lateness_seconds=state.max_lateness
                )
            return veil_pb2.GetMetricSpecsResponse(
                specs=[to_proto(s, state.resolutions.get(s.name, 0)) for s in state.specs],
                max_batch=state.max_batch,
                specs_version=version,
                server_time_unix=now,
                max_lateness_seconds=state.max_lateness,
            )

    def Upload(self, request, context):
        self._authorize(context)
        try:
            return self.state.upload(request)
        except Reject as reject:
            if reject.retry_after_ms is not None:
                context.set_trailing_metadata((("retry-after-ms", str(reject.retry_after_ms)),))
            context.abort(reject.code, str(reject))

    def UploadBatches(self, request, context):
        state = self.state
        with state.lock:
            state.batch_calls.append([b.batch_id for b in request.batches])
            state.lock.notify_all()
            fault = state.call_faults.popleft() if state.call_faults else None
        if state.revision < 2 or not state.upload_batches:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self._authorize(context)
        if fault is not None:
            context.abort(fault, "injected fault on the whole call")
        if not 1 <= len(request.batches) <= 64:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "1 to 64 batches a call")
        if state.max_batch and sum(b.count for b in request.batches) > state.max_batch:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many reports in the call")
        results = []
        for batch in request.batches:
            try:
                answer = state.upload(batch)
                results.append(veil_pb2.BatchResult(accepted=answer.accepted, duplicate=answer.duplicate))
            except Reject as reject:
                results.append(veil_pb2.BatchResult(code=reject.code.value[0], message=str(reject)))
        return veil_pb2.UploadBatchesResponse(results=results, specs_version=state.specs_version)


class CollectorServer:
    """A real gRPC server on 127.0.0.1; stop() and start() keep the port and the state."""

    def __init__(self, state: CollectorState, credentials: grpc.ServerCredentials | None = None) -> None:
        self.state = state
        self.credentials = credentials
        self.port = 0
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        veil_pb2_grpc.add_CollectorServicer_to_server(Servicer(self.state), server)
        address = f"127.0.0.1:{self.port}"
        port = (
            server.add_secure_port(address, self.credentials) if self.credentials else server.add_insecure_port(address)
        )
        assert port, "cannot bind"
        self.port = port
        server.start()
        self._server = server

    def stop(self, meanwhile: Callable[[], None] | None = None) -> None:
        """Stop at once, aborting calls in flight; ``meanwhile`` runs after the abort and
        before waiting for the server to wind down (e.g. to release a held handler)."""
        if self._server is not None:
            stopped = self._server.stop(grace=None)
            if meanwhile is not None:
                meanwhile()
            stopped.wait()
            self._server = None


# docs/protocol.md section 5's table: the HTTP status of each gRPC status an upload may get
# (a timeout has none over HTTP: an HTTP status the table does not name stands for it).
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNIMPLEMENTED: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.OUT_OF_RANGE: 410,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.ABORTED: 500,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code, self.retry_after_ms = code, retry_after_ms


class _HttpContext:
    """What the Servicer asks of a gRPC context, over an HTTP request."""

    def __init__(self, authorization: str | None) -> None:
        self.authorization = authorization
        self.trailers: tuple = ()

    def invocation_metadata(self) -> tuple:
        return (("authorization", self.authorization),) if self.authorization else ()

    def set_trailing_metadata(self, trailers: tuple) -> None:
        self.trailers = trailers

    def abort(self, code: grpc.StatusCode, message: str) -> None:
        hint = dict(self.trailers).get("retry-after-ms")
        raise _Abort(code, message, int(hint) if hint is not None else None)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the aggregator's listener
    server: _HttpServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass

    def _answer(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _call(self, method, request) -> None:
        context = _HttpContext(self.headers.get("Authorization"))
        try:
            response = method(request, context)
        except _Abort as abort:
            headers = {"Content-Type": "application/json"}
            if abort.retry_after_ms is not None:
                headers["retry-after-ms"] = str(abort.retry_after_ms)
            body = json.dumps({"error": str(abort), "code": abort.code.name}).encode()
            self._answer(HTTP_STATUS[abort.code], body, headers)
            return
        self._answer(200, response.SerializeToString(), {"Content-Type": "application/x-protobuf"})

    def do_GET(self) -> None:
        if self.path != "/v1/specs":
            self._answer(404)
            return
        servicer = self.server.servicer
        version = servicer.state.specs_version
        tag = self.headers.get("If-None-Match", "")
        if_version = version if version and tag == f'"{version}"' else ""
        context = _HttpContext(self.headers.get("Authorization"))
        try:
            response = servicer.GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(if_version=if_version), context)
        except _Abort as abort:
            self._answer(HTTP_STATUS[abort.code], json.dumps({"error": str(abort)}).encode())
            return
        if response.unchanged:
            self._answer(304, headers={"ETag": tag})
        else:
            self._answer(200, response.SerializeToString(), {"Content-Type": "application/x-protobuf"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        servicer = self.server.servicer
        if self.path == "/v1/upload":
            self._call(servicer.Upload, veil_pb2.UploadRequest.FromString(body))
        elif self.path == "/v1/uploads":
            self._call(servicer.UploadBatches, veil_pb2.UploadBatchesRequest.FromString(body))
        else:
            self._answer(404)


class _HttpServer(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address: tuple[str, int], servicer: Servicer) -> None:
        self.servicer = servicer
        self.connections: set[socket.socket] = set()
        self.accepted = 0  # connections accepted since start
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        self.connections.add(request)
        self.accepted += 1
        super().process_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        pass  # a connection cut by stop(): the answer of a held call goes nowhere, as intended

    def shutdown_request(self, request) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)


class HttpCollectorServer:
    """The Collector over HTTP/1.1 on 127.0.0.1; stop() and start() keep the port and the state."""

    def __init__(self, state: CollectorState) -> None:
        self.state = state
        self.port = 0
        self._server: _HttpServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def connections_accepted(self) -> int:
        return self._server.accepted if self._server is not None else 0

    def start(self) -> None:
        server = _HttpServer(("127.0.0.1", self.port), Servicer(self.state))
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self, meanwhile: Callable[[], None] | None = None) -> None:
        """Stop at once, cutting the connections of calls in flight; ``meanwhile`` runs after
        that (e.g. to release a held handler, whose answer then goes nowhere)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for connection in list(server.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if meanwhile is not None:
            meanwhile()
