"""Abuse of a running aggregator from outside, one class at a time (issue 15): floods of large
tokenless uploads, slow HTTP clients, streams of every kind, rate limits in uploads and in
reports, hostile names and intervals, and the HTTP protocol itself. Everything goes over real
gRPC and HTTP on loopback; the flood runs against a `veil serve` process whose memory is read
from /proc."""

from __future__ import annotations

import gzip
import http.client
import json
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
from config_toml import config_toml
from running import (METRICS, READ_TOKEN, UPLOAD_TOKEN, InProcessAggregators, ServeProcess, auth_section, bearer,
                     config_dict, counted, make_upload)

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import max_message_bytes
from veil.aggregator._errors import ConfigError
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

UPLOAD = "/veil.wire.v1.Collector/Upload"


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


def test_a_tokenless_flood_of_large_uploads_keeps_memory_bounded_and_uploads_flowing(tmp_path):
    """64 tokenless 8 MB uploads at once, over and over, while an app uploads with its token:
    the server's memory stays within its in-flight budget and a fixed allowance, and the app's
    uploads go through (retrying RESOURCE_EXHAUSTED as the SDK does)."""
    serve = ServeProcess(tmp_path, "memory")
    serve.config.write_text(config_toml({**config_dict("memory", serve.grpc_port, max_inflight_bytes=BUDGET),
                                         "metrics": [*METRICS, WIDE], "auth": auth_section()}))
    serve.start()
    try:
        pid = serve.process.pid
        limit = max_message_bytes(parse_config({"metrics": [WIDE]}))
        assert limit > 10 << 20  # k = 1024 at max_batch 10,000: the widest metric sets gRPC's limit
        time.sleep(1.0)
        baseline = rss_bytes(pid)
        payload = b"\x0a" + b"\xff" * 5 + b"\x00" * (8 << 20)  # 8 MB, tokenless: refused
        stop = threading.Event()
        flooders = grpc.insecure_channel(serve.endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
        raw = flooders.unary_unary(UPLOAD, request_serializer=None, response_deserializer=None)
        codes: dict[str, int] = {}

        def flood() -> None:
            while not stop.is_set():
                try:
                    raw(payload, timeout=10)
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.RpcError as err:
                    codes[err.code().name] = codes.get(err.code().name, 0) + 1

        peak = baseline
        with futures.ThreadPoolExecutor(64) as pool:
            for _ in range(64):
                pool.submit(flood)
            app = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(serve.endpoint))
            tried = accepted = 0
            deadline = time.monotonic() + 8
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
        assert set(codes) <= {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"} and codes.get("UNAUTHENTICATED"), codes
        assert accepted == tried and tried >= 5, (accepted, tried)
        # The budget's bytes, held in gRPC's buffer and Python's copy, and a fixed allowance for
        # the flood's HTTP/2 windows and connections.
        assert peak - baseline < 2 * BUDGET + (96 << 20), (baseline >> 20, peak >> 20, codes)
    finally:
        serve.stop()


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
    streams = [estimates.Watch(veil_pb2.WatchRequest(metric="os"), metadata=bearer(READ_TOKEN), timeout=30)
               for _ in range(4)]
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
        veil_pb2.WatchRequest(metric="os", min_interval_seconds=interval), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "min_interval_seconds" in err.value.details()


def test_a_cancelled_watch_frees_its_slot_at_once_whatever_interval_it_asked(start_aggregator):
    aggregator = start_aggregator(max_streams=1)
    estimates = veil_pb2_grpc.EstimatesStub(channel(aggregator))
    for interval in (1e300, 1e6, 3600.0):  # huge ones are taken as 3600 s
        stream = estimates.Watch(veil_pb2.WatchRequest(metric="os", min_interval_seconds=interval), timeout=30)
        assert next(stream).estimates
        stream.cancel()
        tries = 0
        while True:  # the slot comes back once the handler hears of the cancel, not an interval later
            tries += 1
            try:
                probe = estimates.Watch(veil_pb2.WatchRequest(metric="os"), timeout=30)
                assert next(probe).estimates
                probe.cancel()
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and tries < 50
                time.sleep(0.1)


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
        veil_pb2_grpc.EstimatesStub(grpc_channel).Get(veil_pb2.EstimatesRequest(metric="m" * 70_000),
                                                      metadata=bearer(READ_TOKEN), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(err.value.details()) < 300
    with pytest.raises(grpc.RpcError) as err:
        veil_pb2_grpc.EstimatesStub(grpc_channel).Get(
            veil_pb2.EstimatesRequest(metric="os", window="w" * 70_000), metadata=bearer(READ_TOKEN), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(err.value.details()) < 300
