"""The ingest core behind both listeners (veil.aggregator.ingest; docs/protocol.md section 5):
its status table is the protocol's, and over real gRPC and HTTP on loopback, against a real
aggregator on SQLite and Redis, UploadBatches counts each batch once by its id, batches are
bucketed by when they were made, late ones are refused, and specs are fetched conditionally."""

from __future__ import annotations

import ast
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from veil_testing.running import METRICS, UPLOAD_TOKEN, auth_section, bearer, collector, counted, make_upload

from veil.aggregator.config import parse_config
from veil.aggregator.ingest import GRPC_CODES, STATUSES, Ingest, http_status
from veil.aggregator.instruments import Instruments
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore
from veil.wire.v1 import veil_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTOBUF = "application/x-protobuf"
HOUR, DAY = 3600, 86400
# A fixed aggregator clock: 00:30 UTC, so the hour before is in the day (period) before.
NOW = 20_000 * DAY + 30 * 60


# -- the status table ------------------------------------------------------------------------------


def protocol_answers() -> dict[str, tuple[str | None, int | None, bool]]:
    """docs/protocol.md section 5's answers table: outcome -> (gRPC, HTTP, final)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text[text.index("## 5.") : text.index("## 6.")]
    head = section.index("| outcome | gRPC | HTTP | final |")
    rows = {}
    for line in section[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        outcome, code, status, final = (cell.strip() for cell in line.strip("|").split("|")[:4])
        assert final in ("yes", "no"), line
        rows[outcome.strip("`")] = (
            None if code == "—" else code,
            None if status == "—" else int(status),
            final == "yes",
        )
    return rows


def test_the_status_table_is_the_protocols_answers_table():
    table = {name: (s.grpc, s.http, s.final) for name, s in STATUSES.items()}
    documented = protocol_answers()
    assert {k: v for k, v in documented.items() if k not in table} == {}  # documented, not sent
    assert {k: v for k, v in table.items() if documented.get(k) != v} == {}  # sent, not documented as sent
    # Every veil_uploads label is the outcome's name; the refusals HTTP answers are the table's.
    assert all(s.label in (None, name) for name, s in STATUSES.items())
    assert http_status("RESOURCE_EXHAUSTED") == 429 and http_status("OK") == 200
    assert http_status("OUT_OF_RANGE") == 410 and http_status("DATA_LOSS") == 500
    for name, s in STATUSES.items():
        if s.grpc and s.http and name not in ("oversize", "unchanged"):
            assert http_status(s.grpc) == s.http, name


def test_batch_result_codes_are_grpcs_numbers():
    assert {name: grpc.StatusCode[name].value[0] for name in GRPC_CODES} == GRPC_CODES
    assert {s.grpc for s in STATUSES.values() if s.label} <= set(GRPC_CODES)


def test_the_core_imports_no_transport():
    """Transport-neutral: neither the core nor the decoder imports gRPC or aiohttp."""
    for module in ("ingest.py", "decode.py"):
        tree = ast.parse((ROOT / "aggregator" / "src" / "veil" / "aggregator" / module).read_text())
        imported = {
            name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        }
        assert not imported & {"grpc", "aiohttp"}, module


# -- specs ---------------------------------------------------------------------------------------


def ingest_of(**server) -> Ingest:
    config = parse_config({"metrics": METRICS, "server": server})
    return Ingest(config, MemoryStore(), Instruments(), clock=lambda: NOW)


def test_specs_carry_resolution_version_clock_and_lateness():
    ingest = ingest_of(max_lateness="20h")
    answer = ingest.specs()
    resolutions = {s.name: s.time_resolution_seconds for s in answer.specs}
    assert resolutions == {"browser": HOUR, "os": DAY, "opted_in": DAY, "crash_screen": DAY, "feature": DAY}
    assert re.fullmatch("[0-9a-f]{32}", answer.specs_version) and not answer.unchanged
    assert (answer.server_time_unix, answer.max_lateness_seconds, answer.max_batch) == (NOW, 20 * HOUR, 10000)
    assert ingest.specs(["os"]).specs_version == answer.specs_version  # one version, whatever is asked
    unchanged = ingest.specs(if_version=answer.specs_version)
    assert unchanged == veil_pb2.GetMetricSpecsResponse(
        specs_version=answer.specs_version, unchanged=True, server_time_unix=NOW
    )
    assert len(ingest.specs(if_version="an old one").specs) == len(METRICS)
    # The same config, the same version; any change to what the answer says, another.
    assert ingest_of(max_lateness="20h").specs_version == answer.specs_version
    assert ingest_of().specs_version != answer.specs_version
    assert ingest_of(max_lateness="20h", max_batch=9999).specs_version != answer.specs_version
    budgets = [{**m, "period_budget": 5.0} if m["name"] == "os" else m for m in METRICS]
    other = Ingest(parse_config({"metrics": budgets, "server": {"max_lateness": "20h"}}), MemoryStore(), Instruments())
    assert other.specs_version != answer.specs_version


def http(aggregator, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body) of a request to the aggregator's HTTP listener."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{aggregator.http_port}{path}",
        data=body,
        method="POST" if body is not None else "GET",
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_specs_are_fetched_conditionally_over_grpc_and_http(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()}, clock=lambda: NOW)
    stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
    metadata = bearer(UPLOAD_TOKEN)
    full = stub.GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(), metadata=metadata, timeout=10)
    # An upload token sees its metrics' specs, with the version, clock and lateness of all.
    assert [s.name for s in full.specs] == ["browser", "os"] and full.server_time_unix == NOW
    assert full.specs_version and full.max_lateness_seconds == 25 * HOUR
    check = veil_pb2.GetMetricSpecsRequest(if_version=full.specs_version)
    assert stub.GetMetricSpecs(check, metadata=metadata, timeout=10) == veil_pb2.GetMetricSpecsResponse(
        specs_version=full.specs_version, unchanged=True, server_time_unix=NOW
    )
    auth = {"Authorization": f"Bearer {UPLOAD_TOKEN}"}
    status, headers, body = http(aggregator, "/v1/specs", headers=auth)
    etag = headers["ETag"]
    assert (
        status == 200 and etag == f'"{full.specs_version}"' and json.loads(body)["specsVersion"] == full.specs_version
    )
    status, headers, body = http(aggregator, "/v1/specs", headers={**auth, "If-None-Match": etag})
    assert (status, headers["ETag"], body) == (304, etag, b"")
    status, _, body = http(aggregator, "/v1/specs", headers={**auth, "If-None-Match": '"stale", W/' + etag})
    assert status == 304
    status, _, body = http(aggregator, "/v1/specs", headers={**auth, "If-None-Match": '"stale"'})
    assert status == 200 and len(json.loads(body)["specs"]) == 2
    # The check is still a call of a token: none is 401, not 304.
    assert http(aggregator, "/v1/specs", headers={"If-None-Match": etag})[0] == 401


# -- uploads -------------------------------------------------------------------------------------


def made(upload: veil_pb2.UploadRequest, made_unix: int) -> veil_pb2.UploadRequest:
    upload.made_unix = made_unix
    return upload


def stale(upload: veil_pb2.UploadRequest) -> veil_pb2.UploadRequest:
    upload.spec_fingerprint = "0" * 32
    return upload


def undeclared(upload: veil_pb2.UploadRequest) -> veil_pb2.UploadRequest:
    upload.metric = "no_such_metric"
    return upload


def calls(aggregator, transport: str):
    """upload_batches(request) -> (call status name, results, specs_version) over `transport`."""
    if transport == "grpc":
        stub = collector(f"127.0.0.1:{aggregator.grpc_port}")

        def over_grpc(request: veil_pb2.UploadBatchesRequest):
            try:
                answer = stub.UploadBatches(request, timeout=10)
            except grpc.RpcError as err:
                return err.code().name, [], ""
            return "OK", [(r.code, r.accepted, r.duplicate) for r in answer.results], answer.specs_version

        return over_grpc

    def over_http(request: veil_pb2.UploadBatchesRequest):
        if transport == "http":
            body, headers = request.SerializeToString(), {"Content-Type": PROTOBUF}
        else:
            from google.protobuf import json_format

            body, headers = json_format.MessageToJson(request).encode(), {"Content-Type": "application/json"}
        status, _, data = http(aggregator, "/v1/uploads", body, headers)
        if status != 200:
            return json.loads(data)["code"], [], ""
        if transport == "http":
            answer = veil_pb2.UploadBatchesResponse.FromString(data)
            return "OK", [(r.code, r.accepted, r.duplicate) for r in answer.results], answer.specs_version
        answer_json = json.loads(data)
        return (
            "OK",
            [(r["code"], r["accepted"], r["duplicate"]) for r in answer_json["results"]],
            answer_json["specsVersion"],
        )

    return over_http


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'veil.db'}"
    return request.getfixturevalue("redis_server").url


@pytest.mark.parametrize("transport", ["grpc", "http", "json"])
def test_upload_batches_counts_each_batch_once_by_its_id(start_aggregator, store_url, transport):
    aggregator = start_aggregator(store_url, clock=lambda: NOW)
    upload_batches = calls(aggregator, transport)
    first, second, os_batch = (
        make_upload("browser", 100, seed=1),
        make_upload("browser", 30, seed=2),
        make_upload("os", 7),
    )
    again = veil_pb2.UploadRequest()
    again.CopyFrom(first)
    again.count = 100  # the same id within the call: a duplicate, whatever else it says
    late = made(make_upload("browser", 5), NOW - 30 * HOUR)
    request = veil_pb2.UploadBatchesRequest(
        batches=[
            first,
            made(second, NOW - HOUR),
            again,
            os_batch,
            stale(make_upload("os", 3)),
            undeclared(make_upload("os", 1)),
            late,
            made(make_upload("os", 4), NOW + 2 * DAY),
        ]
    )
    bad = request.batches.add()
    bad.CopyFrom(make_upload("os", 2))
    bad.count = 3  # its payload holds 2 reports
    code, results, version = upload_batches(request)
    assert code == "OK" and version == aggregator.collector.ingest.specs_version
    ok, invalid, stale_, late_ = 0, 3, 9, 11
    expected = [
        (ok, 100, False),
        (ok, 30, False),
        (ok, 100, True),
        (ok, 7, False),
        (stale_, 0, False),
        (stale_, 0, False),
        (late_, 0, False),
        (invalid, 0, False),
        (invalid, 0, False),
    ]
    assert results == expected
    # The whole call again (a lost answer): every counted batch is a duplicate, the rest as before.
    code, results, _ = upload_batches(request)
    assert code == "OK"
    assert results == [(c, n, True) if c == ok else (c, n, d) for c, n, d in expected]
    assert (counted(aggregator, "browser"), counted(aggregator, "os")) == (130, 7)
    # A call refused whole counts nothing of it.
    too_many = veil_pb2.UploadBatchesRequest(batches=[make_upload("os", 1) for _ in range(65)])
    assert upload_batches(too_many)[0] == "INVALID_ARGUMENT"
    over = veil_pb2.UploadBatchesRequest(batches=[make_upload("os", 6000), make_upload("os", 5000)])
    assert upload_batches(over)[0] == "INVALID_ARGUMENT"
    assert counted(aggregator, "os") == 7
    uploads = aggregator.instruments.registry.get_sample_value
    assert uploads("veil_uploads_total", {"metric": "browser", "outcome": "too_late"}) == 2
    assert uploads("veil_uploads_total", {"metric": "os", "outcome": "future"}) == 2


def test_a_token_may_upload_batches_of_its_metrics_only(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
    mixed = veil_pb2.UploadBatchesRequest(batches=[make_upload("browser", 10), make_upload("crash_screen", 10)])
    with pytest.raises(grpc.RpcError) as err:
        stub.UploadBatches(mixed, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "crash_screen" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.UploadBatches(mixed, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    status, _, _ = http(
        aggregator,
        "/v1/uploads",
        mixed.SerializeToString(),
        {"Content-Type": PROTOBUF, "Authorization": f"Bearer {UPLOAD_TOKEN}"},
    )
    assert status == 403 and counted(aggregator, "browser") == 0
    ours = veil_pb2.UploadBatchesRequest(batches=[make_upload("browser", 10), make_upload("os", 10)])
    answer = stub.UploadBatches(ours, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert [r.code for r in answer.results] == [0, 0] and counted(aggregator, "browser") == 10


def test_upload_batches_are_charged_the_reports_they_hold(start_aggregator):
    aggregator = start_aggregator(max_batch=500, sections={"auth": auth_section(rate_limit=1, rate_burst=500)})
    stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
    three = veil_pb2.UploadBatchesRequest(batches=[make_upload("browser", 200), make_upload("os", 200)])
    assert [r.code for r in stub.UploadBatches(three, metadata=bearer(UPLOAD_TOKEN), timeout=10).results] == [0, 0]
    with pytest.raises(grpc.RpcError) as err:  # 400 of the burst's 500 are spent
        stub.UploadBatches(three, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(err.value.trailing_metadata())["retry-after-ms"]


def test_upload_batches_take_one_upload_of_the_upload_rate_per_batch(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section(upload_rate_limit=0.001, upload_rate_burst=3)})
    stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
    three = veil_pb2.UploadBatchesRequest(batches=[make_upload("browser", 1, seed=i) for i in range(3)])
    assert [r.code for r in stub.UploadBatches(three, metadata=bearer(UPLOAD_TOKEN), timeout=10).results] == [0] * 3
    with pytest.raises(grpc.RpcError) as err:  # the burst of 3 uploads is spent by the 3 batches
        stub.Upload(make_upload("browser", 1), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Upload rate limit" in err.value.details()
    assert counted(aggregator, "browser") == 3


def bucket_reports(aggregator, metric: str, window: str, start: int) -> int:
    m = aggregator.config.metric(metric)
    key = CountsKey(metric, m.spec.fingerprint, window, start)
    weights = m.spec.mechanism.weight_law().weights
    return int(aggregator.store.read(key, weights, m.spec.k).n.sum())


class RecordingStore(MemoryStore):
    """A MemoryStore that keeps every BatchWrite it is given (what the core asked of it)."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: NOW)
        self.writes: list[BatchWrite] = []

    def add(self, write: BatchWrite) -> bool:
        self.writes.append(write)
        return super().add(write)

    def add_many(self, writes):
        self.writes.extend(writes)
        return super().add_many(writes)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_a_batch_is_counted_in_the_buckets_of_when_it_was_made(transport, start_aggregator):
    from veil.aggregator.daemon import Aggregator

    store = RecordingStore()
    config = parse_config(
        {
            "metrics": METRICS,
            "server": {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "min_n": 1},
            "store": {"url": "memory"},
        }
    )
    aggregator = Aggregator(config, store=store, clock=lambda: NOW)
    aggregator.start()
    try:
        this_hour, last_hour = NOW - NOW % HOUR, NOW - NOW % HOUR - HOUR
        batches = [
            make_upload("browser", 40, seed=3),  # revision 1: at arrival
            made(make_upload("browser", 25, seed=4), last_hour + 17),  # not a multiple: floored
            made(make_upload("browser", 9, seed=5), NOW - 10 * HOUR),  # its 1h bucket is gone (7h retention)
        ]
        for batch in batches:
            if transport == "grpc":
                response = collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(batch, timeout=10)
                assert response.specs_version == aggregator.collector.ingest.specs_version
            else:
                status, _, _ = http(aggregator, "/v1/upload", batch.SerializeToString(), {"Content-Type": PROTOBUF})
                assert status == 200
        assert bucket_reports(aggregator, "browser", "1h", this_hour) == 40
        assert bucket_reports(aggregator, "browser", "1h", last_hour) == 25
        assert bucket_reports(aggregator, "browser", "1h", (NOW - 10 * HOUR) // HOUR * HOUR) == 0  # not brought back
        assert counted(aggregator, "browser") == 74  # the total holds all three
        assert [w.period for w in store.writes] == [NOW // DAY, NOW // DAY - 1, NOW // DAY - 1]
        assert [len(w.targets) for w in store.writes] == [2, 2, 1]
        # Too late: the slot ended more than max_lateness (25h) ago; a slot in the future.
        for made_unix, code, status in (
            (NOW - 27 * HOUR, "OUT_OF_RANGE", 410),
            (NOW + 2 * HOUR, "INVALID_ARGUMENT", 400),
        ):
            batch = made(make_upload("browser", 3), made_unix)
            if transport == "grpc":
                with pytest.raises(grpc.RpcError) as err:
                    collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(batch, timeout=10)
                assert err.value.code().name == code
            else:
                answer = http(aggregator, "/v1/upload", batch.SerializeToString(), {"Content-Type": PROTOBUF})
                assert answer[0] == status and json.loads(answer[2])["code"] == code
        assert counted(aggregator, "browser") == 74 and len(store.writes) == 3
        # The next hour's slot is within one resolution of clock skew: counted there.
        ahead = made(make_upload("browser", 2), this_hour + HOUR)
        assert collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(ahead, timeout=10).accepted == 2
        assert bucket_reports(aggregator, "browser", "1h", this_hour + HOUR) == 2
    finally:
        aggregator.stop(grace=0)


def test_http_refuses_oversize_and_unknown_bodies_with_the_documented_json(start_aggregator):
    aggregator = start_aggregator(max_batch=100)
    too_big = make_upload("browser", 100).SerializeToString() + b"\x00" * (1 << 20)
    for path in ("/v1/upload", "/v1/uploads"):
        status, _, body = http(aggregator, path, too_big, {"Content-Type": PROTOBUF})
        assert (
            status == 413 and json.loads(body)["code"] == "RESOURCE_EXHAUSTED" and "split" in json.loads(body)["error"]
        )
        status, _, body = http(aggregator, path, b"{}", {"Content-Type": "text/csv"})
        assert status == 415 and "error" in json.loads(body)
    assert counted(aggregator, "browser") == 0


def test_a_full_upload_batches_passes_the_message_limit(start_aggregator):
    """64 batches and max_batch reports in all, each in the widest encoding: within gRPC's limit."""
    aggregator = start_aggregator(max_batch=64 * 10)
    config = aggregator.config
    spec = config.metric("browser").spec
    q = spec.mechanism.q
    from veil.mechanism import SeededRandomSource

    source = SeededRandomSource(3)
    batches = []
    for _ in range(64):
        reports = [sorted(spec.mechanism.randomize(i % spec.k, source)) for i in range(10)]
        batches.append(
            veil_pb2.UploadRequest(
                batch_id=os.urandom(16),
                metric="browser",
                spec_fingerprint=spec.fingerprint,
                count=10,
                made_unix=int(time.time()),
                index_sets=veil_pb2.IndexSets(
                    set_size=q, indices=b"".join(j.to_bytes(4, "little") for r in reports for j in r)
                ),
            )
        )
    answer = collector(f"127.0.0.1:{aggregator.grpc_port}").UploadBatches(
        veil_pb2.UploadBatchesRequest(batches=batches), timeout=10
    )
    assert [r.code for r in answer.results] == [0] * 64 and counted(aggregator, "browser") == 640
