"""Tokens replaced while serving (SIGHUP in `veil serve`): from the next call on, gRPC and HTTP
know only the new tokens, with their new scopes and rate limits; a reload that fails its checks
or would turn authentication off changes nothing; a supervisor passes SIGHUP to every worker."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

import grpc
import pytest
from veil_testing.running import (
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    UPLOAD_TOKEN,
    auth_section,
    bearer,
    config_dict,
    counted,
    make_upload,
)
from veil_testing.waiting import wait_until

from veil.aggregator._ratelimit import RateLimiter
from veil.aggregator.config import parse_config
from veil.aggregator.errors import ConfigError
from veil.wire.v1 import veil_pb2_grpc

NEW_UPLOAD_TOKEN = "upload-token-app-a-rotated-000000000000"
NEW_READ_TOKEN = "read-token-dashboard-rotated-1111111111"


def rotated(**options: object) -> dict:
    """auth_section() with app-a's and the dashboard's tokens replaced, app-b now also allowed
    to report browser, and any options (e.g. rate limits)."""
    return {
        "upload_tokens": [
            {"name": "app-a", "token": NEW_UPLOAD_TOKEN, "metrics": ["browser", "os"]},
            {"name": "app-b", "token": OTHER_UPLOAD_TOKEN, "metrics": ["crash_screen", "browser"]},
        ],
        "read_tokens": [{"name": "dashboard", "token": NEW_READ_TOKEN}],
        **options,
    }


def upload_code(endpoint: str, token: str, metric: str = "browser", n: int = 10) -> grpc.StatusCode:
    with grpc.insecure_channel(endpoint) as channel:
        try:
            veil_pb2_grpc.CollectorStub(channel).Upload(make_upload(metric, n), metadata=bearer(token), timeout=10)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def http_status(port: int, token: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/estimates", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def reloads(aggregator, outcome: str) -> float:
    return aggregator.instruments.registry.get_sample_value("veil_token_reloads_total", {"outcome": outcome}) or 0.0


def test_a_reload_swaps_the_tokens_for_grpc_and_http(start_aggregator):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    assert upload_code(endpoint, UPLOAD_TOKEN) == grpc.StatusCode.OK
    assert upload_code(endpoint, OTHER_UPLOAD_TOKEN) == grpc.StatusCode.PERMISSION_DENIED
    assert http_status(aggregator.http_port, READ_TOKEN) == 200

    assert aggregator.reload_tokens(lambda: parse_config({**config_dict(), "auth": rotated()}))
    assert upload_code(endpoint, UPLOAD_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert upload_code(endpoint, NEW_UPLOAD_TOKEN) == grpc.StatusCode.OK
    assert upload_code(endpoint, OTHER_UPLOAD_TOKEN) == grpc.StatusCode.OK  # its new scope
    assert http_status(aggregator.http_port, READ_TOKEN) == 401
    assert http_status(aggregator.http_port, NEW_READ_TOKEN) == 200
    assert counted(aggregator, "browser") == 30
    assert (reloads(aggregator, "reloaded"), reloads(aggregator, "failed")) == (1, 0)


def test_a_failed_reload_keeps_the_tokens_in_use(start_aggregator, caplog):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"

    def broken():
        raise ConfigError("auth.tokens_file: /etc/veil/tokens.toml is not valid TOML.")

    without_tokens = {**config_dict(), "auth": {"rate_limit": 10}}
    with caplog.at_level("ERROR", logger="veil.aggregator"):
        assert not aggregator.reload_tokens(broken)
        assert not aggregator.reload_tokens(lambda: parse_config(without_tokens))  # would open the server
    assert [r.getMessage() for r in caplog.records] == ["tokens not reloaded; the ones in use stay"] * 2
    assert "not valid TOML" in caplog.records[0].error
    assert "cannot turn it off" in caplog.records[1].error
    assert upload_code(endpoint, UPLOAD_TOKEN) == grpc.StatusCode.OK
    assert upload_code(endpoint, NEW_UPLOAD_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert (reloads(aggregator, "reloaded"), reloads(aggregator, "failed")) == (0, 2)


def test_authentication_off_stays_off(start_aggregator):
    aggregator = start_aggregator()
    assert not aggregator.reload_tokens(lambda: parse_config({**config_dict(), "auth": auth_section()}))
    assert upload_code(f"127.0.0.1:{aggregator.grpc_port}", "") == grpc.StatusCode.OK


def test_a_reload_brings_new_rate_limits(start_aggregator):
    def limited(burst: int):
        return {**config_dict(max_batch=100), "auth": auth_section(rate_limit=1, rate_burst=burst)}

    aggregator = start_aggregator(sections={"auth": limited(100)["auth"]}, max_batch=100)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    assert upload_code(endpoint, UPLOAD_TOKEN, n=100) == grpc.StatusCode.OK
    assert upload_code(endpoint, UPLOAD_TOKEN, n=100) == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The same limits again: the bucket stays empty (a reload hands out no fresh burst).
    assert aggregator.reload_tokens(lambda: parse_config(limited(100)))
    assert upload_code(endpoint, UPLOAD_TOKEN, n=100) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert aggregator.reload_tokens(lambda: parse_config(limited(200)))  # a new limit starts full
    assert [upload_code(endpoint, UPLOAD_TOKEN, n=100) for _ in range(3)] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.OK,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ]


def test_set_limits_keeps_unchanged_buckets():
    now = [0.0]
    limiter = RateLimiter({"a": (10, 100), "b": (10, 100)}, clock=lambda: now[0])
    assert limiter.take("a", 100) == 0.0 and limiter.take("b", 100) == 0.0
    limiter.set_limits({"a": (10, 100), "b": (10, 200), "c": (1, 5)})
    assert limiter.take("a", 10) == pytest.approx(1.0)  # still empty: 10 reports need a second
    assert limiter.take("b", 200) == 0.0  # a changed limit starts full
    assert limiter.limit("c") == (1, 5)
    limiter.set_limits({"b": (10, 200)})
    assert limiter.take("a", 10**6) == 0.0 and limiter.limit("a") is None  # no limit any more


def tokens_file(path, auth: dict) -> None:
    """A tokens file ([[upload_tokens]], [[read_tokens]]) with auth's tokens, owner-only."""
    lines = []
    for role in ("upload_tokens", "read_tokens"):
        for entry in auth[role]:
            lines.append(f"[[{role}]]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


def serve_with_tokens_file(serve_process, tmp_path, store_url: str, **server: object):
    secrets = tmp_path / "tokens.toml"
    tokens_file(secrets, auth_section())
    serve = serve_process(store_url, sections={"auth": {"tokens_file": str(secrets)}}, server=server)
    return serve, secrets


def log_lines(serve) -> list[dict]:
    return [json.loads(line) for line in serve.log.read_text().splitlines() if line.startswith("{")]


def test_sighup_reloads_the_tokens_file_of_veil_serve(serve_process, tmp_path):
    serve, secrets = serve_with_tokens_file(serve_process, tmp_path, "memory")
    serve.start()
    assert upload_code(serve.endpoint, UPLOAD_TOKEN) == grpc.StatusCode.OK
    secrets.write_text("not = [valid")
    serve.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: any(line["msg"].startswith("tokens not reloaded") for line in log_lines(serve)), 10)
    assert upload_code(serve.endpoint, UPLOAD_TOKEN) == grpc.StatusCode.OK
    tokens_file(secrets, rotated())
    serve.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: upload_code(serve.endpoint, NEW_UPLOAD_TOKEN) == grpc.StatusCode.OK, 10)
    assert upload_code(serve.endpoint, UPLOAD_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert serve.process.poll() is None
    assert serve.signal(signal.SIGTERM) == 0
    text = serve.log.read_text()
    assert NEW_UPLOAD_TOKEN not in text and UPLOAD_TOKEN not in text


def test_the_supervisor_passes_sighup_to_every_worker(serve_process, tmp_path, redis_server):
    serve, secrets = serve_with_tokens_file(serve_process, tmp_path, redis_server.url, processes=2)
    serve.start()
    assert wait_until(lambda: sum(line["msg"] == "aggregator started" for line in log_lines(serve)) == 2, 30)
    tokens_file(secrets, rotated())
    serve.process.send_signal(signal.SIGHUP)
    assert wait_until(
        lambda: {line.get("worker") for line in log_lines(serve) if line["msg"] == "tokens reloaded"} == {0, 1}, 10
    ), serve.log.read_text()
    assert not [line for line in log_lines(serve) if line["msg"].startswith("the config changed")]  # only tokens did
    # Each of 16 connections lands on one of the two workers: every one knows only the new token.
    for _ in range(16):
        assert upload_code(serve.endpoint, NEW_UPLOAD_TOKEN) == grpc.StatusCode.OK
        assert upload_code(serve.endpoint, UPLOAD_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert serve.signal(signal.SIGTERM) == 0


def test_other_changes_are_named_as_taking_a_restart(start_aggregator, caplog):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    with caplog.at_level("INFO", logger="veil.aggregator"):
        assert aggregator.reload_tokens(lambda: parse_config({**config_dict(), "auth": rotated()}))
        assert aggregator.reload_tokens(lambda: parse_config({**config_dict(min_n=5), "auth": rotated()}))
    assert [r.getMessage() for r in caplog.records] == [
        "tokens reloaded",
        "tokens reloaded",
        "the config changed besides [auth]; only tokens are reloaded, the rest takes a restart",
    ]
    assert aggregator.config.min_n == 100  # what it serves with
