"""Settings: explicit argument, then VEIL_* environment variable, then default."""

from __future__ import annotations

import logging

import pytest
from loopback_collector import FAST

from veil.client import ConfigError, Reporter, ReporterError
from veil.client import environment_variables as env
from veil.client._config import resolve_config


def test_defaults():
    config = resolve_config({}, endpoint="host:1")
    assert (config.endpoint, config.token, config.tls, config.queue_dir) == ("host:1", None, True, None)
    assert (config.max_queue_size, config.max_batch_size, config.schedule_delay, config.export_timeout) == (
        2048,
        512,
        5.0,
        10.0,
    )
    assert (config.spec_ttl, config.max_disk_bytes, config.backoff_initial, config.backoff_max) == (
        3600.0,
        16 << 20,
        1.0,
        60.0,
    )


def test_environment_beats_defaults_and_arguments_beat_the_environment(tmp_path):
    environ = {
        env.VEIL_ENDPOINT: "env:1",
        env.VEIL_TOKEN: "tok",
        env.VEIL_TLS: "false",
        env.VEIL_QUEUE_DIR: str(tmp_path),
        env.VEIL_MAX_QUEUE_SIZE: "100",
        env.VEIL_MAX_BATCH_SIZE: "10",
        env.VEIL_SCHEDULE_DELAY_MS: "250",
        env.VEIL_EXPORT_TIMEOUT_MS: "1500",
        env.VEIL_SPEC_TTL_MS: "60000",
        env.VEIL_MAX_DISK_BYTES: "4096",
        env.VEIL_RETRY_INITIAL_BACKOFF_MS: "20",
        env.VEIL_RETRY_MAX_BACKOFF_MS: "400",
    }
    config = resolve_config(environ)
    assert (config.endpoint, config.token, config.tls, config.queue_dir) == ("env:1", "tok", False, tmp_path)
    assert (
        config.max_queue_size,
        config.max_batch_size,
        config.schedule_delay,
        config.export_timeout,
        config.spec_ttl,
        config.max_disk_bytes,
        config.backoff_initial,
        config.backoff_max,
    ) == (100, 10, 0.25, 1.5, 60.0, 4096, 0.02, 0.4)
    config = resolve_config(environ, endpoint="arg:2", tls=True, max_queue_size=7, schedule_delay_ms=1)
    assert (config.endpoint, config.tls, config.max_queue_size, config.max_batch_size, config.schedule_delay) == (
        "arg:2",
        True,
        7,
        7,
        0.001,
    )


def test_unparsable_environment_values_are_logged_by_name_and_ignored(caplog):
    environ = {
        env.VEIL_ENDPOINT: "h:1",
        env.VEIL_MAX_BATCH_SIZE: "lots",
        env.VEIL_TLS: "maybe",
        env.VEIL_SCHEDULE_DELAY_MS: "-5",
    }
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        config = resolve_config(environ)
    assert (config.max_batch_size, config.tls, config.schedule_delay) == (512, True, 5.0)
    text = caplog.text
    assert env.VEIL_MAX_BATCH_SIZE in text and env.VEIL_TLS in text and "lots" not in text and "maybe" not in text


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"endpoint": "h:1", "max_queue_size": 0},
        {"endpoint": "h:1", "max_batch_size": "5"},
        {"endpoint": "h:1", "tls": "yes"},
        {"endpoint": "h:1", "token": "has space"},
        {"endpoint": "h:1", "client_cert": "/x"},
        {"endpoint": "h:1", "tls": False, "ca_file": "/x"},
        {"endpoint": "h:1", "ca_file": "/does/not/exist"},
    ],
)
def test_invalid_arguments_raise_config_error(arguments):
    with pytest.raises(ConfigError) as error:
        resolve_config({}, **arguments)
    assert isinstance(error.value, ReporterError) and isinstance(error.value, ValueError)
    assert "has space" not in str(error.value)


def test_the_reporter_reads_the_environment_in_its_constructor(monkeypatch):
    monkeypatch.setenv(env.VEIL_ENDPOINT, "127.0.0.1:1")
    monkeypatch.setenv(env.VEIL_TLS, "false")
    reporter = Reporter()
    try:
        assert reporter._processor.config.endpoint == "127.0.0.1:1"
    finally:
        reporter.shutdown(1)
    with pytest.raises(ConfigError):
        Reporter("h:1", memoize="sometimes")


def test_loopback_detection():
    assert resolve_config({}, endpoint="localhost:1").loopback
    assert resolve_config({}, endpoint="127.0.0.2:1").loopback
    assert resolve_config({}, endpoint="[::1]:1").loopback
    assert not resolve_config({}, endpoint="example.com:1").loopback


def test_tls_is_the_default_except_to_this_machine_when_nothing_asks_for_it(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----")
    for endpoint in ("127.0.0.1:50051", "localhost:50051", "[::1]:50051"):
        assert not resolve_config({}, endpoint=endpoint).tls
        assert resolve_config({}, endpoint=endpoint, ca_file=str(ca)).tls
        assert resolve_config({}, endpoint=endpoint, tls=True).tls
        assert resolve_config({env.VEIL_TLS: "true"}, endpoint=endpoint).tls
    assert resolve_config({}, endpoint="aggregator.example:50051").tls
    assert resolve_config({}, endpoint="10.0.0.1:50051").tls


def test_a_reporter_given_only_a_loopback_address_reaches_a_plaintext_aggregator(collector):
    reporter = Reporter(collector.endpoint, **{k: v for k, v in FAST.items() if k != "tls"})
    try:
        assert reporter.wait_for_specs(10)
    finally:
        reporter.shutdown(timeout=2)


@pytest.mark.parametrize(
    "explicit, environ, expected",
    [
        ({"endpoint": "agg.example.com:443"}, {}, ("grpc", "agg.example.com:443", True)),
        ({"endpoint": "127.0.0.1:50051"}, {}, ("grpc", "127.0.0.1:50051", False)),
        ({"endpoint": "https://agg.example.com/"}, {}, ("http", "https://agg.example.com", True)),
        ({"endpoint": "http://127.0.0.1:8080"}, {env.VEIL_TLS: "true"}, ("http", "http://127.0.0.1:8080", False)),
        ({"endpoint": "https://proxy.example.com/veil"}, {}, ("http", "https://proxy.example.com/veil", True)),
        # host:port over HTTP: the scheme TLS says (plaintext on loopback, as over gRPC)
        ({"endpoint": "agg.example.com:8080", "transport": "http"}, {}, ("http", "https://agg.example.com:8080", True)),
        ({"endpoint": "localhost:8080"}, {env.VEIL_TRANSPORT: "HTTP"}, ("http", "http://localhost:8080", False)),
        (
            {"endpoint": "localhost:8080", "transport": "grpc"},
            {env.VEIL_TRANSPORT: "http"},
            ("grpc", "localhost:8080", False),
        ),
        ({"endpoint": "localhost:8080"}, {env.VEIL_TRANSPORT: "carrier-pigeon"}, ("grpc", "localhost:8080", False)),
    ],
)
def test_the_transport_is_the_endpoints_unless_chosen(explicit, environ, expected):
    config = resolve_config(environ, **explicit)
    assert (config.transport, config.endpoint, config.tls) == expected


@pytest.mark.parametrize(
    "explicit",
    [
        {"endpoint": "https://agg.example.com", "transport": "grpc"},
        {"endpoint": "ftp://agg.example.com"},
        {"endpoint": "https://agg.example.com?x=1"},
        {"endpoint": "https://agg.example.com", "tls": False},
        {"endpoint": "http://agg.example.com", "tls": True},
        {"endpoint": "agg.example.com:1", "transport": "udp"},
    ],
)
def test_an_endpoint_and_transport_that_disagree_are_config_errors(explicit):
    with pytest.raises(ConfigError):
        resolve_config({}, **explicit)


def test_a_ca_file_needs_an_https_endpoint(tmp_path):
    (tmp_path / "ca.pem").write_text("not used")
    with pytest.raises(ConfigError, match="https://"):
        resolve_config({}, endpoint="http://127.0.0.1:1", ca_file=tmp_path / "ca.pem")
    with pytest.raises(ConfigError, match="not usable PEM"):
        Reporter("https://127.0.0.1:1", ca_file=tmp_path / "ca.pem")
