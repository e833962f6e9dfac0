"""Prometheus instruments: ingest counters and latencies, and the estimates as gauges.

The estimates are bounded: per metric and window, the metrics_top categories with the largest
estimates (a category keeps its series while it stays among them), each with its standard
error and 95% interval (lower, upper), and the rest as one group (veil_estimate_rest, with its
standard error and its interval, which allows for the group being chosen by the same data:
estimate.rest_estimate): at k = 1024, 3 windows and the default 50, 3 x (4 x 50 + 4) = 612
estimate series instead of 12,288. Chart the interval, not estimate +- 1.96 stderr: the
interval is a score interval clipped to [0, 1], not symmetric about the estimate, and an upper
end below 0 means no evidence of presence (docs/math.md section 5).

A numeric metric's parts are exported as above (their points or buckets as categories), and
its mean (veil_numeric_mean, with stderr, lower and upper) and quantiles (veil_numeric_quantile
with q = "0.5", "0.9", "0.99", each with lower and upper) under its own name: 4 + 9 series per
window.

A strings metric is exported under its own name as what its verification round found: the
metrics_top largest values (veil_strings_share{value}, the value's text, with stderr, lower and
upper: at most 4 x metrics_top series per window) and its detection floor
(veil_strings_floor); not its round's candidates (strings_estimates.StringsGauges).

Everything lives on a registry passed in (a fresh CollectorRegistry by default), never on the
process-global one, so two aggregators in one process, or a test, never share series.
"""

from __future__ import annotations

import logging

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from .errors import StoreError
from .estimate import rest_estimate
from .live import LiveEstimates
from .strings_estimates import StringsGauges, metric_name

__all__ = ["Instruments", "EstimatesCollector"]

log = logging.getLogger("veil.aggregator")


class Instruments:
    """The aggregator's own counters and histograms."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.uploads = Counter(
            "veil_uploads", "Upload calls by metric and outcome.", ["metric", "outcome"], registry=self.registry
        )
        self.reports = Counter(
            "veil_reports_counted", "Reports counted (duplicates excluded).", ["metric"], registry=self.registry
        )
        self.upload_seconds = Histogram(
            "veil_upload_seconds",
            "Time to validate and count one upload.",
            ["metric"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        # Store writes: one flush is one write of a group of batches (RedisStore: one script call).
        self.flush_seconds = Histogram(
            "veil_store_flush_seconds",
            "Time of one store write of a group of batches.",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.flush_batches = Histogram(
            "veil_store_flush_batches",
            "Batches written together by one store write.",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.flush_failures = Counter(
            "veil_store_flush_failures",
            "Store writes that failed (every batch of the group was refused with UNAVAILABLE or INTERNAL).",
            registry=self.registry,
        )
        self.token_reloads = Counter(
            "veil_token_reloads",
            "Reloads of the tokens (SIGHUP), by outcome: reloaded, or failed (the tokens in use stayed).",
            ["outcome"],
            registry=self.registry,
        )

    def observe_flush(self, batches: int, seconds: float, failed: bool) -> None:
        """One store write of ``batches`` batches took ``seconds``."""
        self.flush_seconds.observe(seconds)
        self.flush_batches.observe(batches)
        if failed:
            self.flush_failures.inc()


class EstimatesCollector:
    """Collects, at each scrape, the current estimate, standard error and n of every metric,
    window and category (the top ones and the rest, see the module docstring), whether the
    store answered, and one info series per metric spec. A withheld estimate exports n only."""

    def __init__(self, live: LiveEstimates, top: int = 50) -> None:
        self._live = live
        self._top = top

    def collect(self):
        estimate = GaugeMetricFamily(
            "veil_estimate", "Unbiased estimate of a category's share.", labels=["metric", "window", "category"]
        )
        stderr = GaugeMetricFamily(
            "veil_estimate_stderr", "Standard error of the estimate.", labels=["metric", "window", "category"]
        )
        lower = GaugeMetricFamily(
            "veil_estimate_lower",
            "Lower end of the estimate's 95% interval (a score interval; not estimate - 1.96 stderr).",
            labels=["metric", "window", "category"],
        )
        upper = GaugeMetricFamily(
            "veil_estimate_upper",
            "Upper end of the estimate's 95% interval; below 0: no evidence of presence.",
            labels=["metric", "window", "category"],
        )
        reports = GaugeMetricFamily(
            "veil_window_reports", "Reports counted in the window's current bucket.", labels=["metric", "window"]
        )
        rest, rest_stderr, rest_lower, rest_upper = _gauges(
            ["metric", "window"],
            veil_estimate_rest="Estimated share of the categories not exported one by one "
            "(all but the metrics_top largest), as one group.",
            veil_estimate_rest_stderr="Standard error of veil_estimate_rest.",
            veil_estimate_rest_lower="Lower end of veil_estimate_rest's 95% interval.",
            veil_estimate_rest_upper="Upper end of veil_estimate_rest's 95% interval "
            "(allowing for the group being chosen by the same data).",
        )
        # A numeric metric's mean and quantiles, in its units, labelled by its name (not a part's):
        # per window one mean and len(QUANTILES) quantiles, each with its interval.
        mean, mean_stderr, mean_lower, mean_upper = _gauges(
            ["metric", "window"],
            veil_numeric_mean="Unbiased estimate of a numeric metric's mean.",
            veil_numeric_mean_stderr="Standard error of veil_numeric_mean.",
            veil_numeric_mean_lower="Lower end of veil_numeric_mean's 95% interval.",
            veil_numeric_mean_upper="Upper end of veil_numeric_mean's 95% interval.",
        )
        quantile, quantile_lower, quantile_upper = _gauges(
            ["metric", "window", "q"],
            veil_numeric_quantile="Estimate of a numeric metric's q-quantile (interpolated within its bucket).",
            veil_numeric_quantile_lower="Lower end of veil_numeric_quantile's 95% interval "
            "(a bucket boundary or the range's low end).",
            veil_numeric_quantile_upper="Upper end of veil_numeric_quantile's 95% interval "
            "(a bucket boundary or the range's high end).",
        )
        strings = StringsGauges(self._top)
        up = GaugeMetricFamily("veil_store_up", "1 when the counter store answered this scrape's reads, else 0.")
        info = InfoMetricFamily(
            "veil_metric",
            "A declared metric's spec.",
            labels=["metric", "mechanism", "epsilon", "k", "fingerprint", "period_seconds"],
        )
        for spec in dict.fromkeys(metric.spec for metric, _ in self._live.select()):
            info.add_metric(
                [
                    spec.name,
                    spec.mechanism.name,
                    repr(spec.mechanism.epsilon),
                    str(spec.mechanism.k),
                    spec.fingerprint,
                    str(spec.period),
                ],
                {},
            )
        try:
            current = self._live.current()
            up.add_metric([], 1)
        except StoreError:
            log.warning("estimates missing from /metrics: the counter store is unavailable")
            current = []
            up.add_metric([], 0)
        for e in current:
            reports.add_metric([metric_name(e.metric.spec), e.window.name], e.n)
            if e.metric.spec.strings is not None:
                if e.strings is not None:
                    strings.add(e.window.name, e.strings)
                continue
            if e.estimate is None:
                continue
            names = (e.metric.name, e.window.name)
            numeric = e.metric.spec.numeric
            if numeric is not None:
                of = (numeric.metric, e.window.name)
                if e.mean is not None:
                    m = e.mean
                    for family, value in zip(
                        (mean, mean_stderr, mean_lower, mean_upper), (m.estimate, m.stderr, m.lower, m.upper)
                    ):
                        family.add_metric(list(of), value)
                for x in e.quantiles:
                    for family, value in zip(
                        (quantile, quantile_lower, quantile_upper), (x.estimate, x.lower, x.upper)
                    ):
                        family.add_metric([*of, repr(x.q)], value)
            values = e.estimate.estimate
            k = values.size
            shown = np.arange(k) if k <= self._top else np.sort(np.argsort(-values, kind="stable")[: self._top])
            labels = e.metric.spec.labels
            columns = (e.estimate.estimate, e.estimate.stderr, e.estimate.lower, e.estimate.upper)
            for family, column in zip((estimate, stderr, lower, upper), columns):
                for j, value in zip(shown.tolist(), column[shown].tolist()):
                    family.add_metric([*names, labels[j]], value)
            if shown.size < k:
                # The same categories left out: the top metrics_top by estimate, ties by index.
                group = rest_estimate(e.metric.spec.mechanism, e.estimate, self._top)
                values_of_rest = (group.estimate, group.stderr, group.lower, group.upper)
                for family, value in zip((rest, rest_stderr, rest_lower, rest_upper), values_of_rest):
                    family.add_metric(list(names), value)
        yield from (estimate, stderr, lower, upper, rest, rest_stderr, rest_lower, rest_upper)
        yield from (mean, mean_stderr, mean_lower, mean_upper, quantile, quantile_lower, quantile_upper)
        yield from strings.families()
        yield from (reports, up, info)


def _gauges(labels: list[str], **helps: str) -> list[GaugeMetricFamily]:
    """A gauge family per name=help, in order, all with these labels."""
    return [GaugeMetricFamily(name, text, labels=labels) for name, text in helps.items()]
