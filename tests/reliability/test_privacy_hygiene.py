"""Privacy hygiene after a full run: what the aggregator and the SDK leave behind.

One run per authentication mode: devices with queue directories and tokens report three
metrics through an aggregator process (logging at debug level) on Redis with an AOF; the
aggregator is killed once so batches are spooled and retried; refused calls are provoked (an
invalid batch, a stale spec, a wrong token, reads without a token). Then everything is scraped:

- the aggregator's log and the SDK's log records: no token (good or wrong), device secret,
  batch id, report payload, category label or client address (only the aggregator's own ports
  and Redis's may appear);
- the error details the aggregator returned: none of those either;
- Redis, every key of every database (SCAN, TYPE, TTL, HGETALL, DUMP) and its AOF files: only
  `veil:{metric}:c:<fingerprint>:<window>:<bucket>` hashes of integer fields n:<t>, v:<t>:<j>,
  batches and version (a random number each write draws), and `veil:{metric}:b:<batch id hex>`
  = "1" with a TTL, exactly one per acknowledged batch; no token, secret, label, payload or address bytes anywhere;
- the estimates: withheld below min_n (gRPC and HTTP), shown above it;
- the SDK's queue directory: 0700 (even when it existed as 0755, and under umask 0), the device
  secret, memo store, spec cache and spooled batches 0600, none holding a token or a label.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import stat
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis as redis_py
from reliability_kit import LABELS, assert_exact, flush_all
from veil_testing.waiting import wait_until

from veil.aggregator.config import parse_config
from veil.aggregator.errors import ConfigError
from veil.client import spec_from_proto
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

UPLOAD_TOKEN = "upload-tok-5d1c8e0f7a2b4c69a1e3"
READ_TOKEN = "read-tok-9b7e2a4d6c1f3e58b0d2"
WRONG_TOKEN = "wrong-tok-3f6a9c2e8b1d4a75c0e7"
MIN_N = 100
DEDUPE_TTL = 48 * 3600

COUNTS_KEY = re.compile(
    r"^veil:\{(?P<metric>[a-z_]+)\}:c:(?P<fp>[0-9A-Za-z%_.-]+)"
    r":(?P<window>total|1h):(?P<bucket>\d+)$"
)
DEDUPE_KEY = re.compile(r"^veil:\{(?P<metric>[a-z_]+)\}:b:(?P<id>[0-9a-f]{32})$")
SINCE_KEY = re.compile(r"^veil:\{(?P<metric>[a-z_]+)\}:s:(?P<fp>[0-9A-Za-z%_.-]+)$")
COUNTS_FIELD = re.compile(rb"^(n:\d+|v:\d+:\d+|batches|version)$")
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)|\[::(?:ffff:127\.0\.0\.1|1)\]:(\d+)|ipv[46]:")


def _auth_supported() -> bool:
    metric = {"name": "m", "labels": ["a", "b"], "mechanism": "krr", "epsilon": 1.0}
    try:
        parse_config({"metrics": [metric], "auth": {}})
    except ConfigError as error:
        if "auth: unknown key" in str(error):
            return False
        raise
    return True


def _tokens_file(directory: Path) -> Path:
    path = directory / "tokens.toml"
    metrics = ", ".join(json.dumps(m) for m in ("browser", "crash_screen", "os"))
    path.write_text(
        f'[[upload_tokens]]\nname = "devices"\ntoken = "{UPLOAD_TOKEN}"\nmetrics = [{metrics}]\n\n'
        f'[[read_tokens]]\nname = "tests"\ntoken = "{READ_TOKEN}"\n'
    )
    path.chmod(0o600)
    return path


def _client_ports(server_ports: set[int]) -> set[int]:
    """Local ports of this process's TCP connections to the aggregator or Redis (the SDK's and
    the aggregator's client addresses), read from /proc/net/tcp{,6}."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote = line.split()[1:3]
            if int(remote.rsplit(":", 1)[1], 16) in server_ports:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _forms(value: bytes) -> list[bytes]:
    """The ways a secret could be written down: raw, hex, base64 (standard and URL-safe)."""
    return [
        value,
        value.hex().encode(),
        base64.b64encode(value).rstrip(b"="),
        base64.urlsafe_b64encode(value).rstrip(b"="),
    ]


def _found(haystack: bytes, needles: dict[str, list[bytes]]) -> list[str]:
    return [name for name, forms in needles.items() for form in forms if len(form) >= 8 and form in haystack]


def _http(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("auth", ["off", "tokens"])
def test_nothing_private_in_logs_redis_errors_or_sdk_files(
    auth, make_redis_server, make_aggregator, make_device, tmp_path, caplog
):
    if auth == "tokens" and not _auth_supported():
        pytest.skip("this aggregator has no [auth] yet")
    caplog.set_level("DEBUG", logger="veil.client")
    previous_umask = os.umask(0)  # the SDK must make its files owner-only itself
    try:
        _full_run_and_scrape(auth, make_redis_server, make_aggregator, make_device, tmp_path, caplog)
    finally:
        os.umask(previous_umask)


def _full_run_and_scrape(auth, make_redis_server, make_aggregator, make_device, tmp_path, caplog):
    redis = make_redis_server(appendonly=True, appendfsync="always")
    options = {"auth": {"tokens_file": str(_tokens_file(tmp_path))}} if auth == "tokens" else {}
    serve = make_aggregator(redis.url, log_level="debug", server={"min_n": MIN_N}, **options).start()
    read_metadata = (("authorization", f"Bearer {READ_TOKEN}"),) if auth == "tokens" else None

    queue_dirs = [tmp_path / "device-0", tmp_path / "device-1"]
    queue_dirs[1].mkdir(mode=0o755)  # an existing, world-readable directory gets tightened
    queue_dirs[1].chmod(0o755)
    devices = [
        make_device(
            serve.endpoint,
            seed,
            queue_dir=queue_dir,
            token=UPLOAD_TOKEN,
            memoize=True,
            schedule_delay_ms=50,
            retry_initial_backoff_ms=50,
            retry_max_backoff_ms=200,
        )
        for seed, queue_dir in enumerate(queue_dirs)
    ]
    assert all(d.reporter.wait_for_specs(30) for d in devices)
    server_ports = {serve.grpc_port, serve.http_port, redis.port}
    client_ports = _client_ports(server_ports)

    # Reports: browser and crash_screen above min_n, os below it (its estimates are withheld).
    for device in devices:
        device.report_some(300, metrics=("browser", "crash_screen"))
        for i in range(20):
            device.report("os", i % 6)
    flush_all(devices)
    client_ports |= _client_ports(server_ports)

    # The aggregator dies; the devices spool what they report meanwhile, then resend it.
    serve.kill()
    for device in devices:
        device.report_some(100, metrics=("browser", "crash_screen"))
    spooled = []
    assert wait_until(lambda: all(list((q / "outbox").glob("*.batch")) for q in queue_dirs), 10), "nothing spooled"
    for queue_dir in queue_dirs:
        spooled += [(p, stat.S_IMODE(p.stat().st_mode), p.read_bytes()) for p in (queue_dir / "outbox").glob("*.batch")]
    serve.start()
    flush_all(devices)
    client_ports |= _client_ports(server_ports)

    # Refused calls: their error details are scraped too.
    details = []
    channel = grpc.insecure_channel(serve.endpoint)
    collector = veil_pb2_grpc.CollectorStub(channel)
    browser = devices[0].reporter.metrics["browser"]
    upload_metadata = (("authorization", f"Bearer {UPLOAD_TOKEN}"),)
    refused_ids = [os.urandom(16) for _ in range(3)]
    bad = [
        (
            veil_pb2.UploadRequest(
                batch_id=refused_ids[0],
                metric="browser",
                spec_fingerprint=browser.fingerprint,
                count=2,
                index_sets=veil_pb2.IndexSets(set_size=browser.mechanism.q, indices=b"\xff" * 8 * browser.mechanism.q),
            ),
            upload_metadata,
            "INVALID_ARGUMENT",
        ),
        (
            veil_pb2.UploadRequest(
                batch_id=refused_ids[1],
                metric="browser",
                spec_fingerprint="0" * 16,
                count=1,
                bitmaps=veil_pb2.Bitmaps(bits=b"\x03"),
            ),
            upload_metadata,
            "FAILED_PRECONDITION",
        ),
    ]
    if auth == "tokens":
        bad.append(
            (
                veil_pb2.UploadRequest(
                    batch_id=refused_ids[2],
                    metric="browser",
                    spec_fingerprint=browser.fingerprint,
                    count=1,
                    bitmaps=veil_pb2.Bitmaps(bits=b"\x03"),
                ),
                (("authorization", f"Bearer {WRONG_TOKEN}"),),
                "UNAUTHENTICATED",
            )
        )
    for request, metadata, expected in bad:
        with pytest.raises(grpc.RpcError) as refused:
            collector.Upload(request, metadata=metadata, timeout=10)
        assert refused.value.code().name == expected, refused.value
        details.append(refused.value.details() or "")
    client_ports |= _client_ports(server_ports)

    # Estimates: withheld below min_n, shown above it; reads need the read token when auth is on.
    estimates = veil_pb2_grpc.EstimatesStub(channel)
    shown = {
        e.metric: e
        for e in estimates.Get(veil_pb2.EstimatesRequest(window="total"), metadata=read_metadata, timeout=10).estimates
    }
    assert 0 < shown["os"].n < MIN_N and shown["os"].withheld and shown["os"].reason
    assert all(math.isnan(c.estimate) for c in shown["os"].categories)
    assert shown["browser"].n >= MIN_N and not shown["browser"].withheld
    status, body = _http(serve.http_port, "/v1/estimates/os?window=total", READ_TOKEN if auth == "tokens" else None)
    assert status == 200, body
    (window,) = json.loads(body)["estimates"]
    assert window["withheld"] is True and window["categories"] == [] and window["reason"]
    if auth == "tokens":
        for path in ("/v1/estimates", "/metrics"):
            assert _http(serve.http_port, path, None)[0] == 401
            assert _http(serve.http_port, path, WRONG_TOKEN)[0] in (401, 403)
        with pytest.raises(grpc.RpcError) as refused:
            estimates.Get(
                veil_pb2.EstimatesRequest(), metadata=(("authorization", f"Bearer {WRONG_TOKEN}"),), timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        details.append(refused.value.details() or "")
    channel.close()

    assert client_ports, "no client connection seen: the address check would prove nothing"
    summary = assert_exact(devices, redis.url)
    for device in devices:
        device.reporter.shutdown(5)
    assert serve.terminate() == 0

    # What must appear nowhere.
    secrets = {f"device.key of device {i}": _forms((q / "device.key").read_bytes()) for i, q in enumerate(queue_dirs)}
    tokens = {
        "upload token": _forms(UPLOAD_TOKEN.encode()),
        "read token": _forms(READ_TOKEN.encode()),
        "wrong token": _forms(WRONG_TOKEN.encode()),
    }
    labels = {f"label {label}": [label.encode()] for metric in LABELS.values() for label in metric}
    acknowledged = {batch_id: payload for d in devices for batch_id, payload in d.acknowledged.items()}
    batch_ids = {f"batch id {b.hex()}": _forms(b) for b in [*acknowledged, *refused_ids]}
    payloads = {}
    for batch_id, payload in acknowledged.items():
        request = veil_pb2.UploadRequest.FromString(payload)
        reports = request.bitmaps.bits or request.index_sets.indices
        forms = [reports.hex().encode(), base64.b64encode(reports)] + ([reports] if len(reports) >= 32 else [])
        # Short forms could match by chance (a hex string of digits inside a timestamp).
        payloads[f"reports of batch {batch_id.hex()}"] = [f for f in forms if len(f) >= 16]
    private = {**secrets, **tokens, **labels, **batch_ids, **payloads}

    # 1. The aggregator's log, the SDK's log records, the error details.
    log = serve.log_text()
    sdk_log = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records if r.name.startswith("veil"))
    for name, text in (("aggregator log", log), ("SDK log", sdk_log), ("error details", "\n".join(details))):
        leaked = _found(text.encode(), private)
        assert not leaked, f"{name} holds {leaked[:5]}"
        addresses = {int(a or b) for a, b in ADDRESS.findall(text) if (a or b)} - server_ports
        assert not addresses and "ipv4:" not in text and "ipv6:" not in text, f"{name} holds client addresses"
        ports = {p for p in client_ports if re.search(rf"(?<![\d.]){p}(?![\d.])", text)}
        assert not ports, f"{name} holds client ports {sorted(ports)}"
    assert '"msg": "aggregator stopped"' in log

    # 2. Redis: every key of every database, then the AOF.
    client = redis_py.Redis.from_url(redis.url)
    keyspace = client.info("keyspace")
    assert set(keyspace) <= {"db0"}, keyspace
    fingerprints = {spec.name: spec.fingerprint for spec in devices[0].reporter.metrics.values()}
    counts_keys, dedupe_ids = [], set()
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        kind, ttl, dump = client.type(raw).decode(), client.ttl(raw), client.dump(raw)
        leaked = _found(raw + b" " + dump, {**secrets, **tokens, **labels, **payloads})
        assert not leaked and b"127.0.0.1" not in dump, f"{key} holds {leaked[:5]}"
        if match := COUNTS_KEY.match(key):
            assert kind == "hash" and match["fp"] == fingerprints[match["metric"]], key
            fields = client.hgetall(raw)
            # The reporting periods with data: period indexes (days here), nothing finer.
            periods = fields.pop(b"periods", b"")
            assert re.fullmatch(rb"(,\d+)*,", periods), (key, periods)
            assert all(COUNTS_FIELD.match(f) and re.fullmatch(rb"\d+", v) for f, v in fields.items()), (key, fields)
            assert (ttl == -1) if match["window"] == "total" else (0 < ttl), (key, ttl)
            counts_keys.append(key)
        elif match := DEDUPE_KEY.match(key):
            assert kind == "string" and client.get(raw) == b"1" and 0 < ttl <= DEDUPE_TTL, (key, kind, ttl)
            dedupe_ids.add(bytes.fromhex(match["id"]))
        elif key == "veil:probe":  # the health ping's write, to find a Redis refusing writes
            assert kind == "string" and client.get(raw) == b"1" and 0 < ttl <= 10, (key, kind, ttl)
        elif match := SINCE_KEY.match(key):  # when counting of a spec began: a time, kept like its totals
            assert kind == "string" and re.fullmatch(rb"\d{10}", client.get(raw)) and ttl == -1, (key, kind, ttl)
            assert match["fp"] == fingerprints[match["metric"]], key
        else:
            pytest.fail(f"unexpected Redis key {key!r} ({kind})")
    client.close()
    # One expiring key per acknowledged batch, none for refused ones, and nothing per report.
    assert dedupe_ids == set(acknowledged), (len(dedupe_ids), len(acknowledged))
    windows = {(m["metric"], m["window"]) for m in map(COUNTS_KEY.match, counts_keys)}
    assert windows == {("browser", "total"), ("browser", "1h"), ("crash_screen", "total"), ("os", "total")}, windows
    aof = b"".join(p.read_bytes() for p in sorted((redis.dir / "appendonlydir").iterdir()))
    leaked = _found(aof, {**secrets, **tokens, **labels})
    assert aof and not leaked and b"127.0.0.1" not in aof, f"the AOF holds {leaked[:5]}"

    # 3. The SDK's files.
    for queue_dir in queue_dirs:
        assert stat.S_IMODE(queue_dir.stat().st_mode) == 0o700, queue_dir
        assert stat.S_IMODE((queue_dir / "outbox").stat().st_mode) == 0o700
        assert len((queue_dir / "device.key").read_bytes()) == 32
        for name in ("device.key", "memo.log", "specs.pb"):
            assert stat.S_IMODE((queue_dir / name).stat().st_mode) == 0o600, (queue_dir, name)
        for path in queue_dir.rglob("*"):
            if path.is_file():
                assert not _found(path.read_bytes(), tokens), path
        assert not _found((queue_dir / "memo.log").read_bytes(), labels)
        cached = veil_pb2.GetMetricSpecsResponse.FromString((queue_dir / "specs.pb").read_bytes())
        assert {spec_from_proto(s).fingerprint for s in cached.specs} <= set(fingerprints.values())
    assert spooled and all(mode == 0o600 for _, mode, _ in spooled), [(p.name, oct(m)) for p, m, _ in spooled]
    assert not any(_found(data, {**tokens, **labels}) for _, _, data in spooled)
    print(
        f"\nauth {auth}: scraped {len(log.splitlines())} log lines, {len(counts_keys)} counts hashes, "
        f"{len(dedupe_ids)} dedupe keys, {len(aof)} AOF bytes, {len(spooled)} spooled batches; {summary}"
    )
