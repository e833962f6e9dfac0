"""The aggregator's configuration: a TOML file declaring the metrics, the store and the listeners.

    [server]
    grpc = "127.0.0.1:50051"      # gRPC listener (Collector, Estimates, health, reflection)
    http = "127.0.0.1:8080"       # HTTP listener (/v1/estimates, /metrics); "" turns it off
    min_n = 100                   # no estimate is shown below this many reports
    max_batch = 10000             # reports per upload, at most
    dedupe_ttl = "48h"            # how long a batch id is remembered (>= the SDK's retry horizon)
    max_lateness = "25h"          # reports made longer ago (after their time slot ended) are refused as too late
    watch_interval = 1.0          # seconds between Watch updates, at least
    grace_period = 10.0           # seconds in-flight uploads get on SIGTERM
    workers = 16                  # gRPC handler threads
    max_concurrent_rpcs = 128     # gRPC calls in progress or queued, at most (default workers * 8)
    max_streams = 8               # Estimates/Watch streams at once, at most (default workers / 2; threads of their own)
    max_health_streams = 2        # tokenless health Watch and reflection streams at once (threads of their own)
    max_inflight_bytes = 67108864 # upload bytes read at once (each reserves the largest upload's size); default 64 MiB
    http_max_connections = 256    # HTTP connections at once; more are closed on accept
    http_request_timeout = 10.0   # seconds a connection has for each request, body included (and to read its answer)
    read_timeout = 10.0           # seconds an admitted gRPC call has to deliver its message
    cors_origins = []             # browser apps' origins that may fetch specs and upload over HTTP (CORS)
    processes = 1                 # worker processes sharing the gRPC port (SO_REUSEPORT); > 1 needs Redis
    metrics_top = 50              # /metrics: categories per metric and window (the largest; the rest as one)

    [store]
    url = "sqlite:///var/lib/veil/veil.db"   # default: veil.db in the data directory (below); or "memory"
                                  # (volatile), "redis://host:6379/0", "rediss://..."
    timeout = 2.0                 # Redis only: seconds to wait for an answer (and to connect)
    wait_replicas = 0             # Redis only: WAIT for this many replicas after every batch
    wait_timeout_ms = 1000        # Redis only: how long that WAIT may take
    shards = 3                    # Redis Cluster only: shards per metric (default one per master; recorded)

    [[metrics]]
    name = "browser"
    labels = ["chrome", "safari", "edge", "firefox", "other"]
    mechanism = "subset"          # subset (default), rappor, rappor-admissible, krr, warner
    epsilon = 1.0
    period = "1d"                 # the reporting period: a device sends at most reports_per_period per period
    reports_per_period = 1
    period_budget = 1.0           # epsilon a device may spend per period (default reports_per_period * epsilon)
    lifetime_budget = 30.0        # epsilon a device may spend in its lifetime (default: no cap)
    windows = ["total", "1h", { span = "1d", retention = "30d" }]

    [[metrics]]                   # a numeric metric: apps report numbers (docs/estimates.md)
    name = "load_ms"
    type = "numeric"              # "categories" (the default) or "numeric"
    range = [0, 10000]            # values outside are clipped to it (and counted on the device)
    buckets = [100, 250, 500, 1000, 2500]  # the distribution's bucket boundaries (for quantiles)
    estimate = ["mean", "distribution"]    # default: the mean, and the distribution when buckets are given
    mean_share = 0.5              # with both: the mean's share of epsilon (and of the budgets)
    epsilon = 2.0                 # per report, both parts together; period, budgets, windows as above

    [[metrics]]                   # a strings metric: apps report any string; frequent ones are found
    name = "crash_signature"      # (docs/protocol.md section 10, docs/estimates.md)
    type = "strings"
    epsilon = 4.0                 # per report; a device answers one round per period
    period = "1d"                 # rounds move on each period; the first values after 7 periods
    survivors = 32                # prefixes kept per round (default 32): what can be found at most

    [tls]                         # TLS on both listeners (gRPC and HTTP); absent: plaintext
    cert_file = "/etc/veil/tls/server.crt"      # the certificate chain, PEM
    key_file = "/etc/veil/tls/server.key"       # its private key, PEM, owner-only
    client_ca_file = "/etc/veil/tls/clients.crt"  # optional: require client certificates from this CA (mTLS)

    [auth]                        # no tokens at all: authentication is off (the demo; not production)
    tokens_file = "/etc/veil/tokens.toml"       # owner-only; holds [[upload_tokens]] and [[read_tokens]]
    rate_limit = 100000           # reports per second per upload token (0: unlimited)
    rate_burst = 200000           # reports at once per upload token (default 2 s worth, >= max_batch)
    upload_rate_limit = 1000      # uploads per second per upload token (0: unlimited)
    upload_rate_burst = 2000      # uploads at once per upload token (default 2 s worth)

    [[auth.upload_tokens]]        # an app's token: it may upload these metrics (and fetch their specs)
    name = "app-a"
    token = "..."                 # at least 16 printable ASCII characters without spaces
    metrics = ["browser"]
    rate_limit = 5000             # optional: this token's own limits (and rate_burst, upload_rate_limit, ...)

    [[auth.read_tokens]]          # estimates (gRPC Estimates, HTTP /v1/estimates and /metrics), specs
    name = "dashboard"
    token = "..."

Relative file paths are relative to the config file's directory. Every error names the key it
is about, never a token's value; tokens are kept only as SHA-256 digests. Precedence for the
file and the store: an explicit argument, then VEIL_CONFIG / VEIL_STORE_URL, then the defaults
below. With no store URL at all the counts go to SQLite, veil.db in the data directory: the
`data_dir` argument (`--data-dir`), else VEIL_DATA_DIR, else default_data_dir().
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from veil.mechanism import (
    DEFAULT_MEAN_SHARE,
    DEFAULT_MECHANISM,
    DEFAULT_SURVIVORS,
    DISTRIBUTION,
    EPSILON_RANGE,
    MAX_PERIOD,
    MEAN,
    MECHANISMS,
    ROUNDS,
    MechanismError,
    MetricSpec,
    NumericSpec,
    StringsRound,
    buckets_for,
    check_epsilon,
    epsilon_to_gamma,
    numeric_parts,
    round_name,
)
from veil.mechanism import parse_duration as mechanism_duration

from ._secrets import check_private_file
from ._tls import TlsConfig, load_tls
from .errors import ConfigError, StoreMisconfigured
from .store import store_options

__all__ = [
    "AggregatorConfig",
    "AuthConfig",
    "MetricConfig",
    "TlsConfig",
    "TokenConfig",
    "Window",
    "load_config",
    "parse_config",
    "parse_duration",
    "token_digest",
    "ENV_CONFIG",
    "ENV_STORE_URL",
    "ENV_DATA_DIR",
    "PLACEHOLDER_PASSWORD",
    "default_data_dir",
    "default_store_url",
]

ENV_CONFIG = "VEIL_CONFIG"
ENV_STORE_URL = "VEIL_STORE_URL"
ENV_DATA_DIR = "VEIL_DATA_DIR"
# The Redis password in deploy/kubernetes*/secret.env.example and deploy/systemd/veil.env.example:
# a store URL still carrying it is an example deployed unedited, so the aggregator will not start.
PLACEHOLDER_PASSWORD = "change-me"

_DEFAULT_GRPC = "127.0.0.1:50051"
_DEFAULT_HTTP = "127.0.0.1:8080"
_DEFAULT_STORE_URL = "memory"  # of an AggregatorConfig built in code; a config file's default is SQLite
_DEFAULT_MIN_N = 100
_DEFAULT_METRICS_TOP = 50
_DEFAULT_MAX_BATCH = 10_000
_DEFAULT_DEDUPE_TTL = 48 * 3600
# The SDKs retry a batch for 24 h (RETRY_HORIZON_SECONDS) after it was made; an hour more for the
# time a report waits in its slot and on the device before its batch is made.
_DEFAULT_MAX_LATENESS = 25 * 3600
_DEFAULT_WATCH_INTERVAL = 1.0
_DEFAULT_GRACE_PERIOD = 10.0
_DEFAULT_WORKERS = 16
_DEFAULT_RATE_LIMIT = 100_000  # reports per second per upload token
_DEFAULT_UPLOAD_RATE_LIMIT = 1_000  # uploads per second per upload token: each leaves a batch id for dedupe_ttl
_DEFAULT_HEALTH_STREAMS = 2
_DEFAULT_HTTP_CONNECTIONS = 256
_DEFAULT_HTTP_REQUEST_TIMEOUT = 10.0
_DEFAULT_READ_TIMEOUT = 10.0
_BURST_SECONDS = 2.0  # the default burst: this many seconds of the rate
_MIN_TOKEN_LENGTH = 16
_MAX_TOKEN_LENGTH = 4096
_DEFAULT_WINDOWS = ("total",)
_DEFAULT_RETENTION_BUCKETS = 7  # a time window keeps this many spans of history by default


def parse_duration(text: object, key: str) -> int:
    """Seconds in a duration like "90s", "15m", "1h", "1d", "2w" (or a whole number of seconds)."""
    try:
        return mechanism_duration(text)
    except MechanismError as err:
        raise ConfigError(f"{key}: {err}") from None


def _dedupe_ttl(text: object) -> int:
    """Batch ids must be remembered as long as a device may resend a batch, or a late retry
    counts twice."""
    from veil.client import RETRY_HORIZON_SECONDS  # here: the SDK loads gRPC, which not every caller needs

    seconds = parse_duration(text, "server.dedupe_ttl")
    if seconds < RETRY_HORIZON_SECONDS:
        raise ConfigError(
            f"server.dedupe_ttl: expected at least {RETRY_HORIZON_SECONDS // 3600}h, the SDK's retry "
            f"horizon (a batch retried after its id is forgotten counts twice), got {text!r}."
        )
    return seconds


def _max_lateness(text: object, dedupe_ttl: int) -> int:
    """Reports made up to this long before now (after their slot ended) still count; a device's
    batch kept longer than this by its retries is refused as too late, so the SDKs' retry horizon
    is the sensible least. No more than dedupe_ttl: a batch first counted as soon as it was made
    and retried until it is too late would otherwise come back after its id is forgotten."""
    seconds = parse_duration(text, "server.max_lateness")
    if seconds > dedupe_ttl:
        raise ConfigError(
            f"server.max_lateness: expected at most server.dedupe_ttl ({dedupe_ttl} s), or a batch retried "
            f"after its id is forgotten could count twice; got {text!r}."
        )
    return seconds


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
        return None if self.span is None or self.retention is None else self.bucket(now)[1] + self.retention


@dataclass(frozen=True)
class MetricConfig:
    spec: MetricSpec
    windows: tuple[Window, ...]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class StringsConfig:
    """A strings metric (docs/protocol.md 10): its rounds' specs follow from the counts, period by
    period (veil.aggregator.rounds); this is what the config fixes of them."""

    name: str
    epsilon: float
    period: int
    period_budget: float | None = None
    lifetime_budget: float | None = None
    survivors: int = DEFAULT_SURVIVORS

    @property
    def buckets(self) -> int:
        return buckets_for(epsilon_to_gamma(self.epsilon))

    @property
    def window(self) -> Window:
        """The one window of its rounds: the period, kept while a round of a later period
        may still need it (ROUNDS periods) and a week of periods beyond for the estimates."""
        return Window(STRINGS_WINDOW, self.period, (ROUNDS + _DEFAULT_RETENTION_BUCKETS) * self.period)

    @property
    def round_names(self) -> tuple[str, ...]:
        return tuple(round_name(self.name, r) for r in range(ROUNDS))

    def round_config(self, strings: StringsRound) -> MetricConfig:
        """The metric of one of its rounds, as ingest and the estimates see it."""
        spec = MetricSpec.strings_round(
            strings,
            self.epsilon,
            period=self.period,
            period_budget=self.period_budget,
            lifetime_budget=self.lifetime_budget,
        )
        return MetricConfig(spec, (self.window,))


STRINGS_WINDOW = "period"


@dataclass(frozen=True)
class TokenConfig:
    """One token: its name (safe to log), role, the SHA-256 digest of its value (never the
    value), and for an upload token the metrics it may report and its rate limit."""

    name: str
    role: str  # "upload" or "read"
    digest: bytes = field(repr=False, compare=False)
    metrics: frozenset[str] = frozenset()  # upload tokens: the metrics it may report
    rate_limit: float = 0.0  # reports per second; 0: unlimited
    rate_burst: float = 0.0  # reports at once
    upload_rate_limit: float = 0.0  # uploads per second; 0: unlimited
    upload_rate_burst: float = 0.0  # uploads at once


@dataclass(frozen=True)
class AuthConfig:
    tokens: tuple[TokenConfig, ...] = ()
    tokens_file: Path | None = None
    # With no tokens (authentication off) an explicit [auth] rate_limit still applies, to all
    # uploads together; 0 means none.
    anonymous_rate_limit: float = 0.0
    anonymous_rate_burst: float = 0.0
    anonymous_upload_rate_limit: float = 0.0
    anonymous_upload_rate_burst: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def of_role(self, role: str) -> tuple[TokenConfig, ...]:
        return tuple(t for t in self.tokens if t.role == role)


@dataclass(frozen=True)
class AggregatorConfig:
    metrics: tuple[MetricConfig, ...]
    strings: tuple[StringsConfig, ...] = ()  # strings metrics: their rounds are not in `metrics`
    grpc_address: str = _DEFAULT_GRPC
    http_address: str = _DEFAULT_HTTP
    store_url: str = _DEFAULT_STORE_URL
    min_n: int = _DEFAULT_MIN_N
    max_batch: int = _DEFAULT_MAX_BATCH
    dedupe_ttl: int = _DEFAULT_DEDUPE_TTL
    # Seconds after its time slot ends that a report is still counted; a bucket is provisional
    # until this long after it ends.
    max_lateness: int = _DEFAULT_MAX_LATENESS
    watch_interval: float = _DEFAULT_WATCH_INTERVAL
    grace_period: float = _DEFAULT_GRACE_PERIOD
    workers: int = _DEFAULT_WORKERS
    max_concurrent_rpcs: int = _DEFAULT_WORKERS * 8
    max_streams: int = _DEFAULT_WORKERS // 2
    max_health_streams: int = _DEFAULT_HEALTH_STREAMS
    max_inflight_bytes: int | None = None  # None: 64 MiB, or the largest valid upload (daemon.inflight_bytes)
    http_max_connections: int = _DEFAULT_HTTP_CONNECTIONS
    http_request_timeout: float = _DEFAULT_HTTP_REQUEST_TIMEOUT
    read_timeout: float = _DEFAULT_READ_TIMEOUT
    cors_origins: tuple[str, ...] = ()
    processes: int = 1  # worker processes sharing the gRPC port; workers, limits and streams are per process
    metrics_top: int = _DEFAULT_METRICS_TOP  # categories per metric and window exported to /metrics
    tls: TlsConfig | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    store_options: Mapping[str, object] = field(default_factory=dict)  # keyword arguments of the store
    source: str = field(default="<config>", compare=False)

    def metric(self, name: str) -> MetricConfig | None:
        return next((m for m in self.metrics if m.name == name), None)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    store_url: str | None = None,
    processes: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> AggregatorConfig:
    """Read and check a config file (argument, else $VEIL_CONFIG); `processes` overrides
    server.processes (`veil serve --processes`); `data_dir` is where the default store goes."""
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise ConfigError(f"No config file: pass --config or set {ENV_CONFIG}.")
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror or err}).") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text, which a TOML file must be.") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err}).") from None
    auth = data.get("auth")
    if isinstance(auth, Mapping) and ("upload_tokens" in auth or "read_tokens" in auth):
        # Tokens inline make the config file a secrets file, held to the same rule.
        check_private_file(Path(path), "auth (tokens inline)")
    return parse_config(
        data, source=str(path), store_url=store_url, base=Path(path).parent, processes=processes, data_dir=data_dir
    )


def default_data_dir() -> Path:
    """Where the default SQLite store lives: $STATE_DIRECTORY when systemd gives the service one
    (StateDirectory=, e.g. /var/lib/veil); else /var/lib/veil for root (a system service's state,
    as the FHS has it); else $XDG_DATA_HOME/veil, by default ~/.local/share/veil (the XDG base
    directories: a user's own data, kept across reboots)."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/veil")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "veil"


def _refuse_placeholder_password(url: str) -> None:
    """ConfigError when the store's password is the one deploy/'s example secrets hold until edited."""
    try:
        password = urlsplit(url).password
    except ValueError:  # not a URL the stores take: they say why
        return
    if password == PLACEHOLDER_PASSWORD:
        raise ConfigError(
            f"store url: the password is {PLACEHOLDER_PASSWORD!r}, the placeholder of deploy/'s example secrets; "
            "set one of your own (e.g. `openssl rand -hex 32`) in Redis and in the URL (secret.env or veil.env)."
        )


def default_store_url(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The store of a config without a store URL: SQLite, veil.db in the data directory (data_dir,
    else $VEIL_DATA_DIR, else default_data_dir())."""
    directory = Path(data_dir or os.environ.get(ENV_DATA_DIR) or default_data_dir()).expanduser().absolute()
    return "sqlite://" + (directory / "veil.db").as_posix()


def parse_config(
    data: Mapping[str, object],
    *,
    source: str = "<config>",
    store_url: str | None = None,
    base: str | os.PathLike[str] | None = None,
    processes: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> AggregatorConfig:
    """Check a parsed config; relative file paths are taken relative to `base` (default: the
    working directory)."""
    _only(data, {"server", "store", "metrics", "tls", "auth"}, "")
    server = _table(data, "server")
    store = _table(data, "store")
    if "native_grpc" in server:
        raise ConfigError(
            "server.native_grpc: the native collector was removed (its gRPC core lacked the HTTP/2 Rapid "
            "Reset fix); devices reach the Collector on server.grpc and over HTTP on server.http, and a "
            "compiled transport may return only as a package built from pinned, patched sources."
        )
    _only(
        server,
        {
            "grpc",
            "http",
            "min_n",
            "max_batch",
            "dedupe_ttl",
            "max_lateness",
            "watch_interval",
            "grace_period",
            "workers",
            "max_concurrent_rpcs",
            "max_streams",
            "max_health_streams",
            "max_inflight_bytes",
            "http_max_connections",
            "http_request_timeout",
            "read_timeout",
            "processes",
            "cors_origins",
            "metrics_top",
        },
        "server.",
    )
    raw_metrics = data.get("metrics")
    if not isinstance(raw_metrics, list) or not raw_metrics:
        raise ConfigError("metrics: declare at least one [[metrics]] table.")
    declared: dict[str, tuple[str, ...]] = {}  # a name tokens may list -> the wire metrics it covers
    metrics_list: list[MetricConfig] = []
    strings_list: list[StringsConfig] = []
    for i, entry in enumerate(raw_metrics):
        if isinstance(entry, Mapping) and entry.get("type") == STRINGS:
            found = _strings(entry, f"metrics[{i}]")
            for name in (found.name, *found.round_names):
                if name in declared:
                    raise ConfigError(f"metrics[{i}].name: {name!r} is declared twice.")
            declared[found.name] = found.round_names
            for name in found.round_names:
                declared[name] = (name,)
            strings_list.append(found)
            continue
        parts = _metric(entry, f"metrics[{i}]")
        names = {m.name for m in parts} | {m.spec.numeric.metric for m in parts if m.spec.numeric is not None}
        for name in sorted(names):
            if name in declared or any(name in s.round_names for s in strings_list):
                raise ConfigError(f"metrics[{i}].name: {name!r} is declared twice.")
            declared[name] = tuple(m.name for m in parts) if name not in {m.name for m in parts} else (name,)
        metrics_list += parts
    metrics = tuple(metrics_list)
    url = (
        store_url
        or os.environ.get(ENV_STORE_URL)
        or (_text(store["url"], "store.url") if "url" in store else default_store_url(data_dir))
    )
    _refuse_placeholder_password(url)
    base_dir = Path(base) if base is not None else Path.cwd()
    workers = _whole(server.get("workers", _DEFAULT_WORKERS), "server.workers", low=1)
    max_batch = _whole(server.get("max_batch", _DEFAULT_MAX_BATCH), "server.max_batch", low=1)
    dedupe_ttl = _dedupe_ttl(server.get("dedupe_ttl", _DEFAULT_DEDUPE_TTL))
    grpc_address = _address(server.get("grpc", _DEFAULT_GRPC), "server.grpc", allow_empty=False)
    processes = _processes(server.get("processes", 1) if processes is None else processes, url, grpc_address)
    max_streams = _whole(server.get("max_streams", max(1, workers // 2)), "server.max_streams", low=1)
    max_health_streams = _whole(
        server.get("max_health_streams", _DEFAULT_HEALTH_STREAMS), "server.max_health_streams", low=1
    )
    max_concurrent_rpcs = _whole(server.get("max_concurrent_rpcs", workers * 8), "server.max_concurrent_rpcs", low=1)
    if max_concurrent_rpcs < workers + max_streams + max_health_streams:
        # Open streams count as calls in progress: with fewer slots, streams alone could fill
        # them and every upload would be refused.
        raise ConfigError(
            f"server.max_concurrent_rpcs: expected at least server.workers + max_streams + "
            f"max_health_streams ({workers} + {max_streams} + {max_health_streams}), so that streams "
            f"can never take every slot from uploads; got {max_concurrent_rpcs}."
        )
    return AggregatorConfig(
        metrics=metrics,
        strings=tuple(strings_list),
        grpc_address=grpc_address,
        http_address=_address(server.get("http", _DEFAULT_HTTP), "server.http", allow_empty=True),
        store_url=url,
        store_options=_store_options(store, url),
        min_n=_whole(server.get("min_n", _DEFAULT_MIN_N), "server.min_n", low=0),
        metrics_top=_whole(server.get("metrics_top", _DEFAULT_METRICS_TOP), "server.metrics_top", low=0),
        max_batch=max_batch,
        dedupe_ttl=dedupe_ttl,
        max_lateness=_max_lateness(server.get("max_lateness", _DEFAULT_MAX_LATENESS), dedupe_ttl),
        watch_interval=_seconds(server.get("watch_interval", _DEFAULT_WATCH_INTERVAL), "server.watch_interval"),
        grace_period=_seconds(server.get("grace_period", _DEFAULT_GRACE_PERIOD), "server.grace_period"),
        workers=workers,
        max_concurrent_rpcs=max_concurrent_rpcs,
        max_streams=max_streams,
        max_health_streams=max_health_streams,
        max_inflight_bytes=(
            _whole(server["max_inflight_bytes"], "server.max_inflight_bytes", low=1)
            if "max_inflight_bytes" in server
            else None
        ),
        http_max_connections=_whole(
            server.get("http_max_connections", _DEFAULT_HTTP_CONNECTIONS), "server.http_max_connections", low=1
        ),
        http_request_timeout=_seconds(
            server.get("http_request_timeout", _DEFAULT_HTTP_REQUEST_TIMEOUT),
            "server.http_request_timeout",
            above_zero=True,
        ),
        read_timeout=_seconds(
            server.get("read_timeout", _DEFAULT_READ_TIMEOUT), "server.read_timeout", above_zero=True
        ),
        cors_origins=_origins(server.get("cors_origins", [])),
        processes=processes,
        tls=_tls(data, base_dir),
        auth=_auth(data, base_dir, declared, max_batch),
        source=source,
    )


def _shared_port(address: str, key: str, processes: int) -> None:
    """The workers of server.processes > 1 share a listener's port (SO_REUSEPORT): port 0 would
    give each a port of its own."""
    if processes > 1 and address.rpartition(":")[2] == "0":
        raise ConfigError(
            f"{key}: port 0 gives each of the server.processes = {processes} workers a port "
            f"of its own; give a fixed port."
        )


def _processes(value: object, url: str, grpc_address: str) -> int:
    processes = _whole(value, "server.processes", low=1)
    if processes == 1:
        return 1
    if url == "memory" or url.startswith("memory:"):
        # Each process would count into its own memory: estimates would see a share of the reports.
        raise ConfigError(
            f"store.url: the memory store lives inside one process, so server.processes = "
            f"{processes} needs a shared store (redis://...); use server.processes = 1."
        )
    if url.startswith("sqlite:"):
        # One process writes a SQLite store (its file lock); the others could not count.
        raise ConfigError(
            f"store.url: a SQLite store is written by one process, so server.processes = "
            f"{processes} needs a shared store (redis://...); use server.processes = 1."
        )
    _shared_port(grpc_address, "server.grpc", processes)
    return processes


def token_digest(token: str) -> bytes:
    """What is kept of a token: its SHA-256 digest (compared in constant time, never logged)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def _path(value: object, key: str, base: Path) -> Path:
    path = Path(_text(value, key)).expanduser()
    return path if path.is_absolute() else base / path


def _tls(data: Mapping[str, object], base: Path) -> TlsConfig | None:
    if "tls" not in data:
        return None
    tls = _table(data, "tls")
    _only(tls, {"cert_file", "key_file", "client_ca_file"}, "tls.")
    for name in ("cert_file", "key_file"):
        if name not in tls:
            raise ConfigError(f"tls.{name}: required with [tls] (the server's certificate chain and its key, PEM).")
    config = TlsConfig(
        cert_file=_path(tls["cert_file"], "tls.cert_file", base),
        key_file=_path(tls["key_file"], "tls.key_file", base),
        client_ca_file=_path(tls["client_ca_file"], "tls.client_ca_file", base) if "client_ca_file" in tls else None,
    )
    check_private_file(config.key_file, "tls.key_file")
    load_tls(config)  # checks that the files hold what they should, naming the key
    return config


def _auth(
    data: Mapping[str, object], base: Path, declared: Mapping[str, tuple[str, ...]], max_batch: int
) -> AuthConfig:
    auth = _table(data, "auth")
    _only(auth, {"tokens_file", *_LIMIT_KEYS, "upload_tokens", "read_tokens"}, "auth.")
    limits = _limits(auth, "auth.", _DEFAULT_LIMITS, max_batch)
    tokens = list(_tokens(auth, "auth.", declared, limits, max_batch))
    tokens_file = None
    if "tokens_file" in auth:
        tokens_file = _path(auth["tokens_file"], "auth.tokens_file", base)
        check_private_file(tokens_file, "auth.tokens_file")
        try:
            secrets = tomllib.loads(tokens_file.read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"auth.tokens_file: cannot read {tokens_file} ({err.strerror or err}).") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            # The parser's message may quote the file; the file holds secrets.
            raise ConfigError(f"auth.tokens_file: {tokens_file} is not valid TOML.") from None
        _only(secrets, {"upload_tokens", "read_tokens"}, f"{tokens_file}: ")
        tokens += _tokens(secrets, f"{tokens_file}: ", declared, limits, max_batch)
    names: dict[str, str] = {}
    digests: set[bytes] = set()
    for token, key in tokens:
        if token.name in names:
            raise ConfigError(f"{key}.name: {token.name!r} is also the name of {names[token.name]}.")
        if token.digest in digests:
            raise ConfigError(f"{key}.token: the same token value is given twice; each token needs its own.")
        names[token.name] = key
        digests.add(token.digest)
    # With authentication off, an explicit limit applies to all uploads together (anonymous).
    anonymous = limits if any(key in auth for key in _LIMIT_KEYS) else (0.0, 0.0, 0.0, 0.0)
    return AuthConfig(
        tokens=tuple(t for t, _ in tokens),
        tokens_file=tokens_file,
        anonymous_rate_limit=anonymous[0],
        anonymous_rate_burst=anonymous[1],
        anonymous_upload_rate_limit=anonymous[2],
        anonymous_upload_rate_burst=anonymous[3],
    )


_LIMIT_KEYS = ("rate_limit", "rate_burst", "upload_rate_limit", "upload_rate_burst")
_DEFAULT_LIMITS = (float(_DEFAULT_RATE_LIMIT), None, float(_DEFAULT_UPLOAD_RATE_LIMIT), None)


def _limits(table: Mapping[str, object], prefix: str, inherited: tuple, max_batch: int) -> tuple[float, ...]:
    """(reports per second, report burst, uploads per second, upload burst) of a table, falling
    back to the inherited ones; a burst not given is 2 s of its rate (reports: at least max_batch)."""
    reports = _rate(table, prefix, "", "reports", inherited[:2], max_batch)
    uploads = _rate(table, prefix, "upload_", "uploads", inherited[2:], 1)
    return (*reports, *uploads)


def _rate(
    table: Mapping[str, object], prefix: str, kind: str, unit: str, inherited: tuple, least_burst: int
) -> tuple[float, float]:
    """(rate, burst) of `kind`rate_limit and `kind`rate_burst in a table, or the inherited ones."""
    rate, burst = inherited
    if f"{kind}rate_limit" in table:
        value = table[f"{kind}rate_limit"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{prefix}{kind}rate_limit: expected {unit} per second (a number, 0 for no limit), got {value!r}."
            )
        rate, burst = float(value), None  # a new rate has its own default burst
    if f"{kind}rate_burst" in table:
        value = table[f"{kind}rate_burst"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{prefix}{kind}rate_burst: expected a number of {unit}, got {value!r}.")
        if rate and value < least_burst:
            need = (
                f"server.max_batch ({least_burst}) reports, or a full batch"
                if unit == "reports"
                else f"{least_burst} upload, or no upload"
            )
            raise ConfigError(f"{prefix}{kind}rate_burst: expected at least {need} could never pass; got {value!r}.")
        burst = float(value)
    if burst is None:
        burst = max(rate * _BURST_SECONDS, float(least_burst)) if rate else 0.0
    return rate, burst


def _tokens(
    table: Mapping[str, object],
    prefix: str,
    declared: Mapping[str, tuple[str, ...]],
    limits: tuple[float, ...],
    max_batch: int,
) -> list[tuple[TokenConfig, str]]:
    found = []
    for role in ("upload", "read"):
        entries = table.get(f"{role}_tokens", [])
        if not isinstance(entries, list):
            table_name = f"auth.{role}_tokens" if prefix == "auth." else f"{role}_tokens"
            raise ConfigError(f"{prefix}{role}_tokens: expected an array of tables ([[{table_name}]]).")
        for i, entry in enumerate(entries):
            key = f"{prefix}{role}_tokens[{i}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{key}: expected a table with name and token.")
            allowed = {"name", "token", "metrics", *_LIMIT_KEYS} if role == "upload" else {"name", "token"}
            _only(entry, allowed, f"{key}.")
            name = _text(entry.get("name"), f"{key}.name")
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}", name):
                raise ConfigError(
                    f"{key}.name: expected up to 64 letters, digits and _.@:- (a label in logs and "
                    f"metrics), got {name!r}."
                )
            digest = _token_value(entry.get("token"), f"{key}.token")
            if role == "read":
                found.append((TokenConfig(name, role, digest), key))
                continue
            metrics = entry.get("metrics")
            if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
                raise ConfigError(f"{key}.metrics: expected a non-empty list of the metric names it may report.")
            for j, metric in enumerate(metrics):
                if metric not in declared:
                    raise ConfigError(f"{key}.metrics[{j}]: {metric!r} is not a declared metric.")
            # A numeric metric's name stands for its parts, the metrics its reports travel as.
            scope = frozenset(part for metric in metrics for part in declared[metric])
            found.append(
                (
                    TokenConfig(name, role, digest, scope, *_limits(entry, f"{key}.", limits, max_batch)),
                    key,
                )
            )
    return found


def _token_value(value: object, key: str) -> bytes:
    """The digest of a token value; the messages never show the value."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string.")
    if not _MIN_TOKEN_LENGTH <= len(value) <= _MAX_TOKEN_LENGTH or not all(0x20 < ord(c) < 0x7F for c in value):
        raise ConfigError(
            f"{key}: expected {_MIN_TOKEN_LENGTH} to {_MAX_TOKEN_LENGTH} printable ASCII characters "
            f"without spaces (e.g. from `openssl rand -hex 32`)."
        )
    return token_digest(value)


def _store_options(store: Mapping[str, object], url: str) -> dict[str, object]:
    """The store's keyword arguments from the [store] table: the store the URL names checks its
    own settings (a shared store's and a file's differ)."""
    try:
        return store_options(url, {key: value for key, value in store.items() if key != "url"})
    except StoreMisconfigured as err:
        raise ConfigError(str(err)) from None


def _metric(raw: object, key: str) -> list[MetricConfig]:
    """A [[metrics]] table: one metric of categories, or the parts of a numeric metric."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: expected a table with name, labels, mechanism, epsilon and windows.")
    kind = raw.get("type", CATEGORIES)
    if kind not in (CATEGORIES, NUMERIC):
        raise ConfigError(
            f'{key}.type: expected "{CATEGORIES}" (the default), "{NUMERIC}" or "{STRINGS}", got {kind!r}.'
        )
    _only(
        raw,
        {"name", "type", "mechanism", "epsilon", "windows", *_RULE_KEYS}
        | ({"labels"} if kind == CATEGORIES else {"range", "buckets", "estimate", "mean_share"}),
        f"{key}.",
    )
    name = _text(raw.get("name"), f"{key}.name")
    mechanism = raw.get("mechanism", DEFAULT_MECHANISM)
    if mechanism not in MECHANISMS:
        raise ConfigError(f"{key}.mechanism: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}.")
    epsilon = raw.get("epsilon")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ConfigError(f"{key}.epsilon: expected a number from %g to %g, got {epsilon!r}." % EPSILON_RANGE)
    rules = _rules(raw, key, float(epsilon))
    windows = _windows(raw, key)
    try:
        if kind == NUMERIC:
            return [
                MetricConfig(
                    MetricSpec.numeric_part(numeric, mechanism, share * epsilon, **_split(rules, share)), windows
                )
                for numeric, share in _numeric_parts(raw, key, name, float(epsilon))
            ]
        labels = raw.get("labels")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ConfigError(f"{key}.labels: expected a list of category labels (strings).")
        return [MetricConfig(MetricSpec.create(name, labels, mechanism, float(epsilon), **rules), windows)]
    except MechanismError as err:
        raise ConfigError(f"{key}: {err}") from None


CATEGORIES = "categories"
NUMERIC = "numeric"
STRINGS = "strings"


def _strings(raw: Mapping[str, object], key: str) -> StringsConfig:
    """A [[metrics]] table of type "strings": no labels, mechanism or windows (its rounds have
    their own), one answer per device and period."""
    _only(raw, {"name", "type", "epsilon", "survivors", *_RULE_KEYS}, f"{key}.")
    name = _text(raw.get("name"), f"{key}.name")
    epsilon = raw.get("epsilon")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ConfigError(f"{key}.epsilon: expected a number from %g to %g, got {epsilon!r}." % EPSILON_RANGE)
    rules = _rules(raw, key, float(epsilon))
    if rules["reports_per_period"] != 1:
        raise ConfigError(
            f"{key}.reports_per_period: a strings metric's device answers its round once per period; "
            f"expected 1, got {rules['reports_per_period']!r}."
        )
    survivors = _whole(raw.get("survivors", DEFAULT_SURVIVORS), f"{key}.survivors", low=1)
    if survivors > _MAX_SURVIVORS:
        raise ConfigError(
            f"{key}.survivors: expected at most {_MAX_SURVIVORS} (each costs 256 candidates a round), got {survivors}."
        )
    found = StringsConfig(
        name, float(epsilon), rules["period"], rules["period_budget"], rules["lifetime_budget"], survivors
    )
    try:
        found.round_config(StringsRound(name, 0, found.buckets, (b"",)))  # the checks of a spec
    except MechanismError as err:
        raise ConfigError(f"{key}: {err}") from None
    return found


_MAX_SURVIVORS = 256
_RULE_KEYS = ("period", "reports_per_period", "period_budget", "lifetime_budget")


def _rules(raw: Mapping[str, object], key: str, epsilon: float) -> dict[str, Any]:
    """The device's reporting rule: period, reports per period, budgets."""
    period = parse_duration(raw.get("period", "1d"), f"{key}.period")
    if period > MAX_PERIOD:
        raise ConfigError(f"{key}.period: expected at most 366 days, got {raw.get('period')!r}.")
    reports_per_period = _whole(raw.get("reports_per_period", 1), f"{key}.reports_per_period", low=1)
    rules: dict[str, Any] = {"period": period, "reports_per_period": reports_per_period}
    for budget in ("period_budget", "lifetime_budget"):
        value = raw.get(budget)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < epsilon
        ):
            raise ConfigError(
                f"{key}.{budget}: expected an epsilon of at least the metric's ({epsilon!r}), got {value!r}."
            )
        rules[budget] = None if value is None else float(value)
    return rules


def _split(rules: Mapping[str, Any], share: float) -> dict[str, Any]:
    """A numeric part's rule: the metric's, its budgets scaled by the part's share of epsilon
    (the parts' spending adds up to the metric's: basic composition)."""
    return {
        key: value * share if key.endswith("_budget") and value is not None else value for key, value in rules.items()
    }


def _numeric_parts(raw: Mapping[str, object], key: str, name: str, epsilon: float) -> list[tuple[NumericSpec, float]]:
    """A numeric metric's parts with their shares of epsilon: the mean and/or the distribution over
    the buckets (default: the mean, and the distribution when buckets are given)."""
    bounds = raw.get("range")
    if (
        not isinstance(bounds, list)
        or len(bounds) != 2
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in bounds)
        or not bounds[0] < bounds[1]
    ):
        raise ConfigError(f"{key}.range: expected [low, high], two finite numbers with low < high, got {bounds!r}.")
    low, high = float(bounds[0]), float(bounds[1])
    buckets = raw.get("buckets", [])
    if not isinstance(buckets, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in buckets
    ):
        raise ConfigError(f"{key}.buckets: expected a list of bucket boundaries (numbers), got {buckets!r}.")
    wanted = raw.get("estimate", [MEAN, DISTRIBUTION] if buckets else [MEAN])
    if (
        not isinstance(wanted, list)
        or not wanted
        or not set(wanted) <= {MEAN, DISTRIBUTION}
        or len(set(wanted)) != len(wanted)
    ):
        raise ConfigError(f'{key}.estimate: expected ["mean"], ["distribution"] or both, got {wanted!r}.')
    if DISTRIBUTION in wanted and not buckets:
        raise ConfigError(f"{key}.buckets: the distribution needs bucket boundaries, e.g. [100, 250, 500, 1000].")
    if DISTRIBUTION not in wanted and buckets:
        raise ConfigError(f'{key}.buckets: given, but estimate does not ask for the "distribution".')
    share = raw.get("mean_share", DEFAULT_MEAN_SHARE)
    if len(wanted) == 1 and "mean_share" in raw:
        raise ConfigError(f"{key}.mean_share: only for a metric estimating both the mean and the distribution.")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ConfigError(
            f"{key}.mean_share: expected the share of epsilon the mean gets, above 0 and below 1, got {share!r}."
        )
    check_epsilon(share * epsilon if len(wanted) == 2 else epsilon)  # the mean's own epsilon in range
    return numeric_parts(name, low, high, tuple(buckets), tuple(wanted), epsilon, float(share))


def _windows(raw: Mapping[str, object], key: str) -> tuple[Window, ...]:
    raw_windows = raw.get("windows", list(_DEFAULT_WINDOWS))
    if not isinstance(raw_windows, list) or not raw_windows:
        raise ConfigError(f'{key}.windows: expected a list such as ["total", "1h", "1d"].')
    windows = tuple(_window(w, f"{key}.windows[{i}]") for i, w in enumerate(raw_windows))
    if len({w.name for w in windows}) != len(windows):
        raise ConfigError(f"{key}.windows: a window is declared twice.")
    return windows


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
        raise ConfigError(f'{key}: expected host:port (e.g. "127.0.0.1:50051"), got {value!r}.')
    return text


def _whole(value: object, key: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key}: expected a whole number of at least {low}, got {value!r}.")
    return value


def _seconds(value: object, key: str, *, above_zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (above_zero and value == 0)
    ):
        raise ConfigError(
            f"{key}: expected a number of seconds ({'above' if above_zero else 'at least'} 0), got {value!r}."
        )
    return float(value)


def _origins(value: object) -> tuple[str, ...]:
    """server.cors_origins: origins as browsers send them (scheme://host[:port], no path)."""
    if not isinstance(value, list) or not all(
        isinstance(o, str) and o.count("/") == 2 and "://" in o and not o.endswith("/") for o in value
    ):
        raise ConfigError(
            f'server.cors_origins: expected a list of origins like "https://app.example.com", got {value!r}.'
        )
    return tuple(value)
