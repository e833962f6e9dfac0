"""The Collector over HTTP (POST /v1/upload, GET /v1/specs; docs/protocol.md): the same tokens,
limits, checks and exactly-once counting as gRPC, over a real aggregator on loopback, with
binary protobuf and proto3 JSON bodies, and the documented statuses."""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request

import pytest
from google.protobuf import json_format
from veil_testing.running import (
    METRICS,
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    UPLOAD_TOKEN,
    auth_section,
    counted,
    make_upload,
    specs_of,
)

from veil.wire.v1 import veil_pb2

PROTOBUF = "application/x-protobuf"


def post(aggregator, body: bytes, content_type: str = PROTOBUF, headers: dict | None = None):
    """(status, headers, body) of POST /v1/upload."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{aggregator.http_port}/v1/upload",
        data=body,
        method="POST",
        headers={"Content-Type": content_type, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def get(aggregator, path: str, headers: dict | None = None):
    request = urllib.request.Request(f"http://127.0.0.1:{aggregator.http_port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def as_json(upload: veil_pb2.UploadRequest) -> bytes:
    return json_format.MessageToJson(upload).encode()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_uploads_in_both_formats_count_exactly_once(start_aggregator):
    aggregator = start_aggregator()
    version = aggregator.collector.ingest.specs_version
    expected = {}
    for i, metric in enumerate(m["name"] for m in METRICS):
        binary = make_upload(metric, 150 + i, seed=i)
        status, _, body = post(aggregator, binary.SerializeToString())
        assert status == 200 and veil_pb2.UploadResponse.FromString(body) == veil_pb2.UploadResponse(
            accepted=150 + i, specs_version=version
        )
        status, _, body = post(aggregator, as_json(make_upload(metric, 50, seed=100 + i)), "application/json")
        assert status == 200 and json.loads(body) == {"accepted": 50, "duplicate": False, "specsVersion": version}
        # The retry of a counted batch (same batch id) is answered as a duplicate and counts nothing.
        status, _, body = post(aggregator, as_json(binary), "application/json")
        assert status == 200 and json.loads(body) == {"accepted": 150 + i, "duplicate": True, "specsVersion": version}
        expected[metric] = 200 + i
    assert {metric: counted(aggregator, metric) for metric in expected} == expected


NO_TOKEN: dict = {}


@pytest.mark.parametrize(
    "headers, status, reason",
    [
        (NO_TOKEN, 401, "No token"),
        (bearer("not-a-token-of-this-aggregator-at-all"), 401, "Unknown token"),
        (bearer(UPLOAD_TOKEN[:-1]), 401, "Unknown token"),
        ({"Authorization": f"Basic {UPLOAD_TOKEN}"}, 401, "not a bearer token"),
        (bearer(OTHER_UPLOAD_TOKEN), 403, "Token 'app-b' may not report metric 'browser'"),
        (bearer(READ_TOKEN), 403, "Token 'dashboard' is a read token; this call needs an upload token"),
    ],
    ids=["no token", "wrong token", "token prefix", "not bearer", "other app's token", "read token"],
)
def test_refused_uploads_count_nothing(start_aggregator, headers, status, reason):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    answer, got, body = post(aggregator, make_upload("browser", 200).SerializeToString(), headers=headers)
    assert answer == status and reason in json.loads(body)["error"]
    assert UPLOAD_TOKEN not in body.decode() and OTHER_UPLOAD_TOKEN not in body.decode()
    if status == 401:
        assert got["WWW-Authenticate"] == 'Bearer realm="veil"'
    assert counted(aggregator, "browser") == 0
    answer, _, _ = post(aggregator, make_upload("browser", 200).SerializeToString(), headers=bearer(UPLOAD_TOKEN))
    assert answer == 200 and counted(aggregator, "browser") == 200


def test_bad_bodies_stale_specs_and_unknown_metrics_are_refused_with_their_status(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    token = bearer(UPLOAD_TOKEN)
    garbage = b"\x0a\xff\xff\xff\xff\x0f"
    assert post(aggregator, garbage)[0] == 401  # never parsed without a token
    for body, content_type in (
        (garbage, PROTOBUF),
        (b"{not json", "application/json"),
        (b'{"count": "many"}', "application/json"),
    ):
        status, _, answer = post(aggregator, body, content_type, token)
        assert (status, json.loads(answer)["code"]) == (400, "INVALID_ARGUMENT")
    stale = make_upload("browser", 10)
    stale.spec_fingerprint = "0" * 32
    status, _, answer = post(aggregator, stale.SerializeToString(), headers=token)
    assert (status, json.loads(answer)["code"]) == (409, "FAILED_PRECONDITION")
    unknown = make_upload("browser", 10)
    unknown.metric = "nope"
    assert post(aggregator, unknown.SerializeToString(), headers=token)[0] == 409
    assert counted(aggregator, "browser") == 0


def test_a_rate_limited_upload_says_when_to_retry_and_counts_nothing(start_aggregator):
    aggregator = start_aggregator(max_batch=500, sections={"auth": auth_section(rate_limit=10, rate_burst=500)})
    token = bearer(UPLOAD_TOKEN)
    assert post(aggregator, make_upload("browser", 500).SerializeToString(), headers=token)[0] == 200
    status, headers, body = post(aggregator, make_upload("browser", 500).SerializeToString(), headers=token)
    assert (status, json.loads(body)["code"]) == (429, "RESOURCE_EXHAUSTED")
    wait = int(headers["retry-after-ms"])
    assert wait > 0 and int(headers["Retry-After"]) == -(-wait // 1000)
    assert counted(aggregator, "browser") == 500


def test_specs_over_http_in_json_and_protobuf_scoped_to_the_token(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    status, _, body = get(aggregator, "/v1/specs", bearer(UPLOAD_TOKEN))
    specs = json_format.Parse(body, veil_pb2.GetMetricSpecsResponse())
    assert status == 200 and sorted(s.name for s in specs.specs) == ["browser", "os"]
    status, _, body = get(aggregator, "/v1/specs?metric=os", {**bearer(READ_TOKEN), "Accept": PROTOBUF})
    specs = veil_pb2.GetMetricSpecsResponse.FromString(body)
    assert status == 200 and [s.name for s in specs.specs] == ["os"] and specs.max_batch > 0
    assert specs.specs[0].fingerprint == specs_of(METRICS)["os"].fingerprint
    assert get(aggregator, "/v1/specs")[0] == 401


def test_a_current_specs_check_is_answered_while_every_route_thread_is_busy(start_aggregator):
    """A device's daily check (If-None-Match naming the current version) is answered 304 on the
    listener's loop, token checked, without waiting for a route thread; a check that is not
    current (a full answer) waits for one."""
    aggregator = start_aggregator(sections={"auth": auth_section()})
    status, headers, _ = get(aggregator, "/v1/specs", bearer(UPLOAD_TOKEN))
    etag = headers["ETag"]
    release = threading.Event()
    routes = aggregator._http._pool
    busy = [routes.submit(release.wait) for _ in range(routes._max_workers)]
    try:
        assert get(aggregator, "/v1/specs", {**bearer(UPLOAD_TOKEN), "If-None-Match": etag})[0] == 304
        assert get(aggregator, "/v1/specs", {"If-None-Match": etag})[0] == 401
        waiting = routes.submit(lambda: None)
        assert not waiting.done()  # the threads are still all busy
    finally:
        release.set()
    assert all(f.result(10) for f in busy) and waiting.result(10) is None
    assert get(aggregator, "/v1/specs", {**bearer(UPLOAD_TOKEN), "If-None-Match": '"stale"'})[0] == 200


def test_fuzzed_uploads_count_exactly_what_was_accepted(start_aggregator):
    # Valid batches with bytes flipped, cut or grown: each is counted whole (200) or refused
    # whole (400 or 409); nothing else, and the counts are the accepted batches' exactly.
    aggregator = start_aggregator()
    rng = random.Random(19)
    accepted, statuses = 0, set()
    for i in range(150):
        body = bytearray(make_upload("os", rng.randrange(1, 40), seed=i).SerializeToString())
        for _ in range(rng.randrange(1, 4)):
            kind = rng.randrange(3) if body else 2
            if kind == 0:
                body[rng.randrange(len(body))] = rng.randrange(256)
            elif kind == 1:
                del body[rng.randrange(len(body)) :]
            else:
                body += rng.randbytes(rng.randrange(1, 8))
        status, _, answer = post(aggregator, bytes(body))
        assert status in (200, 400, 409), (status, answer)
        statuses.add(status)
        if status == 200:
            reply = veil_pb2.UploadResponse.FromString(answer)
            accepted += 0 if reply.duplicate else reply.accepted
    assert counted(aggregator, "os") == accepted and {200, 400} <= statuses


def test_cors_admits_the_configured_origins_only(start_aggregator):
    aggregator = start_aggregator(cors_origins=["https://app.example.com"])
    url = f"http://127.0.0.1:{aggregator.http_port}/v1/upload"
    for origin, allowed in (("https://app.example.com", True), ("https://evil.example.com", False)):
        preflight = urllib.request.Request(
            url,
            method="OPTIONS",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        with urllib.request.urlopen(preflight, timeout=10) as response:
            assert response.status == 204
            assert response.headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)
            if allowed:
                assert "POST" in response.headers["Access-Control-Allow-Methods"]
                assert "Authorization" in response.headers["Access-Control-Allow-Headers"]
                assert "If-None-Match" in response.headers["Access-Control-Allow-Headers"]  # the specs check
        status, headers, _ = post(aggregator, make_upload("os", 5).SerializeToString(), headers={"Origin": origin})
        assert status == 200 and headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)
        if allowed:
            assert "retry-after-ms" in headers["Access-Control-Expose-Headers"]
            assert "ETag" in headers["Access-Control-Expose-Headers"]
    assert counted(aggregator, "os") == 10


@pytest.mark.parametrize("origins", ["https://a.example", ["https://a.example/"], ["a.example"], [3]])
def test_cors_origins_must_be_origins(origins):
    from veil_testing.running import config_dict

    from veil.aggregator.config import parse_config
    from veil.aggregator.errors import ConfigError

    with pytest.raises(ConfigError, match="server.cors_origins"):
        parse_config(config_dict(cors_origins=origins))


def test_a_body_above_the_upload_limit_is_refused_unread_with_413(start_aggregator):
    from veil.aggregator.daemon import max_message_bytes

    aggregator = start_aggregator()
    status, headers, body = post(aggregator, b"\x00" * (max_message_bytes(aggregator.config) + 1))
    assert status == 413 and counted(aggregator, "os") == 0
    # The documented refusal, final: JSON {"error", "code"} like every other.
    assert headers["Content-Type"] == "application/json" and set(json.loads(body)) == {"error", "code"}
