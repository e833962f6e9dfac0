"""The aggregator's configuration: a TOML file declaring the metrics, the store and the listeners.

    [server]
    grpc = "127.0.0.1:50051"      # gRPC listener (Collector, Estimates, health, reflection)
    http = "127.0.0.1:8080"       # HTTP listener (/v1/estimates, /metrics); "" turns it off
    min_n = 100                   # no estimate is shown below this many reports
    max_batch = 10000             # reports per upload, at most
    dedupe_ttl = "48h"            # how long a batch id is remembered (>= the SDK's retry horizon)
    watch_interval = 1.0          # seconds between Watch updates, at least
    grace_period = 10.0           # seconds in-flight uploads get on SIGTERM
    workers = 16                  # gRPC handler threads

    [store]
    url = "memory"                # or "memory:///path/snapshot.json", "redis://host:6379/0", "rediss://..."
    timeout = 2.0                 # Redis only: seconds to wait for an answer (and to connect)
    wait_replicas = 0             # Redis only: WAIT for this many replicas after every batch
    wait_timeout_ms = 1000        # Redis only: how long that WAIT may take

    [[metrics]]
    name = "browser"
    labels = ["chrome", "safari", "edge", "firefox", "other"]
    mechanism = "subset"          # subset (default), rappor, rappor-admissible, krr, warner
    epsilon = 1.0
    windows = ["total", "1h", { span = "1d", retention = "30d" }]

Every error names the key it is about. Precedence for the file and the store: an explicit
argument, then VEIL_CONFIG / VEIL_STORE_URL, then the defaults below.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from veil.mechanism import DEFAULT_MECHANISM, MECHANISMS, MechanismError, MetricSpec

from ._errors import ConfigError

__all__ = ["AggregatorConfig", "MetricConfig", "Window", "load_config", "parse_config", "parse_duration",
           "ENV_CONFIG", "ENV_STORE_URL"]

ENV_CONFIG = "VEIL_CONFIG"
ENV_STORE_URL = "VEIL_STORE_URL"

_DEFAULT_GRPC = "127.0.0.1:50051"
_DEFAULT_HTTP = "127.0.0.1:8080"
_DEFAULT_STORE_URL = "memory"
_DEFAULT_MIN_N = 100
_DEFAULT_MAX_BATCH = 10_000
_DEFAULT_DEDUPE_TTL = 48 * 3600
_DEFAULT_WATCH_INTERVAL = 1.0
_DEFAULT_GRACE_PERIOD = 10.0
_DEFAULT_WORKERS = 16
_DEFAULT_WINDOWS = ("total",)
_DEFAULT_RETENTION_BUCKETS = 7  # a time window keeps this many spans of history by default

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def parse_duration(text: object, key: str) -> int:
    """Seconds in a duration like "90s", "15m", "1h", "1d", "2w" (or a whole number of seconds)."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"{key}: expected a duration such as \"15m\", \"1h\" or \"1d\", got {text!r}.")
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Window:
    """A window of a metric: "total" (since the start) or a span cut into aligned buckets."""

    name: str
    span: int | None  # seconds; None for total
    retention: int | None  # seconds a bucket is kept after it ends; None for total

    def bucket(self, now: float) -> tuple[int, int]:
        """(start, end) of the bucket containing `now`; (0, 0) for total."""
        if self.span is None:
            return 0, 0
        start = int(now // self.span) * self.span
        return start, start + self.span

    def expiry(self, now: float) -> int | None:
        """When the store may drop the bucket containing `now`."""
        return None if self.span is None else self.bucket(now)[1] + self.retention


@dataclass(frozen=True)
class MetricConfig:
    spec: MetricSpec
    windows: tuple[Window, ...]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class AggregatorConfig:
    metrics: tuple[MetricConfig, ...]
    grpc_address: str = _DEFAULT_GRPC
    http_address: str = _DEFAULT_HTTP
    store_url: str = _DEFAULT_STORE_URL
    min_n: int = _DEFAULT_MIN_N
    max_batch: int = _DEFAULT_MAX_BATCH
    dedupe_ttl: int = _DEFAULT_DEDUPE_TTL
    watch_interval: float = _DEFAULT_WATCH_INTERVAL
    grace_period: float = _DEFAULT_GRACE_PERIOD
    workers: int = _DEFAULT_WORKERS
    store_options: Mapping[str, object] = field(default_factory=dict)  # keyword arguments of the store
    source: str = field(default="<config>", compare=False)

    def metric(self, name: str) -> MetricConfig | None:
        return next((m for m in self.metrics if m.name == name), None)


def load_config(path: str | os.PathLike[str] | None = None, *, store_url: str | None = None) -> AggregatorConfig:
    """Read and check a config file (argument, else $VEIL_CONFIG)."""
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise ConfigError(f"No config file: pass --config or set {ENV_CONFIG}.")
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror or err}).") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err}).") from None
    return parse_config(data, source=str(path), store_url=store_url)


def parse_config(data: Mapping[str, object], *, source: str = "<config>", store_url: str | None = None) -> AggregatorConfig:
    _only(data, {"server", "store", "metrics"}, "")
    server = _table(data, "server")
    store = _table(data, "store")
    _only(server, {"grpc", "http", "min_n", "max_batch", "dedupe_ttl", "watch_interval", "grace_period",
                   "workers"}, "server.")
    _only(store, {"url", "timeout", "wait_replicas", "wait_timeout_ms"}, "store.")
    raw_metrics = data.get("metrics")
    if not isinstance(raw_metrics, list) or not raw_metrics:
        raise ConfigError("metrics: declare at least one [[metrics]] table.")
    metrics = tuple(_metric(m, f"metrics[{i}]") for i, m in enumerate(raw_metrics))
    names = [m.name for m in metrics]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"metrics[{i}].name: {name!r} is declared twice.")
    url = store_url or os.environ.get(ENV_STORE_URL) or _text(store.get("url", _DEFAULT_STORE_URL), "store.url")
    return AggregatorConfig(
        metrics=metrics,
        grpc_address=_address(server.get("grpc", _DEFAULT_GRPC), "server.grpc", allow_empty=False),
        http_address=_address(server.get("http", _DEFAULT_HTTP), "server.http", allow_empty=True),
        store_url=url,
        store_options=_store_options(store, url),
        min_n=_whole(server.get("min_n", _DEFAULT_MIN_N), "server.min_n", low=0),
        max_batch=_whole(server.get("max_batch", _DEFAULT_MAX_BATCH), "server.max_batch", low=1),
        dedupe_ttl=parse_duration(server.get("dedupe_ttl", _DEFAULT_DEDUPE_TTL), "server.dedupe_ttl"),
        watch_interval=_seconds(server.get("watch_interval", _DEFAULT_WATCH_INTERVAL), "server.watch_interval"),
        grace_period=_seconds(server.get("grace_period", _DEFAULT_GRACE_PERIOD), "server.grace_period"),
        workers=_whole(server.get("workers", _DEFAULT_WORKERS), "server.workers", low=1),
        source=source,
    )


def _store_options(store: Mapping[str, object], url: str) -> dict[str, object]:
    options: dict[str, object] = {}
    if "timeout" in store:
        seconds = _seconds(store["timeout"], "store.timeout")
        options.update(socket_timeout=seconds, socket_connect_timeout=seconds)
    if "wait_replicas" in store:
        options["wait_replicas"] = _whole(store["wait_replicas"], "store.wait_replicas", low=0)
    if "wait_timeout_ms" in store:
        options["wait_timeout_ms"] = _whole(store["wait_timeout_ms"], "store.wait_timeout_ms", low=1)
    if options and not url.startswith(("redis://", "rediss://", "unix://")):
        name = next(k for k in ("timeout", "wait_replicas", "wait_timeout_ms") if k in store)
        raise ConfigError(f"store.{name}: applies to Redis stores only, and the store is {url.split(':')[0]!r}.")
    return options


def _metric(raw: object, key: str) -> MetricConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: expected a table with name, labels, mechanism, epsilon and windows.")
    _only(raw, {"name", "labels", "mechanism", "epsilon", "windows"}, f"{key}.")
    name = _text(raw.get("name"), f"{key}.name")
    labels = raw.get("labels")
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise ConfigError(f"{key}.labels: expected a list of category labels (strings).")
    mechanism = raw.get("mechanism", DEFAULT_MECHANISM)
    if mechanism not in MECHANISMS:
        raise ConfigError(f"{key}.mechanism: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}.")
    epsilon = raw.get("epsilon")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ConfigError(f"{key}.epsilon: expected a number above 0, got {epsilon!r}.")
    try:
        spec = MetricSpec.create(name, labels, mechanism, float(epsilon))
    except MechanismError as err:
        raise ConfigError(f"{key}: {err}") from None
    raw_windows = raw.get("windows", list(_DEFAULT_WINDOWS))
    if not isinstance(raw_windows, list) or not raw_windows:
        raise ConfigError(f"{key}.windows: expected a list such as [\"total\", \"1h\", \"1d\"].")
    windows = tuple(_window(w, f"{key}.windows[{i}]") for i, w in enumerate(raw_windows))
    if len({w.name for w in windows}) != len(windows):
        raise ConfigError(f"{key}.windows: a window is declared twice.")
    return MetricConfig(spec, windows)


def _window(raw: object, key: str) -> Window:
    if raw == "total":
        return Window("total", None, None)
    if isinstance(raw, Mapping):
        _only(raw, {"span", "retention"}, f"{key}.")
        span = parse_duration(raw.get("span"), f"{key}.span")
        retention = parse_duration(raw.get("retention", span * _DEFAULT_RETENTION_BUCKETS), f"{key}.retention")
        return Window(str(raw.get("span")).strip(), span, retention)
    span = parse_duration(raw, key)
    return Window(str(raw).strip(), span, span * _DEFAULT_RETENTION_BUCKETS)


def _table(data: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table ([{key}]).")
    return value


def _only(table: Mapping[str, object], allowed: set[str], prefix: str) -> None:
    for name in table:
        if name not in allowed:
            raise ConfigError(f"{prefix}{name}: unknown key; expected one of {', '.join(sorted(allowed))}.")


def _text(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}.")
    return value.strip()


def _address(value: object, key: str, *, allow_empty: bool) -> str:
    if allow_empty and value == "":
        return ""
    text = _text(value, key)
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected host:port (e.g. \"127.0.0.1:50051\"), got {value!r}.")
    return text


def _whole(value: object, key: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key}: expected a whole number of at least {low}, got {value!r}.")
    return value


def _seconds(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{key}: expected a number of seconds (at least 0), got {value!r}.")
    return float(value)
