"""TLS and mutual TLS on both listeners, with certificates made for the run (see running.Pki):
who gets through, that refused connections count nothing, the SDK and the CLI end to end,
the config's checks, and a certificate rotated on disk."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from veil_testing.pki import Pki
from veil_testing.running import READ_TOKEN, UPLOAD_TOKEN, auth_section, bearer, config_dict, counted, make_upload
from veil_testing.waiting import wait_until

from veil.aggregator.config import parse_config
from veil.aggregator.errors import ConfigError
from veil.cli import main
from veil.client import Reporter
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2_grpc


def start(start_aggregator, pki: Pki, *, mutual: bool = False, auth: bool = True, **server):
    sections = {"tls": pki.tls_section(mutual)}
    if auth:
        sections["auth"] = auth_section()
    return start_aggregator(sections=sections, **server)


def endpoint(aggregator) -> str:
    return f"127.0.0.1:{aggregator.grpc_port}"


def upload_over(channel: grpc.Channel, n: int = 100, timeout: float = 5):
    return veil_pb2_grpc.CollectorStub(channel).Upload(
        make_upload("browser", n), metadata=bearer(UPLOAD_TOKEN), timeout=timeout
    )


def fails(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        upload_over(channel, timeout=3)
    return err.value.code()


def test_tls_serves_a_client_that_trusts_the_ca_and_no_other(start_aggregator, pki):
    aggregator = start(start_aggregator, pki)
    good = grpc.secure_channel(endpoint(aggregator), pki.channel_credentials())
    assert upload_over(good).accepted == 100
    by_name = grpc.secure_channel(f"localhost:{aggregator.grpc_port}", pki.channel_credentials())
    assert upload_over(by_name).accepted == 100
    assert fails(grpc.insecure_channel(endpoint(aggregator))) == grpc.StatusCode.UNAVAILABLE  # plaintext to TLS
    distrusting = grpc.secure_channel(endpoint(aggregator), pki.channel_credentials(ca=pki.other_ca))
    assert fails(distrusting) == grpc.StatusCode.UNAVAILABLE
    assert counted(aggregator, "browser") == 200
    # Tokens still apply under TLS.
    with pytest.raises(grpc.RpcError) as err:
        veil_pb2_grpc.CollectorStub(good).Upload(make_upload("browser", 5), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Health stays open (no token), but over TLS.
    reply = health_pb2_grpc.HealthStub(good).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(start_aggregator, pki):
    aggregator = start(start_aggregator, pki, mutual=True)
    target = endpoint(aggregator)
    assert fails(grpc.secure_channel(target, pki.channel_credentials())) == grpc.StatusCode.UNAVAILABLE  # no cert
    wrong_ca = grpc.secure_channel(target, pki.channel_credentials(client="other"))
    assert fails(wrong_ca) == grpc.StatusCode.UNAVAILABLE
    assert fails(grpc.insecure_channel(target)) == grpc.StatusCode.UNAVAILABLE
    assert counted(aggregator, "browser") == 0
    good = grpc.secure_channel(target, pki.channel_credentials(client="good"))
    assert upload_over(good).accepted == 100 and counted(aggregator, "browser") == 100


def https_get(
    aggregator, path: str, context: ssl.SSLContext | None, token: str | None = READ_TOKEN, host: str = "127.0.0.1"
):
    request = urllib.request.Request(f"https://{host}:{aggregator.http_port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_https_and_its_refusals(start_aggregator, pki):
    aggregator = start(start_aggregator, pki)
    upload_over(grpc.secure_channel(endpoint(aggregator), pki.channel_credentials()), 300)
    status, body = https_get(aggregator, "/v1/estimates/browser?window=total", pki.ssl_context())
    assert status == 200 and json.loads(body)["estimates"][0]["n"] == 300
    assert https_get(aggregator, "/v1/estimates", pki.ssl_context(), token=None)[0] == 401
    assert https_get(aggregator, "/healthz", pki.ssl_context(), token=None)[0] == 200
    assert https_get(aggregator, "/healthz", pki.ssl_context(), token=None, host="localhost")[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # plaintext to an HTTPS port
        urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/healthz", timeout=10).read()
    untrusting = ssl.create_default_context(cafile=str(pki.other_ca))
    with pytest.raises(urllib.error.URLError) as err:
        https_get(aggregator, "/healthz", untrusting)
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError)
    # The listener still serves after the failed handshakes.
    assert https_get(aggregator, "/healthz", pki.ssl_context(), token=None)[0] == 200


def test_https_with_mutual_tls(start_aggregator, pki):
    aggregator = start(start_aggregator, pki, mutual=True)
    for client in (None, "other"):
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError, OSError)):
            https_get(aggregator, "/healthz", pki.ssl_context(client=client), token=None)
    assert https_get(aggregator, "/healthz", pki.ssl_context(client="good"), token=None)[0] == 200
    assert https_get(aggregator, "/metrics", pki.ssl_context(client="good"))[0] == 200


def test_a_slow_tls_client_holds_up_no_one(start_aggregator, pki):
    aggregator = start(start_aggregator, pki, auth=False)
    idle = [socket.create_connection(("127.0.0.1", aggregator.http_port)) for _ in range(3)]  # no handshake
    try:
        assert https_get(aggregator, "/healthz", pki.ssl_context(), token=None)[0] == 200
    finally:
        for connection in idle:
            connection.close()


def sdk_endpoint(aggregator, transport: str) -> str:
    return f"https://127.0.0.1:{aggregator.http_port}" if transport == "http" else endpoint(aggregator)


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_the_sdk_reports_with_a_token_and_a_ca(start_aggregator, pki, mutual, transport):
    aggregator = start(start_aggregator, pki, mutual=mutual)
    client = {"client_cert": str(pki.client_cert), "client_key": str(pki.client_key)} if mutual else {}
    with Reporter(
        sdk_endpoint(aggregator, transport),
        token=UPLOAD_TOKEN,
        ca_file=str(pki.ca),
        memoize=False,
        random_source=SeededRandomSource(3),
        **client,
    ) as reporter:
        assert reporter.wait_for_specs(10)
        for i in range(1000):
            reporter.report("browser", i % 8)
            reporter.report("os", i % 6)
        assert reporter.force_flush(30), reporter.counters()
        assert reporter.counters().sent == 2000
    assert counted(aggregator, "browser") == 1000 and counted(aggregator, "os") == 1000


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_the_sdk_without_the_ca_or_token_sends_nothing(start_aggregator, pki, transport):
    aggregator = start(start_aggregator, pki)
    # Without the CA it trusts only the system's roots: the handshake fails, the specs never come.
    with Reporter(sdk_endpoint(aggregator, transport), token=UPLOAD_TOKEN, export_timeout_ms=1000) as reporter:
        assert not reporter.wait_for_specs(2)
    # With the CA but no token: UNAUTHENTICATED.
    with Reporter(sdk_endpoint(aggregator, transport), ca_file=str(pki.ca), export_timeout_ms=1000) as reporter:
        assert not reporter.wait_for_specs(2)
    assert counted(aggregator, "browser") == 0


def test_the_cli_over_tls(start_aggregator, pki, capsys):
    aggregator = start(start_aggregator, pki, mutual=True)
    address = endpoint(aggregator)
    tls = ["--ca-file", str(pki.ca), "--client-cert", str(pki.client_cert), "--client-key", str(pki.client_key)]
    assert main(["health", "--address", address, *tls]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"
    assert main(["health", "--address", address, "--timeout", "2"]) == 1  # plaintext to a TLS port
    assert capsys.readouterr().out.strip() == "UNREACHABLE"
    assert main(["health", "--address", address, "--timeout", "2", "--ca-file", str(pki.ca)]) == 1  # no client cert
    assert capsys.readouterr().out.strip() == "UNREACHABLE"
    for mode in ("batch", "sdk"):
        assert (
            main(
                [
                    "simulate",
                    "os",
                    "--address",
                    address,
                    *tls,
                    "--token",
                    UPLOAD_TOKEN,
                    "--reports",
                    "60",
                    "--mode",
                    mode,
                    "--devices",
                    "6",
                    "--json",
                ]
            )
            == 0
        )
        assert json.loads(capsys.readouterr().out)["acknowledged"] == 60
    assert counted(aggregator, "os") == 120
    assert main(["simulate", "os", "--address", address, "--client-cert", str(pki.client_cert)]) == 2
    assert "--client-cert and --client-key go together" in capsys.readouterr().err
    assert main(["simulate", "os", "--address", address, "--ca-file", "/nonexistent/ca.pem"]) == 2
    assert "--ca-file: cannot read /nonexistent/ca.pem" in capsys.readouterr().err
    assert main(["health", "--address", address, "--ca-file", str(pki.client_key)]) == 2  # a key, not a certificate
    assert f"--ca-file: {pki.client_key} holds no PEM certificate." in capsys.readouterr().err


def test_the_environment_supplies_the_cli_tls_and_token(start_aggregator, pki, capsys, monkeypatch):
    aggregator = start(start_aggregator, pki)
    monkeypatch.setenv("VEIL_ENDPOINT", endpoint(aggregator))
    monkeypatch.setenv("VEIL_CA_FILE", str(pki.ca))
    monkeypatch.setenv("VEIL_TOKEN", UPLOAD_TOKEN)
    assert main(["simulate", "browser", "--reports", "500", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["acknowledged"] == 500
    assert counted(aggregator, "browser") == 500


def test_a_served_aggregator_with_tls_and_tokens(tmp_path, pki, serve_process, capsys):
    secrets = tmp_path / "tokens.toml"
    secrets.write_text(f'[[upload_tokens]]\nname = "app-a"\ntoken = "{UPLOAD_TOKEN}"\nmetrics = ["os"]\n')
    secrets.chmod(0o600)
    process = serve_process(
        "memory", sections={"tls": pki.tls_section(), "auth": {"tokens_file": str(secrets)}}
    ).start()
    assert main(["health", "--address", process.endpoint, "--tls", "--ca-file", str(pki.ca)]) == 0
    assert (
        main(
            [
                "simulate",
                "os",
                "--address",
                process.endpoint,
                "--ca-file",
                str(pki.ca),
                "--token",
                UPLOAD_TOKEN,
                "--reports",
                "300",
                "--json",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("SERVING\n") and json.loads(out[len("SERVING\n") :])["acknowledged"] == 300
    import signal

    assert process.signal(signal.SIGTERM) == 0
    logged = process.log.read_text()
    assert "serving gRPC with TLS" in logged and '"TLS on"' in logged and UPLOAD_TOKEN not in logged


# -- the config -----------------------------------------------------------------------------------


def tls_config(pki: Pki, **tls) -> dict:
    return {**config_dict("memory"), "tls": {**pki.tls_section(), **tls}}


def test_tls_config_errors_name_the_key(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    garbage.chmod(0o600)
    cases = [
        ({"cert_file": str(tmp_path / "missing.crt")}, "tls.cert_file: cannot read"),
        ({"cert_file": str(garbage)}, "tls.cert_file: "),
        ({"key_file": str(garbage)}, "tls.key_file: "),
        ({"key_file": str(pki.client_key)}, "tls.key_file: "),  # a key, but not the certificate's
        ({"client_ca_file": str(garbage)}, "tls.client_ca_file: "),
        ({"colour": "red"}, "tls.colour: unknown key"),
    ]
    for tls, key in cases:
        with pytest.raises(ConfigError) as err:
            parse_config(tls_config(pki, **tls))
        assert str(err.value).startswith(key), (tls, str(err.value))
    with pytest.raises(ConfigError, match=r"^tls.key_file: required"):
        parse_config({**config_dict("memory"), "tls": {"cert_file": str(pki.server_cert)}})
    with pytest.raises(ConfigError) as err:
        parse_config(tls_config(pki, key_file=str(pki.client_key)))
    assert "is not the key of the certificate in tls.cert_file" in str(err.value)


def test_the_key_file_must_be_private(pki, tmp_path):
    key = tmp_path / "server.key"
    key.write_bytes(pki.server_key.read_bytes())
    key.chmod(0o644)
    with pytest.raises(ConfigError) as err:
        parse_config(tls_config(pki, key_file=str(key)))
    assert str(err.value).startswith(f"tls.key_file: {key} is open to group or others (mode 0644)")


# -- rotation -------------------------------------------------------------------------------------


def served_certificate(port: int, pki: Pki) -> str:
    """The common name of the certificate a listener presents now (a fresh connection)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            subject = dict(item[0] for item in tls.getpeercert()["subject"])
    return subject["commonName"]


def test_a_rotated_certificate_is_served_without_a_restart(start_aggregator, tmp_path):
    pki = Pki(tmp_path / "pki")  # its own: the rotation must not touch the session's
    aggregator = start(start_aggregator, pki, auth=False)
    ports = (aggregator.grpc_port, aggregator.http_port)
    assert [served_certificate(p, pki) for p in ports] == ["veil aggregator"] * 2
    channel = grpc.secure_channel(endpoint(aggregator), pki.channel_credentials())
    assert upload_over(channel).accepted == 100
    time.sleep(1.1)  # files are looked at again at most once a second
    pki.reissue_server("veil aggregator, rotated")
    assert wait_until(lambda: [served_certificate(p, pki) for p in ports] == ["veil aggregator, rotated"] * 2)
    assert upload_over(channel).accepted == 100  # the open connection carries on
    fresh = grpc.secure_channel(endpoint(aggregator), pki.channel_credentials())
    assert upload_over(fresh).accepted == 100 and counted(aggregator, "browser") == 300
    # A broken rotation (a key that does not match) keeps the last good files.
    time.sleep(1.1)
    pki.server_key.write_bytes(pki.client_key.read_bytes())
    time.sleep(2.1)  # files are looked at again at most once a second, and gRPC's watcher reads them every second
    assert [served_certificate(p, pki) for p in ports] == ["veil aggregator, rotated"] * 2


def test_an_expired_certificate_is_refused_at_start_and_by_check_config(tmp_path):
    from test_cli_serve import check  # a process of its own: `serve` sets up the process's logging
    from veil_testing.config_toml import config_toml

    pki = Pki(tmp_path / "pki")
    pki.reissue_server("veil aggregator, expired", days=-1)
    with pytest.raises(ConfigError, match=r"^tls.cert_file: the certificate in .* expired on "):
        parse_config(tls_config(pki))
    path = tmp_path / "veil.toml"
    path.write_text(config_toml(tls_config(pki)))
    out = check(path)
    assert out.returncode == 2 and "expired on" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_a_rotation_to_an_expired_certificate_keeps_the_old_one_and_logs_an_error(start_aggregator, tmp_path, caplog):
    pki = Pki(tmp_path / "pki")
    aggregator = start(start_aggregator, pki, auth=False)
    time.sleep(1.1)  # files are looked at again at most once a second
    with caplog.at_level("INFO", logger="veil.aggregator"):
        pki.reissue_server("veil aggregator, expired", days=-1)
        time.sleep(2.1)  # as long as gRPC's watcher, reading the files every second, could take to follow
        assert served_certificate(aggregator.grpc_port, pki) == "veil aggregator"
        assert served_certificate(aggregator.http_port, pki) == "veil aggregator"
    (refused,) = [r for r in caplog.records if r.getMessage().startswith("TLS files changed but cannot be used")]
    assert refused.levelname == "ERROR" and "expired on" in refused.problem


def test_a_key_made_private_with_chmod_alone_is_reloaded(start_aggregator, tmp_path):
    pki = Pki(tmp_path / "pki")
    aggregator = start(start_aggregator, pki, auth=False)
    time.sleep(1.1)
    pki.reissue_server("veil aggregator, rotated", key_mode=0o644)  # refused: readable by others
    time.sleep(1.1)
    assert served_certificate(aggregator.grpc_port, pki) == "veil aggregator"
    pki.server_key.chmod(0o600)  # the fix an operator makes: the file's contents and mtime stay
    assert wait_until(lambda: served_certificate(aggregator.grpc_port, pki) == "veil aggregator, rotated")
