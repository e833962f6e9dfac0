"""The device-day: what one device costs the aggregator in a day, against a do-nothing server.

A device with 10 metrics (subset design, epsilon 1, k = 2, 4, ..., 1024; windows total, 1h, 1d)
reports once a day per metric (the default rule), so its day at the aggregator is: a NEW TLS
connection (a full handshake: server certificate from veil_testing.pki, no session resumption),
the specs check, ONE upload carrying its 10 metrics, then close. Revision 2 of the protocol:

  gRPC   Collector/GetMetricSpecs with if_version = the version the device holds (answer:
         unchanged), then Collector/UploadBatches with 10 one-report batches (fresh batch ids,
         made_unix the current slot), on a new channel (its own connection), then closed;
  HTTP   GET /v1/specs with If-None-Match (answer: 304), then POST /v1/uploads with the same
         10 batches as proto3 JSON (what the TypeScript SDK sends), on a new HTTPS connection.

An aggregator without revision 2's calls (UploadBatches UNIMPLEMENTED, POST /v1/uploads 404, no
specs_version) gets the revision-1 day instead, and the results say so (`calls`): the full specs
fetch and one Upload (POST /v1/upload) per metric, all on the one connection.

Against it, in the same run: a do-nothing grpcio server (the aggregator's thread settings:
server.workers handler threads, max_concurrent_rpcs) and a do-nothing aiohttp server, both with
TLS from the same files, whose handlers answer the same calls at once, without work, with the
answers the aggregator gives (the specs answer captured from it beforehand; UploadBatches: 10 OK
results; HTTP: 304 and a 200 JSON). The same load processes (spawned, grpc.aio and asyncio, the
requests made and serialized before the clock starts) send both the same device-days, in rounds
A-B-B-A (half the do-nothing server's, half the aggregator's, the other halves in reverse
order), each side measured by its own process's CPU (/proc/PID/stat, all threads); the ratio
(aggregator device-days per CPU second / the do-nothing server's) is taken per round, and its
median reported with every round's. Goal (issue 26): >= 75%.

Beside it, the keep-alive cell, from the same rounds' machinery: 10-report uploads of one metric
(k = 16) on connections opened before the clock starts (Collector/Upload; HTTP POST /v1/upload),
64 in flight, against the same do-nothing servers, as bench_capacity.py measures it (here with
TLS).

Stores: SQLite (the default embedded store, a file on disk, every commit fsynced), one
redis-server and a 3-master Redis Cluster (veil_testing's, started here on free ports; the Redis
masters' CPU per device-day from INFO cpu). Every acknowledged report is checked exactly in the
store (bench_ingest's Ledger) after every cell. The model: aggregator device-days per core-second,
and so devices per core at one device-day per device per day with a 10x peak over the average.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import http.client
import json
import math
import os
import shlex
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _aggregator import CALL_TIMEOUT, COUNTS_PATH, AggregatorProcess, config_dict, metric_name
from _goals import EFFICIENCY_GOAL
from _load import GRAIN, Ledger, LoadProcesses, Masters, ReportPool, answer_commands
from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, write_results
from veil_testing.pki import Pki
from veil_testing.redis_cluster import RedisClusterServers
from veil_testing.redis_server import RedisServer

METRIC_KS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # a device's 10 metrics
KEEPALIVE_K = 16  # the keep-alive cell's metric
KEEPALIVE_BATCH = 10
EPSILON = 1.0
STORES = ("memory", "sqlite", "redis", "cluster")
PROTOCOLS = ("grpc", "http")
SEED = 20240601
SECONDS_PER_DAY = 86_400
PEAK = 10  # the model's peak over the average
FLEET = 100_000_000  # the devices docs/operating.md sizes for

SERVICE = "veil.wire.v1.Collector"
PATHS = {name: f"/{SERVICE}/{name}" for name in ("GetMetricSpecs", "Upload", "UploadBatches")}

CALLS = {
    ("grpc", 2): "new TLS connection; GetMetricSpecs(if_version) -> unchanged; UploadBatches(10 one-report batches)",
    ("grpc", 1): "new TLS connection; GetMetricSpecs (full answer: no specs_version); 10 Upload calls "
    "(UploadBatches UNIMPLEMENTED)",
    ("http", 2): "new TLS connection; GET /v1/specs If-None-Match -> 304; POST /v1/uploads (10 one-report "
    "batches, JSON)",
    ("http", 1): "new TLS connection; GET /v1/specs (full answer: no ETag); 10 POST /v1/upload (JSON, "
    "keep-alive; POST /v1/uploads 404)",
}
KEEPALIVE_CALLS = {
    "grpc": "Upload of 10 reports on an open TLS connection",
    "http": "POST /v1/upload of 10 reports (JSON) on an open TLS connection",
}


# --- the reports ----------------------------------------------------------------------------


def sent_counts(pool: ReportPool, reports: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, V) of the pool's first ``reports`` reports, any number of them (ReportPool.counts
    knows multiples of GRAIN only): the packed reports read back into rows and counted."""
    from veil.aggregator.simulate import count_reports

    spec = pool.spec
    packed = pool.packed[:reports]
    if pool.bitmaps:
        bits = np.unpackbits(packed, axis=1, bitorder="little")[:, : spec.k]
        rows = np.nonzero(bits)[1].reshape(reports, spec.q)  # every report has q categories
    else:
        rows = np.ascontiguousarray(packed).view("<u4").reshape(reports, spec.q)
    counts = count_reports(spec, rows)
    return counts.n, counts.v


def with_slot(upload: bytes, resolution: int) -> Any:
    """A serialized UploadRequest as a message, made_unix set to the current slot."""
    from veil.wire.v1 import veil_pb2

    request = veil_pb2.UploadRequest.FromString(upload)
    request.made_unix = int(time.time()) // resolution * resolution
    return request


class DeviceReports:
    """One load process's reports: a ReportPool per metric (seeded, randomized before any
    timing); device i of a run sends report i of every metric."""

    def __init__(self, ks: tuple[int, ...], seed: int, stream: int, reports: int) -> None:
        self.pools = {k: ReportPool(k, EPSILON, seed, stream) for k in ks}
        for pool in self.pools.values():
            pool.extend(reports)
        for pool in self.pools.values():  # the read-back agrees with the pool's own prefix counts
            n, v = sent_counts(pool, GRAIN)
            if not (np.array_equal(n, pool.counts(GRAIN)[0]) and np.array_equal(v, pool.counts(GRAIN)[1])):
                raise AssertionError(f"{pool.metric.name}: the reports read back differ from the pool's counts")

    def counts(self, metrics: list[int], reports: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {self.pools[k].metric.name: sent_counts(self.pools[k], reports) for k in metrics}


# --- the do-nothing servers -----------------------------------------------------------------


def null_grpc(answers_file: str, port_file: str, pki_dir: str, workers: int, max_rpcs: int) -> int:
    """A grpcio server with the aggregator's thread settings and TLS whose Collector methods
    return their stored answer at once."""
    from concurrent import futures

    import grpc

    answers = {name: base64.b64decode(a) for name, a in json.loads(Path(answers_file).read_text())["grpc"].items()}

    def answering(answer: bytes) -> Any:
        def handle(request: bytes, context: Any) -> bytes:
            return answer

        return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None, response_serializer=None)

    handler = grpc.method_handlers_generic_handler(SERVICE, {name: answering(a) for name, a in answers.items()})
    server = grpc.server(futures.ThreadPoolExecutor(workers), handlers=[handler], maximum_concurrent_rpcs=max_rpcs)
    directory = Path(pki_dir)
    credentials = grpc.ssl_server_credentials(
        [((directory / "server.key").read_bytes(), (directory / "server.crt").read_bytes())]
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    Path(port_file).write_text(str(port))
    server.wait_for_termination()
    return 0


def null_http(answers_file: str, port_file: str, pki_dir: str) -> int:
    """An aiohttp server with TLS (the aggregator's settings: TLS 1.2 and up, no request log)
    answering GET /v1/specs (304 when If-None-Match names its ETag, else the stored specs), POST
    /v1/uploads and POST /v1/upload (the stored JSON answer, once the body is read) at once."""
    import socket

    from aiohttp import web

    answers = json.loads(Path(answers_file).read_text())["http"]
    etag = answers["etag"]
    json_type = "application/json"

    async def specs(request: web.Request) -> web.Response:
        if etag is not None and request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        return web.Response(body=answers["specs"].encode(), content_type=json_type)

    def upload(answer: str) -> Any:
        body = answer.encode()

        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type=json_type)

        return handle

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(Path(pki_dir) / "server.crt", Path(pki_dir) / "server.key")
    app = web.Application()
    app.router.add_get("/v1/specs", specs)
    app.router.add_post("/v1/uploads", upload(answers["uploads"]))
    app.router.add_post("/v1/upload", upload(answers["upload"]))

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock, ssl_context=context)
        await site.start()
        Path(port_file).write_text(str(sock.getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


class NullServer:
    """A do-nothing server subprocess (this file with --null grpc|http) and its port."""

    def __init__(self, protocol: str, answers: Path, pki: Pki, scratch: Path, workers: int, max_rpcs: int) -> None:
        port_file = scratch / f"null-{protocol}-{answers.stem}.port"
        command = [sys.executable, str(Path(__file__).resolve()), "--null", protocol, "--answers", str(answers)]
        command += ["--port-file", str(port_file), "--pki", str(pki.dir), "--workers", str(workers)]
        command += ["--max-rpcs", str(max_rpcs)]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the do-nothing {protocol} server did not start ({self.process.returncode})")
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


# --- the aggregator and what it answers ------------------------------------------------------


def https(pki: Pki, port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """One HTTPS request on a fresh connection: (status, headers, body)."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=CALL_TIMEOUT, context=pki.ssl_context())
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


class TlsAggregator(AggregatorProcess):
    """bench_ingest's aggregator process, its listeners serving TLS: the memory and SQLite
    stores are read back over HTTPS."""

    def __init__(self, store: str, store_url: str, config: dict[str, Any], directory: Path, pki: Pki) -> None:
        self.pki = pki
        super().__init__(store, store_url, {**config, "tls": pki.tls_section()}, directory)

    def counts(self, metrics: list[str] | None = None) -> dict[str, Any]:
        if self.redis is not None:
            return super().counts(metrics)
        status, _, body = https(self.pki, self.http_port, "GET", COUNTS_PATH)
        if status != 200:
            raise RuntimeError(f"{COUNTS_PATH} answered {status}")
        found = json.loads(body)
        return found if metrics is None else {m: found[m] for m in metrics}


def revision(aggregator: TlsAggregator, pki: Pki) -> dict[str, Any]:
    """What the aggregator speaks (revision 2's calls or not, per protocol), the answers a
    device-day gets to its specs check (for the do-nothing servers to give too), and each
    metric's time resolution. Nothing here is counted."""
    import grpc
    from google.protobuf import json_format

    from veil.wire.v1 import veil_pb2

    with grpc.secure_channel(aggregator.endpoint, pki.channel_credentials()) as channel:
        specs_call = channel.unary_unary(
            PATHS["GetMetricSpecs"],
            request_serializer=None,
            response_deserializer=veil_pb2.GetMetricSpecsResponse.FromString,
        )
        full = specs_call(veil_pb2.GetMetricSpecsRequest().SerializeToString(), timeout=CALL_TIMEOUT)
        version = full.specs_version
        specs_request = veil_pb2.GetMetricSpecsRequest(if_version=version).SerializeToString()
        answer = specs_call(specs_request, timeout=CALL_TIMEOUT) if version else full
        if version and not answer.unchanged:
            raise RuntimeError("GetMetricSpecs with the current if_version did not answer unchanged")
        batches_call = channel.unary_unary(PATHS["UploadBatches"], request_serializer=None, response_deserializer=None)
        try:
            batches_call(b"", timeout=CALL_TIMEOUT)  # no batches: nothing to count (refused, or no results)
            grpc_revision = 2
        except grpc.RpcError as err:
            grpc_revision = 1 if err.code() == grpc.StatusCode.UNIMPLEMENTED else 2
    grpc_revision = grpc_revision if version else 1
    status, headers, specs_body = https(pki, aggregator.http_port, "GET", "/v1/specs")
    if status != 200:
        raise RuntimeError(f"GET /v1/specs answered {status}")
    etag = next((v for k, v in headers.items() if k.lower() == "etag"), None)
    if etag is not None:
        status, _, _ = https(pki, aggregator.http_port, "GET", "/v1/specs", headers={"If-None-Match": etag})
        if status != 304:
            raise RuntimeError(f"GET /v1/specs with If-None-Match its ETag answered {status}, not 304")
    status, _, _ = https(
        pki, aggregator.http_port, "POST", "/v1/uploads", b'{"batches": []}', {"Content-Type": "application/json"}
    )
    http_revision = 2 if etag is not None and status != 404 else 1
    ten = veil_pb2.UploadBatchesResponse(
        results=[veil_pb2.BatchResult(accepted=1) for _ in METRIC_KS], specs_version=version
    )
    one = veil_pb2.UploadResponse(accepted=KEEPALIVE_BATCH, specs_version=version)
    return {
        "revision": {"grpc": grpc_revision, "http": http_revision},
        "specs_version": version,
        "etag": etag,
        "resolution": {s.name: s.time_resolution_seconds or s.period_seconds or SECONDS_PER_DAY for s in full.specs},
        "answers": {
            "grpc": {
                "GetMetricSpecs": base64.b64encode(answer.SerializeToString()).decode(),
                "Upload": base64.b64encode(one.SerializeToString()).decode(),
                "UploadBatches": base64.b64encode(ten.SerializeToString()).decode(),
            },
            "http": {
                "etag": etag,
                "specs": specs_body.decode(),
                "uploads": json_format.MessageToJson(ten, indent=None),
                "upload": json.dumps({"accepted": KEEPALIVE_BATCH, "duplicate": False}),
            },
        },
    }


# --- the load processes ---------------------------------------------------------------------


def day_load_process(conn: Any, index: int) -> None:
    """A load process: "prepare" randomizes its reports, "run" sends a turn (set up, "ready",
    wait for "go", send, answer with what was acknowledged)."""
    held: list[DeviceReports] = []

    def handle(command: str, arguments: Any) -> Any:
        if command == "prepare":
            held[:] = [DeviceReports(tuple(arguments["ks"]), arguments["seed"], index, arguments["reports"])]
            return None
        if command == "run":
            return asyncio.run(_send(conn, held[0], **arguments))
        raise ValueError(f"unknown command {command!r}")

    answer_commands(conn, handle)


def _http_request(method: str, path: str, port: int, body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *headers]
    if method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 request on an open connection and its answer (status, body)."""
    writer.write(request)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])}
    if "chunked" in fields.get("transfer-encoding", ""):
        raise RuntimeError("a chunked answer: the benchmark reads Content-Length bodies only")
    return int(head[0].split()[1]), await reader.readexactly(int(fields.get("content-length") or 0))


async def _send(
    conn: Any,
    reports: DeviceReports,
    kind: str,
    protocol: str,
    revision: int,
    port: int,
    devices: int,
    in_flight: int,
    specs_version: str,
    etag: str | None,
    resolution: dict[str, int],
    ca_file: str,
    counted: bool,
) -> dict[str, Any]:
    """One turn: ``devices`` device-days (kind "day") or 10-report uploads on open connections
    (kind "keepalive"), ``in_flight`` at a time; every request serialized before "ready"."""
    import grpc
    from google.protobuf import json_format

    from veil.wire.v1 import veil_pb2

    metrics = list(reports.pools) if kind == "day" else [KEEPALIVE_K]
    per_device = 1 if kind == "day" else KEEPALIVE_BATCH
    uploads = {
        k: [
            with_slot(u, resolution[reports.pools[k].metric.name])
            for u in reports.pools[k].uploads(per_device, devices * per_device)
        ]
        for k in metrics
    }
    if kind == "day" and revision == 2:
        batches = [veil_pb2.UploadBatchesRequest(batches=[uploads[k][i] for k in metrics]) for i in range(devices)]
        if protocol == "grpc":
            bodies: list[Any] = [[b.SerializeToString()] for b in batches]
        else:
            bodies = [
                [_http_request("POST", "/v1/uploads", port, json_format.MessageToJson(b, indent=None).encode())]
                for b in batches
            ]
    elif protocol == "grpc":
        bodies = [[uploads[k][i].SerializeToString() for k in metrics] for i in range(devices)]
    else:
        bodies = [
            [
                _http_request(
                    "POST", "/v1/upload", port, json_format.MessageToJson(uploads[k][i], indent=None).encode()
                )
                for k in metrics
            ]
            for i in range(devices)
        ]
    endpoint = f"127.0.0.1:{port}"
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
    context = ssl.create_default_context(cafile=ca_file)
    specs_grpc = veil_pb2.GetMetricSpecsRequest(if_version=specs_version).SerializeToString()
    specs_http = _http_request("GET", "/v1/specs", port, headers=(f"If-None-Match: {etag}",) if etag else ())
    upload_path = PATHS["UploadBatches" if kind == "day" and revision == 2 else "Upload"]
    decode = (
        veil_pb2.UploadBatchesResponse.FromString
        if upload_path.endswith("Batches")
        else veil_pb2.UploadResponse.FromString
    )
    accepted = duplicates = resumed = 0
    refusals: list[str] = []
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel; no TLS session cache

    def tally(answer: Any) -> None:
        nonlocal accepted, duplicates
        for result in answer.results if hasattr(answer, "results") else [answer]:
            if getattr(result, "code", 0):
                refusals.append(f"code {result.code}: {result.message}")
            accepted += result.accepted
            duplicates += result.duplicate

    def tally_json(status: int, body: bytes) -> None:
        if status != 200:
            refusals.append(f"HTTP {status}: {body[:200]!r}")
            return
        if upload_path.endswith("Batches"):
            tally(json_format.Parse(body, veil_pb2.UploadBatchesResponse(), ignore_unknown_fields=True))
        else:
            tally(json_format.Parse(body, veil_pb2.UploadResponse(), ignore_unknown_fields=True))

    async def grpc_day(calls: list[bytes]) -> None:
        channel = grpc.aio.secure_channel(endpoint, credentials, options=options)
        try:
            specs = await channel.unary_unary(
                PATHS["GetMetricSpecs"],
                request_serializer=None,
                response_deserializer=veil_pb2.GetMetricSpecsResponse.FromString,
            )(specs_grpc if revision == 2 else b"", timeout=CALL_TIMEOUT)
            if revision == 2 and not specs.unchanged:
                refusals.append("GetMetricSpecs(if_version) did not answer unchanged")
            upload = channel.unary_unary(upload_path, request_serializer=None, response_deserializer=decode)
            for body in calls:
                tally(await upload(body, timeout=CALL_TIMEOUT))
        finally:
            await channel.close()

    async def http_day(calls: list[bytes]) -> None:
        nonlocal resumed
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        try:
            resumed += writer.get_extra_info("ssl_object").session_reused
            status, _ = await _exchange(reader, writer, specs_http)
            if status != (304 if etag else 200):
                refusals.append(f"GET /v1/specs answered {status}")
            for body in calls:
                tally_json(*await _exchange(reader, writer, body))
        finally:
            writer.close()
            await writer.wait_closed()

    next_device = 0

    async def day_slot() -> None:
        nonlocal next_device
        while next_device < devices:
            calls = bodies[next_device]
            next_device += 1
            await (grpc_day if protocol == "grpc" else http_day)(calls)

    async def connect() -> Any:
        if protocol == "grpc":
            channel = grpc.aio.secure_channel(endpoint, credentials, options=options)
            await asyncio.wait_for(channel.channel_ready(), 30)
            return channel
        return await asyncio.open_connection("127.0.0.1", port, ssl=context)

    async def keepalive_slot(connection: Any) -> None:
        nonlocal next_device
        upload = None
        if protocol == "grpc":
            upload = connection.unary_unary(upload_path, request_serializer=None, response_deserializer=decode)
        while next_device < devices:
            calls = bodies[next_device]
            next_device += 1
            for body in calls:
                if upload is not None:
                    tally(await upload(body, timeout=CALL_TIMEOUT))
                else:
                    tally_json(*await _exchange(*connection, body))

    # The keep-alive cell's connections are opened before the clock starts.
    connections = await asyncio.gather(*(connect() for _ in range(in_flight))) if kind == "keepalive" else []
    gc.collect()
    conn.send(("ready", None))
    conn.recv()  # "go": blocking the loop here is fine, nothing is in flight yet
    gc.disable()
    try:
        start = time.monotonic()
        if kind == "day":
            await asyncio.gather(*(day_slot() for _ in range(in_flight)))
        else:
            await asyncio.gather(*(keepalive_slot(c) for c in connections))
        end = time.monotonic()
    finally:
        gc.enable()
        for connection in connections:
            if protocol == "grpc":
                await connection.close()
            else:
                connection[1].close()
                await connection[1].wait_closed()
    counts = reports.counts(metrics, devices * per_device) if counted else {}
    return {
        "start": start,
        "end": end,
        "devices": devices,
        "accepted": accepted,
        "duplicates": duplicates,
        "refusals": refusals[:5],
        "refused": len(refusals),
        "tls_sessions_resumed": resumed,
        "counts": counts,
    }


# --- the measurement ------------------------------------------------------------------------


class Cell:
    """One cell (a store, a protocol, device-days or keep-alive uploads): its turns against the
    aggregator and the do-nothing server, the exact checks of what the aggregator acknowledged."""

    def __init__(
        self,
        load: LoadProcesses,
        aggregator: TlsAggregator,
        null: NullServer,
        masters: Masters | None,
        ledger: Ledger,
        info: dict[str, Any],
        kind: str,
        protocol: str,
        args: argparse.Namespace,
    ) -> None:
        self.load, self.aggregator, self.null, self.masters, self.ledger = load, aggregator, null, masters, ledger
        self.kind, self.protocol = kind, protocol
        self.revision = info["revision"][protocol]
        processes = len(load.pipes)
        self.in_flight = (args.in_flight if kind == "day" else args.keepalive_in_flight) // processes
        self.devices = args.devices if kind == "day" else args.keepalive_calls
        self.per_device = len(METRIC_KS) if kind == "day" else KEEPALIVE_BATCH
        self.arguments = {
            "kind": kind,
            "protocol": protocol,
            "revision": self.revision,
            "in_flight": self.in_flight,
            "specs_version": info["specs_version"],
            "etag": info["etag"] if protocol == "http" and self.revision == 2 else None,
            "resolution": info["resolution"],
            "ca_file": str(aggregator.pki.ca),
        }

    def _port(self, of: str) -> int:
        if of == "null":
            return self.null.port
        if self.protocol == "http":
            return self.aggregator.http_port
        return int(self.aggregator.endpoint.rpartition(":")[2])

    def turn(self, of: str, devices: int) -> dict[str, Any]:
        """One turn: every load process sends ``devices`` device-days (or uploads) to the
        aggregator or the do-nothing server. CPU seconds of that server, and of the masters."""
        counted = of == "aggregator"
        pids = self.aggregator.pids if counted else self.null.pid
        masters_before = self.masters.seconds() if self.masters and counted else []
        results, used = self.load.go(
            {**self.arguments, "port": self._port(of), "devices": devices, "counted": counted}, {"server": pids}
        )
        masters_after = self.masters.seconds() if self.masters and counted else []
        sent = sum(r["devices"] for r in results)
        refused = sum(r["refused"] for r in results)
        where = f"{self.aggregator.store} {self.protocol} {self.kind}"
        if refused:
            examples = "; ".join(r for result in results for r in result["refusals"])
            self.ledger.failures.append(f"{where} ({of}): {refused} answers wrong or refused, e.g. {examples[:600]}")
        if counted:
            accepted = sum(r["accepted"] for r in results)
            duplicates = sum(r["duplicates"] for r in results)
            if accepted != sent * self.per_device or duplicates:
                self.ledger.failures.append(
                    f"{where}: {accepted} of {sent * self.per_device} reports acknowledged, {duplicates} duplicates"
                )
            for result in results:
                for metric, (n, v) in result["counts"].items():
                    self.ledger.add(self.aggregator.store, metric, n, v)
        return {
            "cpu": used["server"],
            "devices": sent,
            "seconds": max(r["end"] for r in results) - min(r["start"] for r in results),
            "masters": [a - b for a, b in zip(masters_after, masters_before)],
            "tls_sessions_resumed": sum(r["tls_sessions_resumed"] for r in results),
        }

    def measure(self, rounds: int) -> dict[str, Any]:
        """A warm-up turn each, then rounds of A-B-B-A (do-nothing server, aggregator, aggregator,
        do-nothing server; half the devices each), the ratio per round; then the exact check."""
        self.turn("aggregator", self.in_flight)
        self.turn("null", self.in_flight)
        half = max(1, self.devices // 2)
        samples = []
        resumed = 0
        for _ in range(rounds):
            turns = [self.turn(of, half) for of in ("null", "aggregator", "aggregator", "null")]
            resumed += sum(t["tls_sessions_resumed"] for t in turns)
            null, mine = (turns[0], turns[3]), (turns[1], turns[2])
            days = sum(t["devices"] for t in mine)
            samples.append(
                {
                    "null_us": sum(t["cpu"] for t in null) / sum(t["devices"] for t in null) * 1e6,
                    "aggregator_us": sum(t["cpu"] for t in mine) / days * 1e6,
                    "per_second": days / sum(t["seconds"] for t in mine),
                    "masters_us": [sum(m) / days * 1e6 for m in zip(*(t["masters"] for t in mine))],
                }
            )
        metrics = [metric_name(k, EPSILON) for k in (METRIC_KS if self.kind == "day" else (KEEPALIVE_K,))]
        exact = self.ledger.verify(self.aggregator, metrics)
        # A turn too short for a CPU tick (--quick) leaves its round's ratio undefined.
        ratios = [s["null_us"] / s["aggregator_us"] if s["aggregator_us"] else None for s in samples]
        defined = [r for r in ratios if r is not None]
        unit = "device_day" if self.kind == "day" else "upload"
        masters = [statistics.median(s["masters_us"][i] for s in samples) for i in range(len(samples[0]["masters_us"]))]
        return {
            "store": self.aggregator.store,
            "protocol": self.protocol,
            "kind": self.kind,
            "revision": self.revision,
            "calls": CALLS[self.protocol, self.revision] if self.kind == "day" else KEEPALIVE_CALLS[self.protocol],
            "in_flight": self.in_flight * len(self.load.pipes),
            "per_round": half * 2 * len(self.load.pipes),
            "ratio": statistics.median(defined) if defined else None,
            "ratio_rounds": [None if r is None else round(r, 3) for r in ratios],
            f"aggregator_us_per_{unit}": statistics.median(s["aggregator_us"] for s in samples),
            f"aggregator_us_per_{unit}_rounds": [round(s["aggregator_us"], 1) for s in samples],
            f"null_us_per_{unit}": statistics.median(s["null_us"] for s in samples),
            f"null_us_per_{unit}_rounds": [round(s["null_us"], 1) for s in samples],
            f"{unit}s_per_second": statistics.median(s["per_second"] for s in samples),
            f"masters_us_per_{unit}": masters,
            "tls_sessions_resumed": resumed,
            "exact": exact,
        }


def model(row: dict[str, Any]) -> dict[str, Any] | None:
    """Devices per aggregator core at one device-day per device per day and a peak of PEAK times
    the average; the cores (and Redis masters) FLEET devices need at the peak. None where no
    aggregator CPU was measured (--quick)."""
    if not row["aggregator_us_per_device_day"]:
        return None
    per_core_second = 1e6 / row["aggregator_us_per_device_day"]
    devices_per_core = per_core_second * SECONDS_PER_DAY / PEAK
    masters_us = sum(row["masters_us_per_device_day"])
    peak = FLEET / SECONDS_PER_DAY * PEAK
    return {
        "device_days_per_core_second": per_core_second,
        "devices_per_core": devices_per_core,
        "fleet": FLEET,
        "fleet_device_days_per_second": {"average": FLEET / SECONDS_PER_DAY, "peak": peak},
        "fleet_cores": math.ceil(FLEET / devices_per_core),
        "masters_us_per_device_day": masters_us,
        "fleet_masters": math.ceil(peak * masters_us / 1e6) if masters_us else None,
    }


def start_null_servers(
    answers: dict[str, Any], name: str, pki: Pki, scratch: Path, aggregator: TlsAggregator, protocols: list[str]
) -> dict[str, NullServer]:
    """The do-nothing servers for one store's cells, answering what its aggregator answers."""
    path = scratch / f"answers-{name}.json"
    path.write_text(json.dumps(answers))
    config = aggregator.config
    return {p: NullServer(p, path, pki, scratch, config.workers, config.max_concurrent_rpcs) for p in protocols}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one load process, tiny turns")
    parser.add_argument("--rounds", type=int, help="A-B-B-A rounds per cell (default 3; 1 with --quick)")
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=STORES,
        help="default sqlite redis cluster (memory where asked); report.py passes its --stores",
    )
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument(
        "--devices", type=int, help="device-days per load process per round (default 300; 40 with --quick)"
    )
    parser.add_argument(
        "--in-flight", type=int, help="device-days at once, all load processes (default 16; 4 with --quick)"
    )
    parser.add_argument(
        "--keepalive-calls",
        type=int,
        help="keep-alive uploads per load process per round (default 1000; 200 with --quick)",
    )
    parser.add_argument(
        "--keepalive-in-flight", type=int, help="keep-alive connections in all (default 64; 8 with --quick)"
    )
    parser.add_argument("--load-processes", type=int, help="load processes (default 2; 1 with --quick)")
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the SQLite file goes: a disk, for fsync to mean what it does in production",
    )
    parser.add_argument("--output", type=Path, help="results JSON (default bench/results/device_day.json)")
    parser.add_argument("--null", choices=PROTOCOLS, help=argparse.SUPPRESS)
    parser.add_argument("--answers", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-rpcs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.null:
        return args
    args.rounds = args.rounds or (1 if args.quick else 3)
    # --quick: still enough CPU per turn for /proc's 10 ms ticks to see the aggregator's share.
    args.devices = args.devices or (40 if args.quick else 300)
    args.keepalive_calls = args.keepalive_calls or (200 if args.quick else 1000)
    args.load_processes = args.load_processes or (1 if args.quick else 2)
    args.in_flight = args.in_flight or (4 if args.quick else 16)
    args.keepalive_in_flight = args.keepalive_in_flight or (8 if args.quick else 64)
    args.stores = args.stores or ["sqlite", "redis", "cluster"]
    if args.in_flight % args.load_processes or args.keepalive_in_flight % args.load_processes:
        parser.error("--load-processes must divide --in-flight and --keepalive-in-flight")
    args.output = args.output or RESULTS_DIR / "device_day.json"
    return args


def store_url(store: str, args: argparse.Namespace, cleanup: list[Any]) -> tuple[str, Masters | None]:
    """A store for one aggregator, started here (Redis, the cluster) or made (SQLite's file)."""
    if store == "memory":
        return "memory", None
    if store == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix="veil-bench-sqlite-", dir=args.sqlite_dir))
        cleanup.append(lambda: shutil.rmtree(directory, ignore_errors=True))
        return f"sqlite://{directory / 'veil.db'}", None
    if store == "redis":
        server = RedisServer().start()
        cleanup.append(server.cleanup)
        return server.url, Masters([server])
    cluster = RedisClusterServers().start()
    cleanup.append(cluster.cleanup)
    return cluster.url, Masters(cluster.masters())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.null == "grpc":
        return null_grpc(args.answers, args.port_file, args.pki, args.workers, args.max_rpcs)
    if args.null == "http":
        return null_http(args.answers, args.port_file, args.pki)
    started = time.perf_counter()
    machine = machine_info(("grpcio", "aiohttp", "protobuf", "redis", "hiredis", "veil"))
    machine["load_average_before"] = list(os.getloadavg())
    ledger = Ledger()
    rows: list[dict[str, Any]] = []
    revisions: dict[str, Any] = {}
    load = LoadProcesses(args.load_processes, day_load_process)
    with tempfile.TemporaryDirectory(prefix="veil-bench-device-day-") as scratch_name:
        scratch = Path(scratch_name)
        try:
            pki = Pki(scratch / "pki")
            reports = max(args.devices, args.keepalive_calls * KEEPALIVE_BATCH)
            load.command("prepare", {"ks": METRIC_KS, "seed": SEED, "reports": reports})
            for store in args.stores:
                cleanup: list[Any] = []
                try:
                    url, masters = store_url(store, args, cleanup)
                    aggregator = TlsAggregator(store, url, config_dict(list(METRIC_KS), [EPSILON], url), scratch, pki)
                    cleanup.append(aggregator.stop)
                    if store in ("redis", "cluster"):
                        from veil.aggregator.store import RedisStore

                        aggregator.redis = RedisStore(url)
                    info = revision(aggregator, pki)
                    revisions[store] = info["revision"]
                    nulls = start_null_servers(info["answers"], store, pki, scratch, aggregator, args.protocols)
                    cleanup += [n.stop for n in nulls.values()]
                    progress(
                        f"{store}: aggregator pid {aggregator.pid} (gRPC {aggregator.endpoint}, HTTPS port "
                        f"{aggregator.http_port}), revision {info['revision']}; do-nothing servers "
                        + ", ".join(f"{p} pid {n.pid}" for p, n in nulls.items())
                    )
                    for protocol in args.protocols:
                        for kind in ("day", "keepalive"):
                            cell = Cell(load, aggregator, nulls[protocol], masters, ledger, info, kind, protocol, args)
                            row = cell.measure(args.rounds)
                            rows.append(row)
                            progress(f"{store} {protocol} {kind}: {row_text(row)}")
                finally:
                    for step in reversed(cleanup):
                        step()
        finally:
            load.stop()

    checks = {}
    for row in rows:
        if row["kind"] != "day":
            continue
        keepalive = next(
            r
            for r in rows
            if r["kind"] == "keepalive" and (r["store"], r["protocol"]) == (row["store"], row["protocol"])
        )
        row["model"] = model(row)
        checks[f"device_day_{row['store']}_{row['protocol']}"] = {
            "store": row["store"],
            "protocol": row["protocol"],
            "calls": row["calls"],
            "revision": row["revision"],
            "ratio": row["ratio"],
            "ratio_rounds": row["ratio_rounds"],
            "aggregator_us_per_device_day": row["aggregator_us_per_device_day"],
            "null_us_per_device_day": row["null_us_per_device_day"],
            "goal": EFFICIENCY_GOAL,
            "ok": row["ratio"] is not None and row["ratio"] >= EFFICIENCY_GOAL,
            "keepalive": {
                "calls": keepalive["calls"],
                "ratio": keepalive["ratio"],
                "ratio_rounds": keepalive["ratio_rounds"],
                "aggregator_us_per_upload": keepalive["aggregator_us_per_upload"],
                "null_us_per_upload": keepalive["null_us_per_upload"],
            },
        }
    machine["load_average_after"] = list(os.getloadavg())
    results = {
        "benchmark": "device_day",
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "rounds": args.rounds,
            "stores": args.stores,
            "protocols": args.protocols,
            "metrics": [metric_name(k, EPSILON) for k in METRIC_KS],
            "devices_per_process_per_round": args.devices,
            "in_flight": args.in_flight,
            "keepalive_calls_per_process_per_round": args.keepalive_calls,
            "keepalive_in_flight": args.keepalive_in_flight,
            "load_processes": args.load_processes,
            "revisions": revisions,
            "rounds_order": "A-B-B-A: do-nothing server, aggregator, aggregator, do-nothing server (half each)",
            "tls": "server certificate (EC P-256) from veil_testing.pki; full handshakes, no session resumption "
            "(gRPC: a new channel per device, no session cache; HTTP: a new connection, no session offered; "
            "tls_sessions_resumed counts any the HTTP side saw)",
            "model": {"peak": PEAK, "device_days_per_device_per_day": 1, "fleet": FLEET},
        },
        "rows": rows,
        "checks": checks,
        "exact_counts": ledger.summary(),
        "wall_seconds": time.perf_counter() - started,
    }
    write_results(args.output, results)
    print_tables(results)
    return 0 if not ledger.failures else 1


def row_text(row: dict[str, Any]) -> str:
    unit = "device_day" if row["kind"] == "day" else "upload"
    rounds = "/".join("-" if r is None else f"{r:.0%}" for r in row["ratio_rounds"])
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.0%}"
    return (
        f"{ratio} ({rounds}) of the do-nothing server; aggregator {row[f'aggregator_us_per_{unit}']:.0f} "
        f"us, do-nothing {row[f'null_us_per_{unit}']:.0f} us per {unit.replace('_', '-')}; "
        f"{'exact' if row['exact'] else 'COUNTS WRONG'}"
    )


def print_tables(results: dict[str, Any]) -> None:
    machine = results["machine"]
    print(
        "\nDevice-day efficiency: aggregator device-days per CPU second / the do-nothing server's, median "
        f"(rounds); goal {EFFICIENCY_GOAL:.0%}. Load average before {machine['load_average_before'][0]:.1f}, "
        f"after {machine['load_average_after'][0]:.1f}"
    )
    for row in results["rows"]:
        print(f"  {row['store']:8} {row['protocol']:5} {row['kind']:9} {row_text(row)}")
        print(f"  {'':24} {row['calls']}")
    print(f"\nModel: one device-day per device per day, peak {PEAK}x the average, {FLEET:,} devices")
    for row in results["rows"]:
        m = row.get("model")
        if m is not None:
            masters = "" if m["fleet_masters"] is None else f", {m['fleet_masters']} masters"
            print(
                f"  {row['store']:8} {row['protocol']:5} {m['device_days_per_core_second']:6.0f} device-days per "
                f"core-second, {m['devices_per_core']:>12,.0f} devices per core: {m['fleet_cores']} cores{masters}"
            )
    exact = results["exact_counts"]
    for failure in exact["failures"]:
        print(f"COUNT CHECK FAILED: {failure}")
    print(f"Exact-count checks: {exact['checks'] - len(exact['failures'])} of {exact['checks']} OK")


if __name__ == "__main__":
    sys.exit(main())
