"""Reporter: what an app embeds. Two lines: ``reporter = Reporter(endpoint)`` once, then
``reporter.report(metric, value)`` wherever a category is observed."""

from __future__ import annotations

import atexit
import operator
import os
import weakref
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from veil.mechanism import MechanismError, MetricSpec, RandomSource

from ._config import resolve_config
from ._counters import Counters
from ._errors import ConfigError, UnknownCategoryError, UnknownMetricError
from ._fs import private_dir
from ._log import LogOnce, logger
from ._memo import MemoStore
from ._processor import BatchProcessor
from ._specs import SpecCache

__all__ = ["Reporter"]

_DEFAULT_FLUSH_TIMEOUT_S = 30.0
_DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0  # also at interpreter exit


class Reporter:
    """Randomizes categories on the device and sends them to a Veil aggregator.

    ``report(metric, value)`` raises only for misuse (UnknownMetricError, UnknownCategoryError,
    both ReporterError and so ValueError); every problem of the network, the aggregator or the
    disk is absorbed, logged once and counted (see ``counters()``). Settings not given fall
    back to the VEIL_* environment variables (``veil.client.environment_variables``), then to
    defaults.

    ``memoize`` (default True) reuses one randomized response per (metric, spec, value): a
    value reported again sends the same response and spends no new privacy. Pass False to draw
    a fresh response for every report of every metric, or a mapping of metric name to bool to
    choose per metric (unlisted metrics memoize). Fresh responses compose: each spends the
    metric's epsilon.

    ``random_source`` is for simulation and tests only: reports are private only with the
    default, the operating system's CSPRNG.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        tls: bool | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        queue_dir: str | os.PathLike[str] | None = None,
        max_queue_size: int | None = None,
        max_batch_size: int | None = None,
        schedule_delay_ms: int | None = None,
        export_timeout_ms: int | None = None,
        spec_ttl_ms: int | None = None,
        max_disk_bytes: int | None = None,
        retry_initial_backoff_ms: int | None = None,
        retry_max_backoff_ms: int | None = None,
        memoize: bool | Mapping[str, bool] = True,
        random_source: RandomSource | None = None,
    ) -> None:
        config = resolve_config(
            endpoint=endpoint, token=token, tls=tls, ca_file=ca_file, client_cert=client_cert,
            client_key=client_key, queue_dir=queue_dir, max_queue_size=max_queue_size,
            max_batch_size=max_batch_size, schedule_delay_ms=schedule_delay_ms,
            export_timeout_ms=export_timeout_ms, spec_ttl_ms=spec_ttl_ms, max_disk_bytes=max_disk_bytes,
            retry_initial_backoff_ms=retry_initial_backoff_ms, retry_max_backoff_ms=retry_max_backoff_ms,
        )
        if isinstance(memoize, bool):
            self._memoize_default, self._memoize = memoize, {}
        elif isinstance(memoize, Mapping) and all(isinstance(v, bool) for v in memoize.values()):
            self._memoize_default, self._memoize = True, dict(memoize)
        else:
            raise ConfigError("memoize must be True, False or a mapping of metric name to True or False.")
        if random_source is not None:
            logger.warning("This Veil Reporter uses an injected random source: for simulation and tests only.")
        self._source = random_source
        log = LogOnce()
        directory = self._queue_dir(config.queue_dir, log)
        if not config.tls and config.token and not config.loopback:
            logger.warning("The Veil token travels without TLS to a remote endpoint.")
        self._specs = SpecCache(directory, log)
        self._specs.load()
        self._memo = MemoStore(directory, log)
        self._processor = BatchProcessor(replace(config, queue_dir=directory), self._specs, self._memo, log)
        ref = weakref.ref(self)
        self._exit_hook = lambda: (reporter := ref()) is not None and reporter.shutdown(_DEFAULT_SHUTDOWN_TIMEOUT_S)
        atexit.register(self._exit_hook)

    @staticmethod
    def _queue_dir(path: Path | None, log: LogOnce) -> Path | None:
        if path is None:
            return None
        try:
            return private_dir(path)
        except OSError:
            log.warning("queue_dir", "The Veil queue directory cannot be created; keeping everything in memory.")
            return None

    # --- the two-line API -----------------------------------------------------------------

    def report(self, metric: str, value: str | int) -> None:
        """Randomize ``value`` (a category label or index of ``metric``) and queue the report.

        Never blocks on the network. Raises UnknownMetricError when the aggregator's specs are
        known and lack ``metric``, UnknownCategoryError when ``value`` is not a category of it.
        When no spec has been obtained yet the report is dropped and counted instead."""
        if not isinstance(metric, str):
            raise UnknownMetricError("A metric name must be a string.")
        entry = self._specs.entries.get(metric)
        if entry is None:
            if metric in self._specs.refused:
                return self._processor.drop_logged("refused")
            if not self._specs.ready.is_set():
                return self._processor.drop_logged("no-specs")
            raise UnknownMetricError(f"The aggregator declares no metric named {metric!r}.")
        spec, labels = entry
        index = labels.get(value) if isinstance(value, str) else None
        if index is None:
            index = _index(spec, value)
        try:
            if not self._processor.has_room():  # do not randomize what would be dropped
                return self._processor.drop_logged("closed" if self._processor.stopped else "full")
            self._processor.submit(spec, self._randomize(spec, index))
        except Exception:
            self._processor.drop_logged("error")

    def _randomize(self, spec: MetricSpec, index: int) -> tuple[int, ...]:
        mechanism, source = spec.mechanism, self._source

        def draw() -> tuple[int, ...]:
            return mechanism.randomize(index) if source is None else mechanism.randomize(index, source)

        if self._memoize.get(spec.name, self._memoize_default):
            return self._memo.response(spec.name, spec.fingerprint, index, draw)
        return draw()

    # --- lifecycle ------------------------------------------------------------------------

    def force_flush(self, timeout: float | None = _DEFAULT_FLUSH_TIMEOUT_S) -> bool:
        """Send every queued report now; True when all were acknowledged (or failed for good)
        within ``timeout`` seconds."""
        return self._processor.force_flush(timeout)

    def shutdown(self, timeout: float | None = _DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Stop accepting reports and send what is queued, for at most ``timeout`` seconds.
        With a queue directory what is left stays on disk for the next Reporter (and no time
        is spent waiting out retries); without one it is dropped and counted. True when
        everything was delivered. Idempotent."""
        atexit.unregister(self._exit_hook)
        return self._processor.shutdown(timeout)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- what the app can read ------------------------------------------------------------

    def counters(self) -> Counters:
        """A snapshot of accepted, dropped, sent, retried, failed and queued reports."""
        return self._processor.counters()

    def wait_for_specs(self, timeout: float | None = None) -> bool:
        """Block until metric specs are known (from the queue directory or the aggregator);
        optional: report() never waits. True when they are."""
        return self._specs.ready.wait(timeout)

    @property
    def metrics(self) -> Mapping[str, MetricSpec]:
        """The metric specs in use, by name (empty until specs are known)."""
        return self._specs.specs


def _index(spec: MetricSpec, value: object) -> int:
    try:
        if isinstance(value, str):
            return spec.index(value)
        if isinstance(value, bool):
            raise MechanismError("A bool is not a category.")
        return spec.mechanism.check_value(operator.index(value))
    except (MechanismError, TypeError):
        # The value is not repeated in the message: it may be private.
        raise UnknownCategoryError(
            f"The value is neither a category label nor an index from 0 to {spec.k - 1} of metric {spec.name!r}."
        ) from None
