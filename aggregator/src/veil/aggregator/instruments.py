"""Prometheus instruments: ingest counters and latencies, and the estimates as gauges.

Everything lives on a registry passed in (a fresh CollectorRegistry by default), never on the
process-global one, so two aggregators in one process, or a test, never share series.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from .live import LiveEstimates
from .store import StoreError

__all__ = ["Instruments", "EstimatesCollector"]

log = logging.getLogger("veil.aggregator")


class Instruments:
    """The aggregator's own counters and histograms."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.uploads = Counter("veil_uploads", "Upload calls by metric and outcome.", ["metric", "outcome"],
                               registry=self.registry)
        self.reports = Counter("veil_reports_counted", "Reports counted (duplicates excluded).", ["metric"],
                               registry=self.registry)
        self.upload_seconds = Histogram(
            "veil_upload_seconds", "Time to validate and count one upload.", ["metric"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        # Store writes: one flush is one write of a group of batches (RedisStore: one script call).
        self.flush_seconds = Histogram(
            "veil_store_flush_seconds", "Time of one store write of a group of batches.", registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.flush_batches = Histogram(
            "veil_store_flush_batches", "Batches written together by one store write.", registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.flush_failures = Counter("veil_store_flush_failures", "Store writes that failed (every batch of "
                                      "the group was refused with UNAVAILABLE or INTERNAL).", registry=self.registry)
        self.token_reloads = Counter("veil_token_reloads", "Reloads of the tokens (SIGHUP), by outcome: reloaded, "
                                     "or failed (the tokens in use stayed).", ["outcome"], registry=self.registry)

    def observe_flush(self, batches: int, seconds: float, failed: bool) -> None:
        """One store write of ``batches`` batches took ``seconds``."""
        self.flush_seconds.observe(seconds)
        self.flush_batches.observe(batches)
        if failed:
            self.flush_failures.inc()


class EstimatesCollector:
    """Collects, at each scrape, the current estimate, standard error and n of every metric,
    window and category. A withheld estimate exports n only."""

    def __init__(self, live: LiveEstimates) -> None:
        self._live = live

    def collect(self):
        estimate = GaugeMetricFamily("veil_estimate", "Unbiased estimate of a category's share.",
                                     labels=["metric", "window", "category"])
        stderr = GaugeMetricFamily("veil_estimate_stderr", "Standard error of the estimate.",
                                   labels=["metric", "window", "category"])
        reports = GaugeMetricFamily("veil_window_reports", "Reports counted in the window's current bucket.",
                                    labels=["metric", "window"])
        try:
            current = self._live.current()
        except StoreError:
            log.warning("estimates missing from /metrics: the counter store is unavailable")
            current = []
        for e in current:
            reports.add_metric([e.metric.name, e.window.name], e.n)
            if e.estimate is None:
                continue
            names = (e.metric.name, e.window.name)
            for label, value, error in zip(e.metric.spec.labels, e.estimate.estimate.tolist(),
                                           e.estimate.stderr.tolist()):
                estimate.add_metric([*names, label], value)
                stderr.add_metric([*names, label], error)
        yield from (estimate, stderr, reports)
