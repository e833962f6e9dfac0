"""The current estimates of every metric and window, recomputed only when their counts change.

Each bucket's counts carry a version (the number of batches added to it, kept by the store),
so one cheap round trip tells which cached estimates are stale; only those are read and
recomputed. Several aggregator processes may share a store: the versions see their writes too.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._errors import UnknownMetric
from .config import AggregatorConfig, MetricConfig, Window
from .counts import Counts
from .estimate import Estimate, estimate
from .store import CountsKey, Store

__all__ = ["WindowEstimate", "LiveEstimates", "UnknownWindow", "estimates_json"]

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
        """The shape served at /v1/estimates (and printed by `veil estimates --json`). A fresh
        dict each call; its "categories" list is built once per WindowEstimate and shared, so
        treat it as read-only."""
        body = self._head()
        body["categories"] = self._categories
        return body

    def _head(self) -> dict[str, object]:
        """to_json() but for "categories" (its last key)."""
        spec = self.metric.spec
        return {
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
        }

    @functools.cached_property
    def _categories(self) -> list[dict[str, object]]:
        if self.estimate is None:
            return []
        e = self.estimate
        columns = [_finite(x) for x in (e.estimate, e.stderr, e.lower, e.upper, e.projection)]
        return [{"label": label, "estimate": estimate, "stderr": stderr, "lower": lower, "upper": upper,
                 "projected": projected}
                for label, estimate, stderr, lower, upper, projected in zip(self.metric.spec.labels, *columns)]

    @functools.cached_property
    def json_text(self) -> str:
        """json.dumps(self.to_json(), allow_nan=False), computed once: /v1/estimates joins these.

        Written without the per-category dicts: each number column goes through json.dumps as
        one list (the same float repr and null as in the dicts), the labels' JSON is cached per
        label set, and the records are formatted from those pieces: byte for byte the same text
        (tests compare), a little faster, and no thousands of long-lived dicts for the garbage
        collector to track (each fresh HTTP read at k = 1024 would add some 3000 per window)."""
        e = self.estimate
        if e is None or e.projection is None:
            return json.dumps(self.to_json(), allow_nan=False)
        head = json.dumps(self._head(), allow_nan=False)  # "categories" goes where its closing brace was
        columns = [json.dumps(_finite(x), allow_nan=False)[1:-1].split(", ")
                   for x in (e.estimate, e.stderr, e.lower, e.upper, e.projection)]
        records = ", ".join([_RECORD % fields for fields in zip(_labels_json(self.metric.spec.labels), *columns)])
        return head[:-1] + ', "categories": [' + records + "]}"


_RECORD = ('{"label": %s, "estimate": %s, "stderr": %s, "lower": %s, "upper": %s, "projected": %s}')


@functools.lru_cache(maxsize=256)
def _labels_json(labels: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(json.dumps(label) for label in labels)


def _finite(x: np.ndarray) -> list[float | None]:
    """JSON has no NaN: an undefined number (e.g. a standard error from one report) is null."""
    x = np.asarray(x, dtype=np.float64)
    values = x.tolist()
    for j in np.flatnonzero(~np.isfinite(x)).tolist():
        values[j] = None
    return values


def estimates_json(current: list[WindowEstimate], generated_at: float) -> bytes:
    """The body of GET /v1/estimates, byte for byte json.dumps({"generated_at": generated_at,
    "projection": PROJECTION_NOTE, "estimates": [e.to_json() for e in current]},
    allow_nan=False).encode(), from each window's cached JSON text."""
    head = json.dumps({"generated_at": generated_at, "projection": PROJECTION_NOTE}, allow_nan=False)
    return (head[:-1] + ', "estimates": [' + ", ".join(e.json_text for e in current) + "]}").encode()


class LiveEstimates:
    """Estimates for the config's metrics, read from a store, cached per bucket and version."""

    def __init__(self, config: AggregatorConfig, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._cache: dict[tuple[str, str], WindowEstimate] = {}
        self._changing: set[tuple[str, str]] = set()  # (metric, window) found changed by the last call
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
        StoreUnavailable when the store cannot be read.

        A bucket whose counts changed since the previous call is likely to change again (reports
        keep coming): where the store can (versions_and_read), its counts are read along with
        every version, in the same round trip, instead of in a second one once the versions
        are known. Counts read for nothing (the version had not changed after all) are
        dropped; a bucket found changed unexpectedly is read in a second round trip."""
        pairs = self.select(metric, window)
        now = self._clock()
        buckets = [w.bucket(now) for _, w in pairs]
        keys = [CountsKey(m.name, m.spec.fingerprint, w.name, start) for (m, w), (start, _) in zip(pairs, buckets)]
        guess = [i for i, (m, w) in enumerate(pairs) if (m.name, w.name) in self._changing]
        fused = getattr(self._store, "versions_and_read", None)
        if guess and fused is not None:
            versions, read = fused(keys, [self._request(pairs[i][0], keys[i]) for i in guess])
            counts: dict[int, Counts] = dict(zip(guess, read))
        else:
            versions, counts = self._store.versions(keys), {}
        results: list[WindowEstimate | None] = []
        stale = []
        for i, ((m, w), (start, _), version) in enumerate(zip(pairs, buckets, versions)):
            cached = self._cache.get((m.name, w.name))
            if cached is None or cached.start != start or cached.version != version:
                stale.append(i)
                cached = None
            results.append(cached)
        unread = [i for i in stale if i not in counts]
        if unread:
            counts.update(zip(unread, self._read([self._request(pairs[i][0], keys[i]) for i in unread])))
        for i in stale:
            (m, w), (start, end) = pairs[i], buckets[i]
            fresh = self._compute(m, w, start, end, versions[i], counts[i])
            with self._lock:
                self._cache[(m.name, w.name)] = fresh
            results[i] = fresh
        changed = {(pairs[i][0].name, pairs[i][1].name) for i in stale}
        with self._lock:
            for m, w in pairs:
                if (m.name, w.name) in changed:
                    self._changing.add((m.name, w.name))
                else:
                    self._changing.discard((m.name, w.name))
        return results  # type: ignore[return-value]

    @staticmethod
    def _request(metric: MetricConfig, key: CountsKey) -> tuple[CountsKey, tuple[int, ...], int]:
        spec = metric.spec.mechanism
        return key, spec.weight_law().weights, spec.k

    def _read(self, requests: list[tuple[CountsKey, tuple[int, ...], int]]) -> list[Counts]:
        """The counts of these buckets, in one round trip where the store can."""
        read_many = getattr(self._store, "read_many", None)
        if read_many is not None and len(requests) > 1:
            return read_many(requests)
        return [self._store.read(*request) for request in requests]

    def _compute(self, metric: MetricConfig, window: Window, start: int, end: int, version: int,
                 counts: Counts) -> WindowEstimate:
        spec = metric.spec.mechanism
        n = counts.total
        least = max(self._config.min_n, 2)  # a standard error needs two reports
        if n < least:
            reason = (f"{n} reports so far; estimates are shown from {least} reports on, so that "
                      "no small group is singled out and the error bars mean something.")
            return WindowEstimate(metric, window, start, end, version, n, None, reason)
        return WindowEstimate(metric, window, start, end, version, n, estimate(spec, counts, project=True), "")
