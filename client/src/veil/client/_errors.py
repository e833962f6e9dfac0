"""The errors veil.client raises into the app: only for misuse at the call.

The hierarchy (all exported by veil.client)::

    ValueError
    └── ReporterError               the root of every error the client raises
        ├── ConfigError             a Reporter setting is invalid (type, range, unreadable file)
        ├── UnknownMetricError      the aggregator's specs are known and do not declare the metric
        └── UnknownCategoryError    the value is neither a label nor an index of the metric

Every transport or storage problem is absorbed, logged once and counted instead (see
``Reporter.counters()``); background work never raises into the app.
"""

from __future__ import annotations

__all__ = ["ReporterError", "ConfigError", "UnknownMetricError", "UnknownCategoryError"]


class ReporterError(ValueError):
    """The root of every error the Veil client raises into the app."""


class ConfigError(ReporterError):
    """A Reporter setting is invalid (bad type, out of range, unreadable file)."""


class UnknownMetricError(ReporterError):
    """The aggregator's specs are known and do not declare this metric."""


class UnknownCategoryError(ReporterError):
    """The value is neither a category label nor a category index of the metric."""
