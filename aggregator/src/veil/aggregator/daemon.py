"""The aggregator daemon: gRPC (Collector, Estimates, health, reflection) and HTTP on one store.

    aggregator = Aggregator(load_config("veil.toml"))
    aggregator.start()
    ...
    aggregator.stop()      # health NOT_SERVING, in-flight uploads finish, listeners close

Health follows the store: a background thread pings it every second and reports NOT_SERVING
while it cannot be reached or refuses writes (uploads then fail fast with UNAVAILABLE, never
silently dropped). A store set up so that a batch could count twice (Redis evicting keys) is
refused at start, and NOT_SERVING with an error line if it becomes so while serving.

Access: with [tls] both listeners speak TLS only (mutual TLS with tls.client_ca_file); with
tokens, every call is checked before its handler (the policy _access, in gRPC by the interceptor
_interceptor, over HTTP by _http_collector and http); reload_tokens() swaps
them while serving (`veil serve` on SIGHUP). The limits on abuse, each bounding memory or
threads whatever a caller sends:
- gRPC refuses, unread, any message larger than the largest valid upload (max_message_bytes);
  a call refused by the access checks is answered without its message being read (_interceptor);
- requests and HTTP bodies being read reserve at most server.max_inflight_bytes (_budget), each
  the largest valid upload's size until read, one token at most its share (a quarter; tokenless
  health and reflection calls from a budget of their own); HTTP/2 windows stay small for
  messages not yet asked for (_GRPC_OPTIONS); a gRPC message not sent within
  server.read_timeout of being asked for cancels its call (_calls.ReadDeadlines);
- at most server.max_concurrent_rpcs calls are in progress or queued (more get
  RESOURCE_EXHAUSTED at once); streams run on pools of their own, at most server.max_streams
  Estimates/Watch and server.max_health_streams health and reflection streams;
- each upload token has rate limits in uploads and in reports per second;
- HTTP: at most server.http_max_connections connections, each with server.http_request_timeout
  for every request, its body included (see http).

With server.processes = N > 1 this class is one of N worker processes started by `veil serve`
(see workers): its gRPC socket sets SO_REUSEPORT so all N share the port, its rate limits are
1/N of the configured ones, and its counters go to PROMETHEUS_MULTIPROC_DIR, which the one
worker with an HTTP listener sums into /metrics.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import replace

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from veil.client import is_loopback
from veil.mechanism import REPORT_BYTES, max_report_bytes
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

from . import dashboard
from ._access import Access, Limits, token_limits
from ._budget import ByteBudget, token_share
from ._http_collector import HttpCollector
from ._interceptor import AccessInterceptor
from ._tls import ServerTls
from .config import AggregatorConfig, AuthConfig
from .errors import ConfigError, StoreError, StoreMisconfigured
from .http import HttpListener, Page
from .ingest import MAX_BATCHES, Ingest
from .instruments import EstimatesCollector, Instruments
from .live import LiveEstimates
from .rounds import Rounds
from .service import CollectorService, EstimatesService, add_estimates_to_server
from .store import Store, open_store

__all__ = [
    "Aggregator",
    "inflight_bytes",
    "max_message_bytes",
    "open_configured_store",
]

log = logging.getLogger("veil.aggregator")

_HEALTH_PERIOD = 1.0  # seconds between store pings
# A call's message waits in the HTTP/2 stream window until a worker asks for it. gRPC grows
# windows with its bandwidth probe; without it they stay at the lookahead for calls not yet
# read (a call being read is given its message's size), so queued calls hold little memory.
_GRPC_OPTIONS = (
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 64 << 10),
    ("grpc.max_concurrent_streams", 100),
)
_SERVICES = tuple(s.full_name for s in veil_pb2.DESCRIPTOR.services_by_name.values())


_DEFAULT_INFLIGHT_BYTES = 64 << 20
_FIELDS_BYTES = 256  # an upload's batch id, count, and every tag and length prefix, with room to spare


def max_message_bytes(config: AggregatorConfig) -> int:
    """The largest valid upload: max_batch reports in the widest encoding of any metric
    (veil.mechanism.max_report_bytes), in as many as ingest.MAX_BATCHES batches (UploadBatches),
    each with the longest metric name and fingerprint and a request's other fields. gRPC
    refuses anything larger before it is read."""
    widths = [max_report_bytes(m.spec.mechanism) for m in config.metrics]
    names = [len(m.name.encode()) + len(m.spec.fingerprint.encode()) for m in config.metrics]
    for s in config.strings:  # a round's report is REPORT_BYTES; its fingerprint 32 hex digits
        widths.append(REPORT_BYTES)
        names += [len(name.encode()) + 32 for name in s.round_names]
    return config.max_batch * max(widths) + MAX_BATCHES * (max(names) + _FIELDS_BYTES)


def inflight_bytes(config: AggregatorConfig) -> int:
    """The in-flight upload bytes budget: server.max_inflight_bytes, by default 64 MiB or the
    largest valid upload when that is larger. ConfigError when one upload could never fit."""
    limit = max_message_bytes(config)
    if config.max_inflight_bytes is None:
        return max(_DEFAULT_INFLIGHT_BYTES, limit)
    if config.max_inflight_bytes < limit:
        raise ConfigError(
            f"server.max_inflight_bytes: expected at least the largest valid upload of these metrics "
            f"({limit} bytes), or it could never be read; got {config.max_inflight_bytes}."
        )
    return config.max_inflight_bytes


def open_configured_store(config: AggregatorConfig) -> Store:
    """The store the config names; a bad URL or option is a ConfigError naming the key."""
    try:
        return open_store(config.store_url, **config.store_options)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"store: {err}") from None


def _worker_limits(auth: AuthConfig, processes: int) -> dict[str, Limits]:
    """This process's share of every token's rates and bursts. SO_REUSEPORT spreads connections,
    not calls, over the processes, so the N shares add up to the configured limit only while a
    token's connections are spread evenly (a token on one connection gets 1/N of it)."""
    return {
        name: (rate / processes, burst / processes, upload_rate / processes, upload_burst / processes)
        for name, (rate, burst, upload_rate, upload_burst) in token_limits(auth).items()
    }


def _token_names(auth: AuthConfig) -> dict[str, object]:
    """The tokens for a log line: upload token names with their metrics, read token names;
    names, never values."""
    return {
        "upload_tokens": {t.name: sorted(t.metrics) for t in auth.of_role("upload")},
        "read_tokens": [t.name for t in auth.of_role("read")],
    }


def _exported_registry(config: AggregatorConfig, instruments: Instruments, live: LiveEstimates) -> CollectorRegistry:
    """What /metrics serves: this process's instruments, or with several worker processes the sum
    of every worker's (prometheus_client multiprocess mode, files in PROMETHEUS_MULTIPROC_DIR).
    The estimates come from the shared store, so one process exports them either way."""
    if config.processes == 1:
        registry = instruments.registry
    else:
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            raise ConfigError(
                f"server.processes: {config.processes} worker processes are started by `veil serve`, "
                f"which gives them PROMETHEUS_MULTIPROC_DIR; use server.processes = 1 here."
            )
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    registry.register(EstimatesCollector(live, config.metrics_top))
    # process_* (CPU, memory, open files) and python_info of the process serving /metrics.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class Aggregator:
    def __init__(
        self,
        config: AggregatorConfig,
        *,
        store: Store | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        pages: dict[str, tuple[str, Page]] | None = None,
    ) -> None:
        self.config = config
        limit = max_message_bytes(config)
        budget = inflight_bytes(config)
        self.store = store if store is not None else open_configured_store(config)
        self.instruments = Instruments(registry)
        self.rounds = Rounds(config, self.store, clock)  # strings metrics' rounds, for ingest and estimates alike
        self.live = LiveEstimates(config, self.store, clock=clock, rounds=self.rounds)
        # The store's two hooks: this process's writes as they happen, and each write call's time.
        self.store.observe_applied(self.live.applied)
        self.store.observe_flushes(self.instruments.observe_flush)
        exported = _exported_registry(config, self.instruments, self.live)
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._health = health.HealthServicer()
        self._store_ok: bool | None = None  # unknown until the first ping

        self.tls = ServerTls(config.tls) if config.tls is not None else None
        self.access = Access(
            config.auth,
            metrics={
                **{m.name: m.spec for m in config.metrics},
                **{name: None for s in config.strings for name in s.round_names},
            },
            upload_bytes=limit,
            budget=ByteBudget(budget, token_share(budget, limit, config.workers)),
            limits=_worker_limits(config.auth, config.processes),
            registry=self.instruments.registry,
        )
        self.interceptor = AccessInterceptor(
            self.access,
            max_streams=config.max_streams,
            max_health_streams=config.max_health_streams,
            read_timeout=config.read_timeout,
        )
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="veil-grpc"),
            interceptors=[self.interceptor],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", int(config.processes > 1)),
                *_GRPC_OPTIONS,
            ],
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        collector = self.collector = CollectorService(
            Ingest(config, self.store, self.instruments, clock, lambda: self._store_ok is False, self.rounds)
        )
        veil_pb2_grpc.add_CollectorServicer_to_server(collector, self._grpc)
        self._estimates = EstimatesService(config, self.live, self._stopping)
        add_estimates_to_server(self._estimates, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        reflection.enable_server_reflection((*_SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._grpc)
        try:
            if self.tls is not None:
                self.grpc_port = self._grpc.add_secure_port(config.grpc_address, self.tls.grpc_credentials())
            else:
                self.grpc_port = self._grpc.add_insecure_port(config.grpc_address)
        except RuntimeError:  # grpcio raises where older versions returned 0
            self.grpc_port = 0
        if self.grpc_port == 0:
            raise ConfigError(f"server.grpc: cannot listen on {config.grpc_address}.")
        self._http = None
        if config.http_address:
            try:
                self._http = HttpListener(
                    config.http_address,
                    self.live,
                    exported,
                    lambda: self._store_ok is True,
                    dashboard.pages() if pages is None else pages,
                    tls=self.tls,
                    authenticator=self.access.authenticator,
                    max_connections=config.http_max_connections,
                    request_timeout=config.http_request_timeout,
                    collector=HttpCollector(self.access, collector.ingest),
                    upload_bytes=limit,
                    cors_origins=config.cors_origins,
                )
            except OSError as err:
                raise ConfigError(f"server.http: cannot listen on {config.http_address} ({err.strerror}).") from None
        self._pinger = threading.Thread(target=self._watch_store, name="veil-health", daemon=True)

    def reload_tokens(self, load: Callable[[], AggregatorConfig]) -> bool:
        """Take the tokens (and their metrics and rate limits) of the config `load` returns, from
        the next call on, for gRPC and HTTP alike; True when they were taken. A config that
        fails its checks, or would turn authentication on or off, changes nothing: the tokens in
        use stay, and the error is logged. Anything else that differs takes a restart, which
        the log says. Counted in veil_token_reloads by outcome."""
        try:
            fresh = load()
            self.access.reload(fresh.auth, _worker_limits(fresh.auth, self.config.processes))
        except ConfigError as err:
            self.instruments.token_reloads.labels("failed").inc()
            log.error("tokens not reloaded; the ones in use stay", extra={"error": str(err)})
            return False
        self.instruments.token_reloads.labels("reloaded").inc()
        log.info("tokens reloaded", extra=_token_names(fresh.auth))
        if replace(fresh, auth=self.config.auth) != self.config:
            log.warning("the config changed besides [auth]; only tokens are reloaded, the rest takes a restart")
        self.config = replace(self.config, auth=fresh.auth)
        return True

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http else None

    def start(self) -> None:
        self._check_store(starting=True)
        self._grpc.start()
        if self._http:
            self._http.start()
        self._pinger.start()
        log.info(
            "aggregator started",
            extra={
                "grpc_port": self.grpc_port,
                "http_port": self.http_port,
                "metrics": len(self.config.metrics),
            },
        )
        self._log_access()

    def _log_access(self) -> None:
        """Say how the listeners are protected; loudly when they are not."""
        config = self.config
        if self.tls is None:
            listeners = (config.grpc_address, config.http_address)
            exposed = [a for a in listeners if a and not is_loopback(a)]
            log.log(
                logging.WARNING if exposed else logging.INFO,
                "TLS is OFF: gRPC and HTTP are plaintext"
                + (
                    " on a non-loopback address: reports and tokens travel in clear; configure [tls] unless "
                    "a proxy in front terminates TLS"
                    if exposed
                    else " (loopback only)"
                ),
            )
        else:
            days = (self.tls.not_after - datetime.datetime.now(datetime.UTC)).days
            log.log(
                logging.WARNING if days < 14 else logging.INFO,
                "TLS on",
                extra={
                    "mutual_tls": self.tls.mutual,
                    "certificate_not_after": self.tls.not_after.isoformat(),
                    "certificate_days_left": days,
                },
            )
        if not config.auth.enabled:
            log.warning(
                "authentication is OFF: no tokens are configured, so anyone who reaches the listeners can "
                "upload and read estimates; fine for the embedded demo, not for production ([auth])"
            )
            return
        log.info("authentication on", extra=_token_names(config.auth))
        if not config.auth.of_role("read"):
            log.warning("no read tokens: estimates (gRPC Estimates, HTTP /v1/estimates and /metrics) cannot be read")

    def _check_store(self, starting: bool = False) -> None:
        try:
            self.store.ping()
            ok = True
        except StoreMisconfigured as err:
            if starting:
                raise ConfigError(f"store.url: {err}.") from None
            ok = False
            if self._store_ok is not False:
                log.error("the counter store would count batches twice: NOT_SERVING", extra={"error": str(err)})
        except StoreError:
            ok = False
        except Exception:  # noqa: BLE001 (a store client's own fault: the watch goes on, NOT_SERVING)
            ok = False
            if self._store_ok is not False:
                log.exception("the counter store's check failed unexpectedly: NOT_SERVING")
        if ok is not self._store_ok:
            status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            for service in ("", *_SERVICES):
                self._health.set(service, status)
            log.log(
                logging.INFO if ok else logging.WARNING,
                "counter store reachable: SERVING" if ok else "counter store unavailable: NOT_SERVING",
            )
        self._store_ok = ok

    def _watch_store(self) -> None:
        while not self._stopping.wait(_HEALTH_PERIOD):
            self._check_store()

    def stop(self, grace: float | None = None) -> None:
        """Stop serving: NOT_SERVING first (load balancers drain), then let in-flight calls
        finish within the grace period, then close the listeners and the store."""
        if self._stopping.is_set():
            self._stopped.wait()
            return
        self._stopping.set()
        self._health.enter_graceful_shutdown()
        self._estimates.stop()
        grace = self.config.grace_period if grace is None else grace
        self._grpc.stop(grace).wait()
        self.interceptor.close()
        if self._http:
            self._http.stop()
        try:
            self.store.close()
        finally:
            log.info("aggregator stopped")
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop() has finished (True), or the timeout passed (False)."""
        return self._stopped.wait(timeout)
