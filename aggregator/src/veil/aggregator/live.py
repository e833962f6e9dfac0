"""The current estimates of every metric and window, recomputed only when their counts change.

Each bucket's counts carry a version (the number of batches added to it, kept by the store),
so one cheap round trip tells which cached estimates are stale; only those are read and
recomputed. Several aggregator processes may share a store: the versions see their writes too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._errors import UnknownMetric
from .config import AggregatorConfig, MetricConfig, Window
from .estimate import Estimate, estimate
from .store import CountsKey, Store

__all__ = ["WindowEstimate", "LiveEstimates", "UnknownWindow"]

PROJECTION_NOTE = "Euclidean projection of the estimate onto the probability simplex: a distribution, but biased."


class UnknownWindow(UnknownMetric):
    """A window name the metric does not declare."""


@dataclass(frozen=True, eq=False)
class WindowEstimate:
    """The estimate of one metric over the current bucket of one window."""

    metric: MetricConfig
    window: Window
    start: int  # the bucket's start and end, Unix seconds (0, 0 for total)
    end: int
    version: int  # batches counted in the bucket
    n: int
    estimate: Estimate | None  # None when withheld
    reason: str  # why it is withheld; "" otherwise

    @property
    def withheld(self) -> bool:
        return self.estimate is None

    def to_json(self) -> dict[str, object]:
        """The shape served at /v1/estimates (and printed by `veil estimates --json`)."""
        spec = self.metric.spec
        body: dict[str, object] = {
            "metric": spec.name,
            "window": self.window.name,
            "start": self.start,
            "end": self.end,
            "n": self.n,
            "mechanism": spec.mechanism.name,
            "epsilon": spec.mechanism.epsilon,
            "spec_fingerprint": spec.fingerprint,
            "withheld": self.withheld,
            "reason": self.reason,
            "categories": [],
        }
        if self.estimate is not None:
            e = self.estimate
            body["categories"] = [
                {"label": label, "estimate": _finite(e.estimate[j]), "stderr": _finite(e.stderr[j]),
                 "lower": _finite(e.lower[j]), "upper": _finite(e.upper[j]),
                 "projected": _finite(e.projection[j])}
                for j, label in enumerate(spec.labels)
            ]
        return body


def _finite(x: np.floating) -> float | None:
    """JSON has no NaN: an undefined number (e.g. a standard error from one report) is null."""
    value = float(x)
    return value if np.isfinite(value) else None


class LiveEstimates:
    """Estimates for the config's metrics, read from a store, cached per bucket and version."""

    def __init__(self, config: AggregatorConfig, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._cache: dict[tuple[str, str], WindowEstimate] = {}
        self._lock = threading.Lock()

    def select(self, metric: str | None = None, window: str | None = None) -> list[tuple[MetricConfig, Window]]:
        """The (metric, window) pairs a request names; empty names mean all."""
        metrics = self._config.metrics
        if metric:
            found = self._config.metric(metric)
            if found is None:
                raise UnknownMetric(f"No metric named {metric!r} is declared.")
            metrics = (found,)
        pairs = [(m, w) for m in metrics for w in m.windows if not window or w.name == window]
        if window and not pairs:
            raise UnknownWindow(f"No window named {window!r} is declared for {metric or 'any metric'}.")
        return pairs

    def current(self, metric: str | None = None, window: str | None = None) -> list[WindowEstimate]:
        """The estimates now, in config order. Raises UnknownMetric for names not declared and
        StoreUnavailable when the store cannot be read."""
        pairs = self.select(metric, window)
        now = self._clock()
        buckets = [w.bucket(now) for _, w in pairs]
        keys = [CountsKey(m.name, m.spec.fingerprint, w.name, start) for (m, w), (start, _) in zip(pairs, buckets)]
        versions = self._store.versions(keys)
        results = []
        for (m, w), (start, end), key, version in zip(pairs, buckets, keys, versions):
            cached = self._cache.get((m.name, w.name))
            if cached is None or cached.start != start or cached.version != version:
                cached = self._compute(m, w, start, end, key, version)
                with self._lock:
                    self._cache[(m.name, w.name)] = cached
            results.append(cached)
        return results

    def _compute(self, metric: MetricConfig, window: Window, start: int, end: int, key: CountsKey,
                 version: int) -> WindowEstimate:
        spec = metric.spec.mechanism
        counts = self._store.read(key, spec.weight_law().weights, spec.k)
        n = counts.total
        least = max(self._config.min_n, 2)  # a standard error needs two reports
        if n < least:
            reason = (f"{n} reports so far; estimates are shown from {least} reports on, so that "
                      "no small group is singled out and the error bars mean something.")
            return WindowEstimate(metric, window, start, end, version, n, None, reason)
        return WindowEstimate(metric, window, start, end, version, n, estimate(spec, counts, project=True), "")
