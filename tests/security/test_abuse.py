"""Abuse of a running aggregator from outside, one class at a time (issues 15 and 26): floods of
large tokenless uploads, slow HTTP clients, half-sent and trickled bodies, one token pinning
the in-flight budget, clients that never read their answers, HTTP/2 rapid reset and many
streams, streams of every kind, rate limits in uploads and in reports, hostile names and
intervals, and the HTTP protocol itself. Everything goes over real gRPC and HTTP on loopback;
the attacks whose cost is memory run against a `veil serve` process whose memory is read from
/proc, and assert the documented bound (README, "Limits on abuse"): the in-flight budget twice
over (gRPC's buffer and Python's copy) and a fixed allowance for connections and windows."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from raw_h2 import RawH2
from veil_testing.processes import ServeProcess, free_port
from veil_testing.running import (
    METRICS,
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    UPLOAD_TOKEN,
    InProcessAggregators,
    auth_section,
    bearer,
    config_dict,
    counted,
    make_upload,
)

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import max_message_bytes
from veil.aggregator.errors import ConfigError
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

pytestmark = pytest.mark.starts_first  # a minute or more: floods and stalls

UPLOAD = "/veil.wire.v1.Collector/Upload"
UPLOAD_BATCHES = "/veil.wire.v1.Collector/UploadBatches"
UPLOAD_PATHS = ("/v1/upload", "/v1/uploads")  # one batch, several: the same path through the checks
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # open: read, within a budget of its own


@pytest.fixture
def start_aggregator():
    aggregators = InProcessAggregators()
    yield aggregators.start
    aggregators.stop_all()


def channel(aggregator) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# --- memory before authentication -----------------------------------------------------------

WIDE = {"name": "wide", "labels": [f"c{i}" for i in range(1024)], "mechanism": "subset", "epsilon": 1.0}
BUDGET = 32 << 20


def within_bound(peak: int, baseline: int, budget: int) -> bool:
    """The documented memory bound: the budget's bytes, held in gRPC's buffer and Python's copy,
    and a fixed allowance for the attackers' connections and HTTP/2 windows."""
    return peak - baseline < 2 * budget + (96 << 20)


def test_a_tokenless_flood_of_large_uploads_keeps_memory_bounded_and_uploads_flowing(tmp_path):
    """64 8 MB uploads at once, over and over, most without a token (refused unread), an eighth
    with another app's token (read within the in-flight budget, then refused as invalid), an
    eighth sent to the tokenless health Check (read within a budget of its own), while the app
    uploads: the server's memory stays within its budget and a fixed allowance, and every one of
    the app's uploads goes through (retrying RESOURCE_EXHAUSTED as the SDK does)."""
    serve = ServeProcess(
        tmp_path,
        {
            **config_dict("memory", free_port(), max_inflight_bytes=BUDGET),
            "metrics": [*METRICS, WIDE],
            "auth": auth_section(),
        },
    )
    serve.start()
    endpoint = serve.endpoint
    try:
        pid = serve.process.pid
        limit = max_message_bytes(parse_config({"metrics": [WIDE]}))
        assert limit > 10 << 20  # k = 1024 at max_batch 10,000: the widest metric sets gRPC's limit
        time.sleep(1.0)
        baseline = rss_bytes(pid)
        payload = b"\x0a" + b"\xff" * 5 + b"\x00" * (8 << 20)  # 8 MB, tokenless: refused
        stop = threading.Event()
        flooders = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
        codes: dict[str, int] = {}

        def flood(method: str, metadata) -> None:
            raw = flooders.unary_unary(method, request_serializer=None, response_deserializer=None)
            while not stop.is_set():
                try:
                    raw(payload, metadata=metadata, timeout=10)
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.RpcError as err:
                    codes[err.code().name] = codes.get(err.code().name, 0) + 1

        peak = baseline
        with futures.ThreadPoolExecutor(64) as pool:
            for i in range(64):  # most without a token, some with the app's (read, then refused), some at health
                pool.submit(
                    flood, HEALTH_CHECK if i % 8 == 1 else UPLOAD, bearer(OTHER_UPLOAD_TOKEN) if i % 8 == 0 else None
                )
            app = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(endpoint))
            tried = accepted = 0
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                tried += 1
                for _attempt in range(20):  # the SDK's retries, on the same batch
                    try:
                        batch = make_upload("browser", 50, seed=tried)
                        accepted += app.Upload(batch, metadata=bearer(UPLOAD_TOKEN), timeout=5).accepted == 50
                        break
                    except grpc.RpcError as err:
                        assert err.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
                        time.sleep(0.05)
                peak = max(peak, rss_bytes(pid))
            stop.set()
        peak = max(peak, rss_bytes(pid))
        # Health answers INTERNAL to bytes that are no HealthCheckRequest (grpcio's own servicer);
        # UNAVAILABLE is a stream refused over the 100 a connection may have open (REFUSED_STREAM).
        expected = {"UNAUTHENTICATED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "INTERNAL", "UNAVAILABLE"}
        assert set(codes) <= expected, codes
        assert codes.get("UNAUTHENTICATED") and codes.get("INVALID_ARGUMENT"), codes
        assert accepted == tried and tried >= 5, (accepted, tried)
        assert within_bound(peak, baseline, BUDGET), (baseline >> 20, peak >> 20, codes, tried)
    finally:
        serve.cleanup()


def test_a_budget_no_upload_fits_in_is_a_config_error(start_aggregator):
    with pytest.raises(ConfigError, match="server.max_inflight_bytes: expected at least the largest valid upload"):
        start_aggregator(max_inflight_bytes=1000)


# --- slow HTTP clients --------------------------------------------------------------------------


def test_thousands_of_slow_http_connections_hold_no_threads_and_new_clients_are_served(start_aggregator):
    aggregator = start_aggregator(http_max_connections=200, http_request_timeout=3.0)
    threads = threading.active_count()
    slow = []
    try:
        for _ in range(1500):  # each sends half a request line and then nothing
            connection = socket.create_connection(("127.0.0.1", aggregator.http_port), timeout=10)
            connection.sendall(b"GET /v1/estim")
            slow.append(connection)
        assert threading.active_count() <= threads + 2  # no thread per connection
        assert aggregator._http.connections <= 200
        client = http.client.HTTPConnection("127.0.0.1", aggregator.http_port, timeout=10)
        client.request("GET", "/healthz")
        assert client.getresponse().status == 200
        stub = veil_pb2_grpc.EstimatesStub(channel(aggregator))
        assert stub.Get(veil_pb2.EstimatesRequest(metric="os"), timeout=10).estimates
    finally:
        for connection in slow:
            connection.close()


def test_a_request_that_misses_its_deadline_loses_its_connection(start_aggregator):
    aggregator = start_aggregator(http_request_timeout=0.5)
    slow = socket.create_connection(("127.0.0.1", aggregator.http_port), timeout=10)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    idle = http.client.HTTPConnection("127.0.0.1", aggregator.http_port, timeout=10)
    idle.request("GET", "/healthz")
    assert idle.getresponse().read() == b"ok\n"
    assert slow.recv(1024) == b""  # closed by the server, without an answer
    idle.sock.settimeout(10)
    assert idle.sock.recv(1024) == b""  # a keep-alive connection idles no longer than a request may take


def test_http_1_1_keep_alive_head_and_gzip(start_aggregator):
    aggregator = start_aggregator()
    client = http.client.HTTPConnection("127.0.0.1", aggregator.http_port, timeout=10)
    client.request("GET", "/dashboard.js")
    plain = client.getresponse()
    body = plain.read()
    assert plain.version == 11 and plain.status == 200 and len(body) > 1024
    local = client.sock.getsockname()
    client.request("GET", "/dashboard.js", headers={"Accept-Encoding": "gzip"})
    zipped = client.getresponse()
    assert client.sock.getsockname() == local  # the same connection
    assert zipped.getheader("Content-Encoding") == "gzip" and gzip.decompress(zipped.read()) == body
    client.request("HEAD", "/dashboard.js")
    head = client.getresponse()
    assert head.status == 200 and head.read() == b"" and int(head.getheader("Content-Length")) == len(body)
    client.request("GET", "/dashboard.js", headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert client.getresponse().read() == body
    client.request("GET", "/v1/estimates", headers={"Accept-Encoding": "gzip"})
    assert "estimates" in json.loads(gzip.decompress(client.getresponse().read()))
    client.request("POST", "/v1/estimates", body=b"{}")
    refused = client.getresponse()
    assert refused.status == 405 and refused.getheader("Allow") == "GET, HEAD"
    refused.read()
    client.request("HEAD", "/healthz")
    assert client.getresponse().status == 200


# --- one client against the others (issue 26) ---------------------------------------------------
#
# Each attack runs beside legitimate devices that must be served and counted exactly, and ends
# with the budget whole again. Waits are bounded loops with deadlines far beyond the listener's
# own (they fail only on a real hang), never timed assertions.

SPECS = "/veil.wire.v1.Collector/GetMetricSpecs"


def upload_head(port: int, length: int, token: str | None, path: str = "/v1/upload") -> bytes:
    """The request line and headers of a POST of `path` announcing a body of `length` bytes."""
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-protobuf\r\n"
        f"{authorization}Content-Length: {length}\r\n\r\n"
    ).encode()


def http_upload(port: int, request: veil_pb2.UploadRequest, token: str | None, path: str = "/v1/upload") -> int:
    """POST of `request` to `path` on a fresh connection (to /v1/uploads as its one batch); its
    status."""
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    message = veil_pb2.UploadBatchesRequest(batches=[request]) if path == "/v1/uploads" else request
    try:
        headers = {"Content-Type": "application/x-protobuf", **({"Authorization": f"Bearer {token}"} if token else {})}
        client.request("POST", path, body=message.SerializeToString(), headers=headers)
        response = client.getresponse()
        response.read()
        return response.status
    finally:
        client.close()


def get_status(port: int, path: str) -> int:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        client.request("GET", path)
        response = client.getresponse()
        response.read()
        return response.status
    finally:
        client.close()


def until(condition, seconds: float = 30.0) -> bool:
    """Whether `condition()` became true within `seconds` (checked every 50 ms)."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def budget_of(aggregator):
    return aggregator.access.budget


@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_half_sent_upload_bodies_that_close_free_their_connections_at_once(start_aggregator, path):
    """Issue 26's outage: POST /v1/upload (or /v1/uploads) headers and 3 body bytes, then close, on more connections
    than the listener takes at once (half with a token, whose body would be read, half without,
    refused unread), three rounds. Each connection is freed when its client closes, long before
    the request deadline (60 s here): /healthz and a device's upload are then served, counted
    exactly, and the in-flight budget is whole again. (Before, every later connection was reset
    until a restart: the half-sent bodies held every connection slot for ever.)"""
    aggregator = start_aggregator(http_max_connections=32, http_request_timeout=60.0, sections={"auth": auth_section()})
    port, budget = aggregator.http_port, budget_of(aggregator)

    def healthy() -> bool:  # a connection accepted amid the burst may be refused: the listener is full
        try:
            return get_status(port, "/healthz") == 200
        except OSError:
            return False

    for _round in range(3):
        for i in range(48):
            attacker = socket.create_connection(("127.0.0.1", port), timeout=10)
            attacker.sendall(upload_head(port, 1000, UPLOAD_TOKEN if i % 2 else None, path) + b"\x0a\x01\x02")
            attacker.close()
        assert until(healthy)
        # Every connection left waits for a request (the probes', half-closed: ones a new client
        # may close to make room); none is in a body.
        assert until(lambda: aggregator._http.connections == len(aggregator._http._waiting))
    assert budget.free == budget.total
    assert http_upload(port, make_upload("os", 40, seed=3), UPLOAD_TOKEN, path) == 200
    assert counted(aggregator, "os") == 40


def test_trickled_bodies_lose_their_connection_at_the_deadline_while_devices_are_served(start_aggregator):
    """Bodies trickled a byte at a time (each byte well within any idle timeout) on connections
    with a token: each is closed once its request's deadline passes, its reservation given back,
    while another app's devices upload over HTTP and gRPC and are counted exactly. The token
    holds no more than its share of the budget meanwhile."""
    aggregator = start_aggregator(http_request_timeout=2.0, sections={"auth": auth_section()})
    port, budget = aggregator.http_port, budget_of(aggregator)
    trickling = []
    for _ in range(12):
        attacker = socket.create_connection(("127.0.0.1", port), timeout=10)
        attacker.sendall(upload_head(port, 100_000, UPLOAD_TOKEN))
        trickling.append(attacker)
    app = veil_pb2_grpc.CollectorStub(channel(aggregator))
    served = 0
    for step in range(600):  # a byte every 50 ms: 30 s at most, 15 times the deadline
        for attacker in list(trickling):
            try:
                attacker.sendall(b"\x00")
            except OSError:  # closed by the server
                trickling.remove(attacker)
                attacker.close()
        assert budget.held("app-a") <= budget.share
        if step % 10 == 0 and served < 5:
            served += 1
            assert http_upload(port, make_upload("crash_screen", 10, seed=served), OTHER_UPLOAD_TOKEN) == 200
            app.Upload(
                make_upload("crash_screen", 10, seed=100 + served), metadata=bearer(OTHER_UPLOAD_TOKEN), timeout=30
            )
        if not trickling and served == 5:
            break
        time.sleep(0.05)
    assert not trickling, f"{len(trickling)} trickling connections still open"
    assert counted(aggregator, "crash_screen") == 100
    assert until(lambda: budget.free == budget.total)


def stalled_uploads(aggregator, token: str, count: int, method: str = UPLOAD) -> tuple[list, threading.Event]:
    """`count` calls of `method` (Upload or UploadBatches) with `token` that send their headers
    and never their message (the request iterator waits on the event returned); their futures."""
    never = threading.Event()

    def message_never_sent():
        never.wait()
        yield from ()

    stalled = grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}")
    call = stalled.stream_unary(method, request_serializer=None, response_deserializer=None)
    calls = [call.future(message_never_sent(), metadata=bearer(token), timeout=120) for _ in range(count)]
    return calls, never


@pytest.mark.parametrize("method", [UPLOAD, UPLOAD_BATCHES])
def test_one_token_cannot_pin_the_in_flight_budget_with_uploads_that_never_send(start_aggregator, method):
    """Issue 26: 26 upload calls with one token that never send their message pinned the whole
    budget (other devices got DEADLINE_EXCEEDED). Now the token holds at most its share (the
    rest of its calls refused at once), the read deadline cancels the stalled calls and gives
    their bytes back, and another app's uploads are served and counted exactly throughout."""
    largest = max_message_bytes(parse_config(config_dict()))
    aggregator = start_aggregator(max_inflight_bytes=8 * largest, read_timeout=3.0, sections={"auth": auth_section()})
    budget = budget_of(aggregator)
    assert budget.share == 2 * largest  # a quarter of the budget (fewer than a quarter of 16 workers' reads)
    calls, never = stalled_uploads(aggregator, UPLOAD_TOKEN, 26, method)
    try:
        assert until(lambda: budget.held("app-a") == budget.share)
        app = veil_pb2_grpc.CollectorStub(channel(aggregator))
        for i in range(10):
            assert budget.held("app-a") <= budget.share
            response = app.Upload(
                make_upload("crash_screen", 20, seed=i), metadata=bearer(OTHER_UPLOAD_TOKEN), timeout=30
            )
            assert response.accepted == 20
        assert counted(aggregator, "crash_screen") == 200
        codes = {call.exception(timeout=60).code() for call in calls}  # the read deadline ends them all
        assert codes <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}, codes
        assert grpc.StatusCode.CANCELLED in codes  # the ones that held the share, by the read deadline
        assert until(lambda: budget.free == budget.total)
    finally:
        never.set()


@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_a_stalled_http_body_holds_its_tokens_share_at_most(start_aggregator, path):
    """Upload bodies (of /v1/upload or /v1/uploads) that stall after their headers, more than
    the token's share of the budget holds: the ones beyond the share are refused at once with 429
    (unread, their connection closed), the rest are closed at the request deadline, and another
    token's uploads go on."""
    largest = max_message_bytes(parse_config(config_dict()))
    aggregator = start_aggregator(
        max_inflight_bytes=8 * largest, http_request_timeout=3.0, sections={"auth": auth_section()}
    )
    port, budget = aggregator.http_port, budget_of(aggregator)
    stalled = []
    for _ in range(6):
        attacker = socket.create_connection(("127.0.0.1", port), timeout=30)
        attacker.sendall(upload_head(port, 1000, UPLOAD_TOKEN, path) + b"\x0a")
        stalled.append(attacker)
    assert until(lambda: budget.held("app-a") == budget.share)
    assert http_upload(port, make_upload("crash_screen", 10), OTHER_UPLOAD_TOKEN, path) == 200
    answers = []
    for attacker in stalled:
        answers.append(attacker.recv(4096).split(b" ", 2)[1:2])  # an answer, or b"" once closed
        attacker.close()
    assert answers.count([b"429"]) == 4 and answers.count([]) == 2, answers
    assert until(lambda: budget.free == budget.total) and counted(aggregator, "crash_screen") == 10


def test_clients_that_never_read_their_answers_are_closed_at_the_deadline(start_aggregator):
    """Zero-window readers: connections that ask for a large answer again and again (pipelined)
    with a small receive buffer and never read; the answers stop at the buffers, and each
    connection is closed at its deadline, while others are served."""
    aggregator = start_aggregator(http_request_timeout=2.0)
    port = aggregator.http_port
    readers = []
    for _ in range(20):
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", port))
        reader.sendall(b"GET /dashboard.js HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
        readers.append(reader)
    assert until(lambda: aggregator._http.connections == 0), aggregator._http.connections
    assert http_upload(port, make_upload("os", 25), None) == 200 and counted(aggregator, "os") == 25
    for reader in readers:
        reader.close()


def h2_attacks(tmp_path, resets: int, stalled_per_connection: int, connections: int) -> None:
    """Against a `veil serve` process: rapid reset (streams opened and reset at once, without a
    token, then with one), many streams that never send their message (with a token), and
    streams whose answers cannot be sent (a receive window of zero), while a device uploads;
    memory stays within the documented bound and every upload is counted exactly."""
    budget = 16 << 20
    serve = ServeProcess(
        tmp_path,
        {**config_dict("memory", free_port(), max_inflight_bytes=budget, read_timeout=3.0), "auth": auth_section()},
    )
    serve.start()
    try:
        pid, port = serve.process.pid, serve.grpc_port
        time.sleep(1.0)
        baseline = peak = rss_bytes(pid)
        app = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(serve.endpoint))
        uploaded = devices = 0

        def device() -> None:
            nonlocal uploaded, devices, peak
            devices += 1
            batch = make_upload("crash_screen", 10, seed=devices)
            for _attempt in range(20):  # the SDK's retries, on the same batch
                try:
                    uploaded += app.Upload(batch, metadata=bearer(OTHER_UPLOAD_TOKEN), timeout=30).accepted
                    break
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    time.sleep(0.2)
            else:
                raise AssertionError("a device's upload was never served")
            peak = max(peak, rss_bytes(pid))

        for token in (None, UPLOAD_TOKEN):
            sent = 0
            while sent < resets:
                attacker = RawH2(port)
                sent += max(1, attacker.rapid_resets(UPLOAD, min(10_000, resets - sent), token))
                device()
                attacker.close()
        stalled = [RawH2(port) for _ in range(connections)]
        for attacker in stalled:
            for _ in range(stalled_per_connection):
                attacker.open_stream(UPLOAD, UPLOAD_TOKEN)
        device()
        blind = [RawH2(port, window_zero=True) for _ in range(connections)]
        for attacker in blind:
            for _ in range(stalled_per_connection):
                attacker.open_stream(SPECS, READ_TOKEN, end=True, body=b"\x00\x00\x00\x00\x00")
        for _ in range(5):
            device()
        # The read deadline cancels the stalled streams: the server ends every one of them.
        assert until(lambda: all(len(a.ended) == stalled_per_connection or a.closed.is_set() for a in stalled), 60)
        device()
        for attacker in (*stalled, *blind):
            attacker.close()
        peak = max(peak, rss_bytes(pid))
        assert within_bound(peak, baseline, budget), (baseline >> 20, peak >> 20)
        reader = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(serve.endpoint))
        answer = reader.Get(
            veil_pb2.EstimatesRequest(metric="crash_screen", window="total"), metadata=bearer(READ_TOKEN), timeout=30
        )
        assert uploaded == 10 * devices == answer.estimates[0].n, (uploaded, devices, answer.estimates[0].n)
    finally:
        serve.cleanup()


def test_rapid_reset_many_streams_and_blind_readers_on_the_grpc_listener(tmp_path):
    h2_attacks(tmp_path, resets=10_000, stalled_per_connection=100, connections=4)


@pytest.mark.slow
def test_rapid_reset_many_streams_and_blind_readers_at_length(tmp_path):
    h2_attacks(tmp_path, resets=200_000, stalled_per_connection=100, connections=20)


# --- limits per kind --------------------------------------------------------------------------


def test_health_and_reflection_streams_take_neither_watch_slots_nor_upload_threads(start_aggregator):
    aggregator = start_aggregator(workers=4, max_streams=4, sections={"auth": auth_section()})
    grpc_channel = channel(aggregator)
    health = health_pb2_grpc.HealthStub(grpc_channel)
    watchers = [health.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(4)]
    outcomes = []
    for watcher in watchers:
        try:
            outcomes.append(next(watcher).status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "server.max_health_streams" in err.details()
            outcomes.append(False)
    assert outcomes.count(True) == 2  # server.max_health_streams, by default
    estimates = veil_pb2_grpc.EstimatesStub(grpc_channel)
    streams = [
        estimates.Watch(veil_pb2.WatchRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=30) for _ in range(4)
    ]
    assert all(next(stream).estimates for stream in streams)  # every Watch slot is the read tokens'
    collector = veil_pb2_grpc.CollectorStub(grpc_channel)
    for seed in range(8):  # and the workers are the uploads'
        assert collector.Upload(make_upload("os", 10, seed=seed), metadata=bearer(UPLOAD_TOKEN), timeout=5).accepted
    for call in (*watchers, *streams):
        call.cancel()
    assert counted(aggregator, "os") == 80


def test_stream_limits_that_could_starve_uploads_are_refused():
    config = {"metrics": [WIDE], "server": {"workers": 4, "max_streams": 4, "max_concurrent_rpcs": 8}}
    with pytest.raises(ConfigError, match=r"server.max_concurrent_rpcs: expected at least server.workers \+ "):
        parse_config(config)


@pytest.mark.parametrize("interval", [math.nan, math.inf, -math.inf, -1.0])
def test_a_watch_interval_that_is_no_number_of_seconds_is_invalid(start_aggregator, interval):
    stream = veil_pb2_grpc.EstimatesStub(channel(start_aggregator())).Watch(
        veil_pb2.WatchRequest(metric="os", min_interval_seconds=interval), timeout=10
    )
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "min_interval_seconds" in err.value.details()


def test_a_cancelled_watch_frees_its_slot_at_once_whatever_interval_it_asked(start_aggregator):
    aggregator = start_aggregator(max_streams=1)
    estimates = veil_pb2_grpc.EstimatesStub(channel(aggregator))

    def watch(interval: float):
        """A stream that has sent its first estimates, once the one slot is free: the slot comes
        back when the last stream's handler hears of its cancel (at once), not an interval later."""
        for _ in range(50):
            stream = estimates.Watch(veil_pb2.WatchRequest(metric="os", min_interval_seconds=interval), timeout=30)
            try:
                assert next(stream).estimates
                return stream
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                time.sleep(0.1)
        raise AssertionError("the slot never came back")

    for interval in (1e300, 1e6, 3600.0, 0.0):  # huge ones are taken as 3600 s
        watch(interval).cancel()
    watch(0.0).cancel()


# --- rate limits in uploads and in reports ------------------------------------------------------


def test_a_token_is_limited_in_uploads_as_well_as_reports(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section(upload_rate_limit=1, upload_rate_burst=5)})
    collector = veil_pb2_grpc.CollectorStub(channel(aggregator))
    for seed in range(5):
        assert collector.Upload(make_upload("os", 1, seed=seed), metadata=bearer(UPLOAD_TOKEN), timeout=5).accepted
    with pytest.raises(grpc.RpcError) as err:
        collector.Upload(make_upload("os", 1, seed=9), metadata=bearer(UPLOAD_TOKEN), timeout=5)
    error = err.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Upload rate limit of token 'app-a': 1 uploads per second, bursts of 5" in error.details()
    assert 0 < int(dict(error.trailing_metadata())["retry-after-ms"]) <= 1000
    assert counted(aggregator, "os") == 5


def test_an_invalid_upload_costs_the_reports_it_carries_not_the_count_it_claims(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section(rate_limit=10, rate_burst=10_000)})
    collector = veil_pb2_grpc.CollectorStub(channel(aggregator))
    empty = make_upload("browser", 10)
    empty.count = 10_000
    empty.ClearField("bitmaps")
    empty.ClearField("index_sets")
    for _ in range(3):  # claims a whole burst, carries nothing
        with pytest.raises(grpc.RpcError) as err:
            collector.Upload(empty, metadata=bearer(UPLOAD_TOKEN), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    full = make_upload("browser", 10_000)
    assert collector.Upload(full, metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 10_000


# --- hostile names ------------------------------------------------------------------------------


def test_a_huge_metric_name_gets_its_refusal_not_resource_exhausted(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    grpc_channel = channel(aggregator)
    request = make_upload("browser", 10)
    request.metric = "m" * 70_000  # within the message limit, far over a client's 8 KiB for trailers
    with pytest.raises(grpc.RpcError) as err:
        veil_pb2_grpc.CollectorStub(grpc_channel).Upload(request, metadata=bearer(UPLOAD_TOKEN), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and len(err.value.details()) < 300
    with pytest.raises(grpc.RpcError) as err:
        veil_pb2_grpc.EstimatesStub(grpc_channel).Get(
            veil_pb2.EstimatesRequest(metric="m" * 70_000), metadata=bearer(READ_TOKEN), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(err.value.details()) < 300
    with pytest.raises(grpc.RpcError) as err:
        veil_pb2_grpc.EstimatesStub(grpc_channel).Get(
            veil_pb2.EstimatesRequest(metric="os", window="w" * 70_000), metadata=bearer(READ_TOKEN), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(err.value.details()) < 300


# --- fuzzing the HTTP listener and the Estimates service ----------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
SLOW_EXAMPLES = int(os.environ.get("VEIL_FUZZ_EXAMPLES", 3000))


def fuzzing(examples: int):
    return hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )


PROTECTED = (b'{"generated', b"# HELP")  # the start of /v1/estimates and /metrics bodies
PATHS = st.one_of(
    st.sampled_from(
        [
            "/v1/estimates",
            "/v1/estimates/os",
            "/metrics",
            "/healthz",
            "/",
            "/dashboard.js",
            "/v1/estimates/",
            "//v1/estimates",
            "/v1/../metrics",
            "/v1/estimates/%2e%2e/metrics",
            "/%761/estimates",
            "/V1/ESTIMATES",
            "/metrics?x=1",
            "/v1/estimates/os?window=1h",
            "/v1/estimates/%00",
            "/v1/estimates/" + "a" * 9000,
            "*",
            "http://x/metrics",
        ]
    ),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60).map(lambda p: "/" + p),
)
AUTHORIZATIONS = st.sampled_from(
    [
        None,
        f"Bearer {READ_TOKEN}",
        f"Bearer {UPLOAD_TOKEN}",
        f"bearer {READ_TOKEN}",
        "Bearer",
        "Basic eDp5",
        f"Bearer {READ_TOKEN}x",
        "Bearer " + "a" * 9000,
    ]
)
METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "get", "G\x00T"])


def test_fuzzed_http_requests_never_fail_the_server_nor_pass_the_token_check(start_aggregator, tally, caplog):
    fuzz_http(start_aggregator, tally, caplog, 150)


@pytest.mark.slow
def test_fuzzed_http_requests_at_length(start_aggregator, tally, caplog):
    fuzz_http(start_aggregator, tally, caplog, SLOW_EXAMPLES)


def fuzz_http(start_aggregator, tally, caplog, examples: int) -> None:
    caplog.set_level(logging.DEBUG)
    # A request whose body never comes waits for its deadline: 1 s, within the client's 10 s.
    aggregator = start_aggregator(http_request_timeout=1.0, sections={"auth": auth_section()})
    port = aggregator.http_port
    statuses: dict[int, int] = {}

    @fuzzing(examples)
    @hypothesis.example("GET", "/v1/estimates", None, "HTTP/1.1", (b"", b""))
    @hypothesis.example("HEAD", "/metrics", f"Bearer {READ_TOKEN}", "HTTP/1.0", (b"", b""))
    @hypothesis.given(
        METHODS,
        PATHS,
        AUTHORIZATIONS,
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9"]),
        st.sampled_from(
            [
                (b"", b""),
                (b"Content-Length: 5\r\n", b"hello"),
                (b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
                (b"Content-Length: 99999999999\r\n", b"x"),
                (b"Accept-Encoding: gzip\r\n", b""),
                (b"X: " + b"y" * 9000 + b"\r\n", b""),
            ]
        ),
    )
    def check(method, path, authorization, version, extra):
        head = f"{method} {path} {version}\r\nHost: x\r\n".encode("latin-1", "replace") + extra[0]
        if authorization:
            head += f"Authorization: {authorization}\r\n".encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(head + b"Connection: close\r\n\r\n" + extra[1])
            connection.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        if not answer:
            return  # closed without an answer: a request too broken to be one
        status_line, _, rest = answer.partition(b"\r\n")
        status = int(status_line.split()[1])
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500 or status == 503, answer[:300]
        body = rest.partition(b"\r\n\r\n")[2]
        if status == 200 and body.startswith(PROTECTED):
            assert authorization in (f"Bearer {READ_TOKEN}", f"bearer {READ_TOKEN}"), (method, path)

    check()
    for status, n in statuses.items():
        tally[f"http fuzz: status {status}"] += n
    assert {200, 400, 401, 404, 405} <= set(statuses)
    assert urllib_status(port, "/healthz") == 200
    # Nothing logged, by Veil or by the HTTP library, names the client or quotes its tokens.
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "127.0.0.1" not in logged and READ_TOKEN not in logged and "Bearer aaa" not in logged


def urllib_status(port: int, path: str) -> int:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    client.request("GET", path)
    return client.getresponse().status


def test_fuzzed_estimates_requests_get_a_meaningful_status(start_aggregator, tally):
    fuzz_estimates(start_aggregator, tally, 150)


@pytest.mark.slow
def test_fuzzed_estimates_requests_at_length(start_aggregator, tally):
    fuzz_estimates(start_aggregator, tally, SLOW_EXAMPLES)


def fuzz_estimates(start_aggregator, tally, examples: int) -> None:
    aggregator = start_aggregator(max_streams=4)
    stub = veil_pb2_grpc.EstimatesStub(channel(aggregator))
    names = st.one_of(
        st.sampled_from(["", "os", "browser", "1h", "total"]),
        st.text(max_size=50),
        st.integers(1, 35_000).map(lambda n: "x" * n),
    )  # two fit in the message limit
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}

    @fuzzing(examples)
    @hypothesis.given(names, names, st.floats(allow_nan=True, allow_infinity=True), st.booleans())
    def check(metric, window, interval, watch):
        try:
            if watch:
                stream = stub.Watch(
                    veil_pb2.WatchRequest(metric=metric, window=window, min_interval_seconds=interval), timeout=10
                )
                next(stream)
                stream.cancel()
            else:
                stub.Get(veil_pb2.EstimatesRequest(metric=metric, window=window), timeout=10)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
            assert len(details) < 400
        tally[f"estimates fuzz: status {code.name}"] += 1
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # only a cancelled stream's slot not yet back
            assert watch and "server.max_streams" in details
            return
        assert code in allowed, (code, len(metric), len(window), interval)
        if watch and code == grpc.StatusCode.INVALID_ARGUMENT:
            assert not (math.isfinite(interval) and interval >= 0)

    check()
