"""The config file: defaults, windows, and errors that name the key."""

from __future__ import annotations

import threading

import pytest

from veil.aggregator.config import (
    ENV_CONFIG,
    ENV_DATA_DIR,
    ENV_STORE_URL,
    Window,
    default_data_dir,
    load_config,
    parse_config,
    parse_duration,
)
from veil.aggregator.errors import ConfigError
from veil.client._config import is_loopback

METRIC = {"name": "browser", "labels": ["a", "b", "c"], "epsilon": 1.0}


def test_defaults_and_a_full_metric(monkeypatch):
    monkeypatch.delenv(ENV_STORE_URL, raising=False)
    monkeypatch.setenv(ENV_DATA_DIR, "/srv/veil-data")
    config = parse_config({"metrics": [METRIC]})
    assert config.store_url == "sqlite:///srv/veil-data/veil.db" and config.min_n == 100
    assert config.dedupe_ttl == 48 * 3600
    metric = config.metrics[0]
    assert metric.spec.mechanism.name == "subset" and [w.name for w in metric.windows] == ["total"]
    config = parse_config(
        {"metrics": [{**METRIC, "mechanism": "rappor", "windows": ["total", "1h", {"span": "1d", "retention": "30d"}]}]}
    )
    total, hour, day = config.metrics[0].windows
    assert (total.span, hour.span, hour.retention, day.span, day.retention) == (None, 3600, 7 * 3600, 86400, 30 * 86400)


def test_the_default_store_is_sqlite_in_the_data_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_STORE_URL, raising=False)
    monkeypatch.setenv(ENV_DATA_DIR, "/from/env")
    assert parse_config({"metrics": [METRIC]}, data_dir=tmp_path / "d").store_url == f"sqlite://{tmp_path}/d/veil.db"
    assert parse_config({"metrics": [METRIC]}).store_url == "sqlite:///from/env/veil.db"
    assert parse_config({"metrics": [METRIC], "store": {"url": "memory"}}, data_dir="/x").store_url == "memory"
    monkeypatch.delenv(ENV_DATA_DIR)
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/veil-unit:/var/lib/other")  # systemd's StateDirectory=
    assert default_data_dir().as_posix() == "/var/lib/veil-unit"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert default_data_dir().as_posix() == "/var/lib/veil"
    assert parse_config({"metrics": [METRIC]}).store_url == "sqlite:///var/lib/veil/veil.db"
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", "/home/u/data")
    assert default_data_dir().as_posix() == "/home/u/data/veil"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert default_data_dir().as_posix() == "/home/u/.local/share/veil"


def test_window_buckets_are_aligned():
    hour = Window("1h", 3600, 7200)
    assert hour.bucket(7300.5) == (7200, 10800) and hour.expiry(7300.5) == 10800 + 7200
    assert Window("total", None, None).bucket(123.0) == (0, 0) and Window("total", None, None).expiry(1.0) is None


@pytest.mark.parametrize(
    "data, key",
    [
        ({}, "metrics:"),
        ({"metrics": [{**METRIC, "epsilon": -1}]}, "metrics[0]: epsilon must be a number from 0.0001 to 20, not -1."),
        # Outside the range where the numerics hold (veil.mechanism._epsilon): refused, not served broken.
        (
            {"metrics": [{**METRIC, "mechanism": "rappor", "epsilon": 1e-9}]},
            "metrics[0]: epsilon must be a number from 0.0001 to 20, not 1e-09.",
        ),
        ({"metrics": [{**METRIC, "epsilon": 50}]}, "metrics[0]: epsilon must be a number from 0.0001 to 20, not 50."),
        (
            {"metrics": [{**METRIC, "epsilon": "1"}]},
            "metrics[0].epsilon: expected a number from 0.0001 to 20, got '1'.",
        ),
        ({"metrics": [{**METRIC, "mechanism": "oue"}]}, "metrics[0].mechanism:"),
        ({"metrics": [{**METRIC, "labels": ["a"]}]}, "metrics[0]: k must be"),
        ({"metrics": [{**METRIC, "labels": "abc"}]}, "metrics[0].labels:"),
        ({"metrics": [METRIC, METRIC]}, "metrics[1].name: 'browser' is declared twice"),
        ({"metrics": [{**METRIC, "windows": ["total", "2x"]}]}, "metrics[0].windows[1]:"),
        ({"metrics": [{**METRIC, "windows": ["1h", "1h"]}]}, "metrics[0].windows: a window is declared twice"),
        ({"metrics": [{**METRIC, "colour": "red"}]}, "metrics[0].colour: unknown key"),
        ({"metrics": [METRIC], "server": {"grpc": "nowhere"}}, "server.grpc:"),
        ({"metrics": [METRIC], "server": {"min_n": -1}}, "server.min_n:"),
        ({"metrics": [METRIC], "server": {"dedupe_ttl": "0h"}}, "server.dedupe_ttl:"),
        ({"metrics": [METRIC], "server": {"dedupe_ttl": "23h"}}, "server.dedupe_ttl: expected at least 24h, the SDK's"),
        (
            {"metrics": [METRIC], "server": {"dedupe_ttl": "48h", "max_lateness": "49h"}},
            "server.max_lateness: expected at most server.dedupe_ttl (172800 s)",
        ),
        ({"metrics": [METRIC], "server": {"workers": 0}}, "server.workers:"),
        ({"metrics": [METRIC], "server": {"port": 1}}, "server.port: unknown key"),
        ({"metrics": [METRIC], "store": {"url": ""}}, "store.url:"),
        (
            {"metrics": [METRIC], "store": {"url": "memory", "wait_replicas": 1}},
            "store.wait_replicas: not a setting of the 'memory' store",
        ),
        (
            {"metrics": [METRIC], "store": {"url": "sqlite:///x/veil.db", "shards": 2}},
            "store.shards: not a setting of the 'sqlite' store",
        ),
        (
            {"metrics": [METRIC], "store": {"url": "redis://h/0", "color": 1}},
            "store.color: not a setting of the 'redis' store (its settings: timeout, wait_replicas",
        ),
        ({"metrics": [METRIC], "store": {"url": "redis://h/0", "timeout": -1}}, "store.timeout:"),
        ({"metrics": [METRIC], "server": {"max_health_streams": 0}}, "server.max_health_streams:"),
        ({"metrics": [METRIC], "server": {"max_inflight_bytes": 0}}, "server.max_inflight_bytes:"),
        ({"metrics": [METRIC], "server": {"http_max_connections": 0}}, "server.http_max_connections:"),
        ({"metrics": [METRIC], "server": {"http_request_timeout": 0}}, "server.http_request_timeout:"),
        (
            {"metrics": [METRIC], "server": {"workers": 4, "max_streams": 4, "max_concurrent_rpcs": 9}},
            "server.max_concurrent_rpcs: expected at least server.workers + max_streams + "
            "max_health_streams (4 + 4 + 2)",
        ),
        (
            {"metrics": [METRIC], "auth": {"upload_rate_limit": -1}},
            "auth.upload_rate_limit: expected uploads per second",
        ),
        (
            {"metrics": [METRIC], "auth": {"upload_rate_limit": 10, "upload_rate_burst": 0.5}},
            "auth.upload_rate_burst: expected at least 1 upload",
        ),
        (
            {"metrics": [METRIC], "store": {"url": "redis://h/0", "shards": 3}},
            "store.shards: applies to a Redis Cluster",
        ),
        ({"metrics": [METRIC], "store": {"url": "redis+cluster://h:1,h:2", "shards": 0}}, "store.shards:"),
    ],
)
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).startswith(key), str(err.value)


def test_files_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "veil.toml"
    path.write_text(
        '[store]\nurl = "redis://example:6379/0"\n[[metrics]]\nname = "m"\nlabels = ["x", "y"]\nepsilon = 2\n'
    )
    monkeypatch.delenv(ENV_STORE_URL, raising=False)
    assert load_config(path).store_url == "redis://example:6379/0"
    monkeypatch.setenv(ENV_STORE_URL, "memory")
    assert load_config(path).store_url == "memory"
    assert load_config(path, store_url="redis://other/1").store_url == "redis://other/1"
    monkeypatch.setenv(ENV_CONFIG, str(path))
    assert load_config().metrics[0].spec.mechanism.epsilon == 2.0
    monkeypatch.delenv(ENV_CONFIG)
    with pytest.raises(ConfigError, match="pass --config or set VEIL_CONFIG"):
        load_config()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    path.write_text("[[metrics]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_durations():
    assert [parse_duration(x, "k") for x in ("90s", "15m", "1h", "2d", "1w", 30)] == [90, 900, 3600, 172800, 604800, 30]
    for bad in ("1y", "h", "", None, 0, -5, True):
        with pytest.raises(ConfigError, match="^k: expected a duration"):
            parse_duration(bad, "k")


def test_store_options_reach_the_redis_store(monkeypatch):
    monkeypatch.delenv(ENV_STORE_URL, raising=False)
    config = parse_config({"metrics": [METRIC], "store": {"url": "redis://h:1/0", "timeout": 0.5, "wait_replicas": 1}})
    assert config.store_options == {"socket_timeout": 0.5, "socket_connect_timeout": 0.5, "wait_replicas": 1}
    cluster = parse_config(
        {"metrics": [METRIC], "store": {"url": "rediss+cluster://h:1,h:2", "shards": 6, "wait_replicas": 1}}
    )
    assert cluster.store_options == {"shards": 6, "wait_replicas": 1}


@pytest.mark.parametrize(
    "address, local",
    [
        ("127.0.0.1:50051", True),
        ("[::1]:50051", True),
        ("localhost:8080", True),
        ("localhost", True),
        ("127.0.0.2", True),
        ("0.0.0.0:50051", False),
        (":50051", False),
        ("[::]:50051", False),
        ("10.0.0.7:50051", False),
        ("aggregator.example:443", False),
    ],
)
def test_loopback_addresses_are_told_from_reachable_ones(address, local):
    assert is_loopback(address) is local


def test_limits_and_their_defaults():
    config = parse_config({"metrics": [METRIC], "server": {"workers": 4}, "auth": {"upload_rate_limit": 50}})
    assert (config.max_streams, config.max_health_streams, config.max_concurrent_rpcs) == (2, 2, 32)
    assert config.max_inflight_bytes is None  # 64 MiB, or the largest upload (daemon.inflight_bytes)
    assert (config.http_max_connections, config.http_request_timeout) == (256, 10.0)
    auth = config.auth  # no tokens: an explicit limit applies to all uploads together
    assert (auth.anonymous_rate_limit, auth.anonymous_upload_rate_limit, auth.anonymous_upload_rate_burst) == (
        100_000,
        50,
        100,
    )


def test_the_inflight_budget_must_hold_one_upload():
    from veil.aggregator.daemon import inflight_bytes, max_message_bytes

    config = parse_config({"metrics": [METRIC]})
    assert inflight_bytes(config) == 64 << 20
    wide = parse_config(
        {"metrics": [{**METRIC, "labels": [str(i) for i in range(4096)]}], "server": {"max_batch": 20_000}}
    )
    assert inflight_bytes(wide) == max_message_bytes(wide) > 64 << 20
    with pytest.raises(ConfigError, match="server.max_inflight_bytes: expected at least the largest valid upload"):
        inflight_bytes(parse_config({"metrics": [METRIC], "server": {"max_inflight_bytes": 100}}))


def test_the_byte_budget():
    from veil.aggregator._budget import ByteBudget

    budget = ByteBudget(100)
    assert budget.reserve(60, 0) and not budget.reserve(60, 0.01) and budget.free == 40
    assert not budget.reserve(101, 10)  # more than the whole budget never waits
    waiter = []
    thread = threading.Thread(target=lambda: waiter.append(budget.reserve(60, 10)))
    thread.start()
    budget.release(60)  # wakes the waiter
    thread.join()
    assert waiter == [True] and budget.free == 40
    with pytest.raises(ValueError):
        ByteBudget(0)


def test_no_token_holds_more_than_its_share_of_the_byte_budget():
    from veil.aggregator._budget import ByteBudget, token_share

    assert (
        token_share(64 << 20, 1 << 20, 16) == 4 << 20
    )  # a quarter of 16 workers' reads, under a quarter of the budget
    assert token_share(64 << 20, 100, 16) == 400
    assert token_share(64 << 20, 4 << 20, 16) == 16 << 20  # a quarter of the budget
    assert token_share(64 << 20, 40 << 20, 16) == 40 << 20  # always one read
    budget = ByteBudget(100, share=25)
    assert budget.reserve(20, 0, "a") and not budget.reserve(10, 10, "a")  # over its share: refused at once
    assert budget.reserve(25, 0, "b") and budget.reserve(50, 0) and budget.free == 5  # no holder: no share
    budget.release(20, "a")
    assert budget.held("a") == 0 and budget.reserve(5, 0, "a") and budget.held("a") == 5


def test_a_config_naming_the_native_collector_says_what_replaced_it():
    with pytest.raises(ConfigError) as error:
        parse_config({"metrics": [METRIC], "server": {"native_grpc": "0.0.0.0:50052"}})
    message = str(error.value)
    assert message.startswith("server.native_grpc: the native collector was removed") and message.count(". ") == 0
    assert "server.grpc" in message and "server.http" in message and "pinned, patched sources" in message


def test_the_read_timeout():
    assert parse_config({"metrics": [METRIC]}).read_timeout == 10.0
    assert parse_config({"metrics": [METRIC], "server": {"read_timeout": 2.5}}).read_timeout == 2.5
    with pytest.raises(ConfigError, match="server.read_timeout"):
        parse_config({"metrics": [METRIC], "server": {"read_timeout": 0}})


def test_read_deadlines_fire_once_and_let_go_of_disarmed_calls():
    import weakref

    from veil.aggregator._calls import ReadDeadlines

    class Call:
        def __init__(self) -> None:
            self.cancelled = threading.Event()

        def cancel(self) -> None:
            self.cancelled.set()

    deadlines = ReadDeadlines(0.2)
    stalled, answered = Call(), Call()
    kept = weakref.ref(answered)
    armed, disarmed = deadlines.arm(stalled.cancel), deadlines.arm(answered.cancel)
    disarmed.disarm()
    del answered
    assert kept() is None  # a disarmed deadline holds nothing of its call (a flood of calls pins no memory)
    assert stalled.cancelled.wait(30) and armed.fired and not disarmed.fired
    deadlines.close()
