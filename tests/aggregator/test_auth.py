"""Tokens: who may upload what and who may read, over real gRPC and HTTP; nothing of a refused
call is counted; token values never show in logs, errors or responses; the config's checks."""

from __future__ import annotations

import io
import json
import logging
import os
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from veil_testing.running import (
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    SPEC_NAMES,
    TOKENS,
    UPLOAD_TOKEN,
    auth_section,
    bearer,
    config_dict,
    counted,
    make_upload,
)

from veil.aggregator.config import load_config, parse_config
from veil.aggregator.decode import UNPARSEABLE
from veil.aggregator.errors import ConfigError
from veil.aggregator.logs import JsonFormatter
from veil.cli import main
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture
def veil_log():
    """Everything the `veil` loggers write at DEBUG and above, as the JSON lines `veil serve` writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("veil")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def secured(start_aggregator, veil_log):
    """An aggregator with app-a (browser, os), app-b (crash_screen) and a read token."""
    return start_aggregator(sections={"auth": auth_section()})


def stubs(aggregator):
    channel = grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}")
    return veil_pb2_grpc.CollectorStub(channel), veil_pb2_grpc.EstimatesStub(channel)


def refused(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            next(result)
    for token in TOKENS:
        assert token not in (err.value.details() or "")
    return err.value


NO_TOKEN = None
WRONG_TOKEN = "not-a-token-of-this-aggregator-at-all"


@pytest.mark.parametrize(
    "metadata, code, reason",
    [
        (NO_TOKEN, UNAUTHENTICATED, "No token"),
        (bearer(WRONG_TOKEN), UNAUTHENTICATED, "Unknown token"),
        (bearer(UPLOAD_TOKEN[:-1]), UNAUTHENTICATED, "Unknown token"),  # a prefix of a real one
        ((("authorization", f"Basic {UPLOAD_TOKEN}"),), UNAUTHENTICATED, "not a bearer token"),
        (
            (("authorization", f"Bearer {UPLOAD_TOKEN}"), ("authorization", f"Bearer {UPLOAD_TOKEN}")),
            UNAUTHENTICATED,
            "More than one",
        ),
        (bearer(OTHER_UPLOAD_TOKEN), PERMISSION_DENIED, "Token 'app-b' may not report metric 'browser'"),
        (bearer(READ_TOKEN), PERMISSION_DENIED, "Token 'dashboard' is a read token; this call needs an upload token"),
    ],
    ids=[
        "no token",
        "wrong token",
        "token prefix",
        "not bearer",
        "two tokens",
        "other app's token",
        "read token used to upload",
    ],
)
def test_refused_uploads_count_nothing(secured, metadata, code, reason):
    collector, _ = stubs(secured)
    error = refused(collector.Upload, make_upload("browser", 200), metadata=metadata, timeout=10)
    assert error.code() == code and reason in error.details()
    assert counted(secured, "browser") == 0
    reply = collector.Upload(make_upload("browser", 200), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert reply.accepted == 200 and counted(secured, "browser") == 200


def test_bytes_that_are_not_an_upload_are_refused_after_the_token_check(secured):
    channel = grpc.insecure_channel(f"127.0.0.1:{secured.grpc_port}")
    raw = channel.unary_unary("/veil.wire.v1.Collector/Upload")
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # a length-delimited field running past the end
    assert refused(raw, garbage, timeout=10).code() == UNAUTHENTICATED  # never parsed without a token
    error = refused(raw, garbage, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        UNPARSEABLE,
    )
    assert counted(secured, "browser") == 0


def test_an_upload_token_reports_only_its_metrics_and_sees_only_their_specs(secured):
    collector, _ = stubs(secured)
    for metric in ("browser", "os"):
        assert collector.Upload(make_upload(metric, 150), metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 150
    error = refused(collector.Upload, make_upload("crash_screen", 10), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert error.code() == PERMISSION_DENIED and "Token 'app-a' may not report metric 'crash_screen'" in error.details()
    # A request naming a metric outside the scope is refused before it is looked at further.
    request = make_upload("opted_in", 10)
    assert refused(collector.Upload, request, metadata=bearer(UPLOAD_TOKEN), timeout=10).code() == PERMISSION_DENIED
    # An undeclared metric is FAILED_PRECONDITION for every token, as veil.proto promises (the
    # SDK fetches the specs again); PERMISSION_DENIED is for declared metrics outside the scope.
    request.metric = "nope"
    error = refused(collector.Upload, request, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "Metric 'nope' is not declared" in error.details()
    assert collector.Upload(make_upload("crash_screen", 10), metadata=bearer(OTHER_UPLOAD_TOKEN), timeout=10)
    assert [counted(secured, m) for m in ("browser", "os", "crash_screen", "opted_in")] == [150, 150, 10, 0]

    def spec_names(token, *metrics):
        response = collector.GetMetricSpecs(
            veil_pb2.GetMetricSpecsRequest(metrics=metrics), metadata=bearer(token), timeout=10
        )
        return [s.name for s in response.specs]

    assert spec_names(UPLOAD_TOKEN) == ["browser", "os"]
    assert spec_names(UPLOAD_TOKEN, "os", "crash_screen") == ["os"]
    assert spec_names(UPLOAD_TOKEN, "crash_screen") == []
    assert spec_names(OTHER_UPLOAD_TOKEN) == ["crash_screen"]
    assert spec_names(READ_TOKEN) == list(SPEC_NAMES)
    for token in (UPLOAD_TOKEN, READ_TOKEN):  # every caller learns the largest batch it may send
        response = collector.GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(), metadata=bearer(token), timeout=10)
        assert response.max_batch == secured.config.max_batch
    for metadata in (NO_TOKEN, bearer(WRONG_TOKEN)):
        error = refused(collector.GetMetricSpecs, veil_pb2.GetMetricSpecsRequest(), metadata=metadata, timeout=10)
        assert error.code() == UNAUTHENTICATED


def test_estimates_need_a_read_token_for_get_watch_and_series(secured):
    collector, estimates = stubs(secured)
    collector.Upload(make_upload("os", 300), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    request, watch = veil_pb2.EstimatesRequest(metric="os"), veil_pb2.WatchRequest(metric="os")
    series = veil_pb2.SeriesRequest(metric="browser", window="1h")
    for metadata, code in (
        (NO_TOKEN, UNAUTHENTICATED),
        (bearer(WRONG_TOKEN), UNAUTHENTICATED),
        (bearer(UPLOAD_TOKEN), PERMISSION_DENIED),
    ):
        assert refused(estimates.Get, request, metadata=metadata, timeout=10).code() == code
        assert refused(estimates.Watch, watch, metadata=metadata, timeout=10).code() == code
        assert refused(estimates.Series, series, metadata=metadata, timeout=10).code() == code
    assert estimates.Series(series, metadata=bearer(READ_TOKEN), timeout=10).estimates[-1].metric == "browser"
    error = refused(estimates.Get, request, metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert "Token 'app-a' is an upload token; this call needs a read token" in error.details()
    response = estimates.Get(request, metadata=bearer(READ_TOKEN), timeout=10)
    assert {e.window: e.n for e in response.estimates} == {"total": 300}
    stream = estimates.Watch(watch, metadata=bearer(READ_TOKEN), timeout=10)
    assert next(stream).estimates[0].n == 300
    stream.cancel()


def test_health_and_reflection_stay_open(secured):
    channel = grpc.insecure_channel(f"127.0.0.1:{secured.grpc_port}")
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = {s.name for s in next(answers).list_services_response.service}
    assert "veil.wire.v1.Collector" in names


def http_get(aggregator, path: str, token: str | None = None, scheme: str = "Bearer"):
    request = urllib.request.Request(f"http://127.0.0.1:{aggregator.http_port}{path}")
    if token:
        request.add_header("Authorization", f"{scheme} {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.mark.parametrize(
    "path", ["/v1/estimates", "/v1/estimates/os?window=total", "/v1/series/browser?window=1h", "/metrics"]
)
def test_http_estimates_and_metrics_need_a_read_token(secured, path):
    stubs(secured)[0].Upload(make_upload("os", 300), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    for token, scheme in ((None, "Bearer"), (WRONG_TOKEN, "Bearer"), (READ_TOKEN, "Basic")):
        status, headers, body = http_get(secured, path, token, scheme)
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="veil"'
        assert not any(t.encode() in body for t in TOKENS)
    status, headers, body = http_get(secured, path, UPLOAD_TOKEN)
    assert status == 403 and "insufficient_scope" in headers["WWW-Authenticate"] and b"app-a" in body
    status, _, body = http_get(secured, path, READ_TOKEN)
    assert status == 200
    if path.startswith("/v1/series/"):
        assert json.loads(body)["estimates"][-1]["metric"] == "browser"
    elif path.startswith("/v1/"):
        assert {e["metric"]: e["n"] for e in json.loads(body)["estimates"] if e["window"] == "total"}["os"] == 300
    else:
        assert b'veil_window_reports{metric="os",window="total"} 300.0' in body
        assert b'veil_token_reports_total{token="app-a"} 300.0' in body  # names only


def test_http_health_and_the_dashboard_page_stay_open(secured):
    assert http_get(secured, "/healthz")[0] == 200
    assert http_get(secured, "/")[0] == 200


def test_tokens_never_show_in_logs(secured, veil_log, capfd):
    collector, estimates = stubs(secured)
    for token in (*TOKENS, WRONG_TOKEN, None):
        for call, request in (
            (collector.Upload, make_upload("browser", 20)),
            (collector.GetMetricSpecs, veil_pb2.GetMetricSpecsRequest()),
            (estimates.Get, veil_pb2.EstimatesRequest()),
        ):
            try:
                call(request, metadata=bearer(token), timeout=10)
            except grpc.RpcError:
                pass
        http_get(secured, "/v1/estimates", token)
    secured.stop(grace=0)
    logged = veil_log.getvalue() + "".join(capfd.readouterr())
    assert "call refused" in logged and "app-a" in logged  # the log has the events, by token name
    for token in (*TOKENS, WRONG_TOKEN):
        assert token not in logged


def test_authentication_off_says_so_loudly(start_aggregator, veil_log):
    aggregator = start_aggregator()
    assert stubs(aggregator)[0].Upload(make_upload("browser", 10), timeout=10).accepted == 10
    warnings = [json.loads(line) for line in veil_log.getvalue().splitlines()]
    assert any(w["level"] == "warning" and w["msg"].startswith("authentication is OFF") for w in warnings)


def test_a_served_aggregator_reads_tokens_from_its_secrets_file(tmp_path, serve_process):
    secrets = tmp_path / "tokens.toml"
    secrets.write_text(
        f'[[upload_tokens]]\nname = "app-a"\ntoken = "{UPLOAD_TOKEN}"\nmetrics = ["browser"]\n'
        f'[[read_tokens]]\nname = "dashboard"\ntoken = "{READ_TOKEN}"\n'
    )
    secrets.chmod(0o600)
    process = serve_process("memory", sections={"auth": {"tokens_file": "tokens.toml"}}).start()  # relative
    channel = grpc.insecure_channel(process.endpoint)
    collector = veil_pb2_grpc.CollectorStub(channel)
    assert refused(collector.Upload, make_upload("browser", 20), timeout=10).code() == UNAUTHENTICATED
    assert collector.Upload(make_upload("browser", 20), metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 20
    response = veil_pb2_grpc.EstimatesStub(channel).Get(
        veil_pb2.EstimatesRequest(metric="browser", window="total"), metadata=bearer(READ_TOKEN), timeout=10
    )
    assert response.estimates[0].n == 20
    import signal

    assert process.signal(signal.SIGTERM) == 0
    logged = process.log.read_text()
    assert '"authentication on"' in logged and '"app-a"' in logged
    assert UPLOAD_TOKEN not in logged and READ_TOKEN not in logged


def test_the_cli_sends_its_token_and_never_prints_it(secured, capsys, monkeypatch):
    address = f"127.0.0.1:{secured.grpc_port}"
    assert main(["simulate", "browser", "--address", address, "--reports", "1000", "--json"]) == 2
    out, err = capsys.readouterr()
    assert "UNAUTHENTICATED" in err
    assert (
        main(["simulate", "browser", "--address", address, "--reports", "1000", "--json", "--token", UPLOAD_TOKEN]) == 0
    )
    assert json.loads(capsys.readouterr().out)["acknowledged"] == 1000
    monkeypatch.setenv("VEIL_TOKEN", UPLOAD_TOKEN)
    assert (
        main(["simulate", "os", "--address", address, "--reports", "50", "--mode", "sdk", "--devices", "5", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["acknowledged"] == 50
    assert main(["simulate", "crash_screen", "--address", address, "--reports", "100"]) == 2  # app-a's scope
    out, err = capsys.readouterr()
    assert "declares no metric 'crash_screen'" in err  # its specs hold browser and os only
    assert main(["estimates", "os", "--address", address, "--json", "--token", READ_TOKEN]) == 0
    assert json.loads(capsys.readouterr().out)["estimates"][0]["n"] == 50
    assert main(["estimates", "os", "--address", address, "--token", WRONG_TOKEN]) == 2
    out, err = capsys.readouterr()
    assert "UNAUTHENTICATED" in err and WRONG_TOKEN not in out + err and UPLOAD_TOKEN not in out + err
    assert counted(secured, "browser") == 1000 and counted(secured, "crash_screen") == 0


# -- the config -----------------------------------------------------------------------------------


def config(auth: dict, **server) -> dict:
    return {**config_dict("memory", **server), "auth": auth}


def upload_token(**fields) -> dict:
    return {"name": "app-a", "token": UPLOAD_TOKEN, "metrics": ["browser"], **fields}


@pytest.mark.parametrize(
    "auth, key",
    [
        (
            {"upload_tokens": [upload_token(metrics=["browser", "nope"])]},
            "auth.upload_tokens[0].metrics[1]: 'nope' is not",
        ),
        ({"upload_tokens": [upload_token(metrics=[])]}, "auth.upload_tokens[0].metrics: expected a non-empty list"),
        ({"upload_tokens": [upload_token(metrics="browser")]}, "auth.upload_tokens[0].metrics:"),
        ({"upload_tokens": [upload_token(token="short-secret")]}, "auth.upload_tokens[0].token: expected 16"),
        ({"upload_tokens": [upload_token(token=UPLOAD_TOKEN + " x")]}, "auth.upload_tokens[0].token: expected 16"),
        ({"upload_tokens": [upload_token(token=12345)]}, "auth.upload_tokens[0].token: expected a string"),
        ({"upload_tokens": [upload_token(name="app a")]}, "auth.upload_tokens[0].name: expected up to 64"),
        ({"upload_tokens": [upload_token(colour="red")]}, "auth.upload_tokens[0].colour: unknown key"),
        (
            {"read_tokens": [{"name": "r", "token": READ_TOKEN, "metrics": ["browser"]}]},
            "auth.read_tokens[0].metrics: unknown",
        ),
        (
            {"upload_tokens": [upload_token()], "read_tokens": [{"name": "app-a", "token": READ_TOKEN}]},
            "auth.read_tokens[0].name: 'app-a' is also the name of auth.upload_tokens[0]",
        ),
        (
            {"upload_tokens": [upload_token()], "read_tokens": [{"name": "r", "token": UPLOAD_TOKEN}]},
            "auth.read_tokens[0].token: the same token value is given twice",
        ),
        ({"upload_tokens": {"name": "x"}}, "auth.upload_tokens: expected an array of tables ([[auth.upload_tokens]])"),
        ({"rate_limit": -1}, "auth.rate_limit: expected reports per second"),
        ({"rate_limit": 100, "rate_burst": 50}, "auth.rate_burst: expected at least server.max_batch (10000)"),
        (
            {"upload_tokens": [upload_token(rate_limit=10, rate_burst=9999)]},
            "auth.upload_tokens[0].rate_burst: expected at least server.max_batch",
        ),
        ({"tokens": []}, "auth.tokens: unknown key"),
    ],
)
def test_auth_config_errors_name_the_key_and_never_the_token(auth, key):
    with pytest.raises(ConfigError) as err:
        parse_config(config(auth))
    assert str(err.value).startswith(key), str(err.value)
    assert not any(t in str(err.value) for t in (*TOKENS, "short-secret"))


def test_token_config(monkeypatch):
    parsed = parse_config(config(auth_section(rate_limit=500)))
    auth = parsed.auth
    assert auth.enabled and [t.name for t in auth.tokens] == ["app-a", "app-b", "dashboard"]
    app_a = auth.tokens[0]
    assert app_a.metrics == {"browser", "os"} and (app_a.rate_limit, app_a.rate_burst) == (500, 10_000)
    assert UPLOAD_TOKEN not in repr(parsed) and app_a.digest.hex() not in repr(parsed)  # digests only, unshown
    defaults = parse_config(config(auth_section())).auth.tokens[0]
    assert (defaults.rate_limit, defaults.rate_burst) == (100_000, 200_000)
    own = parse_config(config({"rate_limit": 50, "upload_tokens": [upload_token(rate_limit=0)]})).auth.tokens[0]
    assert own.rate_limit == 0  # unlimited
    off = parse_config(config_dict("memory")).auth
    assert not off.enabled and off.anonymous_rate_limit == 0


def write_secrets(path, text: str, mode: int):
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "owner, mode, good",
    [
        ("user", 0o600, True),
        ("user", 0o400, True),
        ("user", 0o640, False),
        ("user", 0o604, False),
        ("user", 0o660, False),
        ("user", 0o644, False),
        ("root", 0o600, True),
        ("root", 0o640, True),
        ("root", 0o440, True),  # a Kubernetes secret with an fsGroup
        ("root", 0o660, False),
        ("root", 0o644, False),
        ("root", 0o604, False),
    ],
)
def test_the_secrets_file_must_be_owner_only(tmp_path, owner, mode, good):
    path = write_secrets(tmp_path / "tokens.toml", f'[[read_tokens]]\nname = "r"\ntoken = "{READ_TOKEN}"\n', mode)
    if os.geteuid() == 0:
        if owner == "user":
            os.chown(path, 65534, -1)  # nobody: root may still read it
    elif owner == "root":
        pytest.skip("only root can make a file root's")
    data = config({"tokens_file": str(path)})
    if good:
        assert parse_config(data).auth.of_role("read")[0].name == "r"
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).startswith(f"auth.tokens_file: {path} is open to group or others (mode {mode:04o})")


def test_secrets_file_errors_name_the_file_and_key_never_the_content(tmp_path):
    path = tmp_path / "tokens.toml"
    cases = [
        (
            f'[[upload_tokens]]\nname = "a"\ntoken = "{UPLOAD_TOKEN}"\nmetrics = ["nope"]\n',
            f"{path}: upload_tokens[0].metrics[0]: 'nope' is not a declared metric",
        ),
        (f'[[upload_tokens]]\nname = "a"\ntoken = "{UPLOAD_TOKEN}\n', f"auth.tokens_file: {path} is not valid TOML"),
        (f'token = "{UPLOAD_TOKEN}"\n', f"{path}: token: unknown key"),
        (
            f'[[read_tokens]]\nname = "dashboard"\ntoken = "{READ_TOKEN}"\n',
            f"{path}: read_tokens[0].name: 'dashboard' is also the name of auth.read_tokens[0]",
        ),
    ]
    for text, message in cases:
        write_secrets(path, text, 0o600)
        with pytest.raises(ConfigError) as err:
            parse_config(config({"tokens_file": str(path), "read_tokens": [{"name": "dashboard", "token": "x" * 16}]}))
        assert str(err.value).startswith(message), str(err.value)
        assert UPLOAD_TOKEN not in str(err.value) and READ_TOKEN not in str(err.value)
    with pytest.raises(ConfigError, match=r"^auth.tokens_file: cannot read"):
        parse_config(config({"tokens_file": str(tmp_path / "missing.toml")}))


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    write_secrets(tmp_path / "tokens.toml", f'[[read_tokens]]\nname = "r"\ntoken = "{READ_TOKEN}"\n', 0o600)
    (tmp_path / "veil.toml").write_text(
        '[auth]\ntokens_file = "tokens.toml"\n[[metrics]]\nname = "m"\nlabels = ["x", "y"]\nepsilon = 1\n'
    )
    monkeypatch.chdir("/")
    loaded = load_config(tmp_path / "veil.toml")
    assert loaded.auth.tokens_file == tmp_path / "tokens.toml" and loaded.auth.tokens[0].name == "r"


def test_tokens_inline_in_a_config_others_may_read_are_refused(tmp_path):
    from veil_testing.config_toml import config_toml

    path = tmp_path / "veil.toml"
    path.write_text(config_toml(config(auth_section())))
    path.chmod(0o644)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"auth (tokens inline): {path} is open to group or others (mode 0644)")
    path.chmod(0o600)
    assert load_config(path).auth.enabled
    path.write_text(config_toml(config_dict("memory")))  # no tokens in it: any mode will do
    path.chmod(0o644)
    assert not load_config(path).auth.enabled
