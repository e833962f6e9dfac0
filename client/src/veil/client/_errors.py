"""The errors veil.client raises into the app: only for misuse at the call.

The hierarchy (all exported by veil.client)::

    ValueError
    └── ReporterError               the root of every error the client raises
        ├── ConfigError             a Reporter setting is invalid (type, range, unreadable file)
        ├── UnknownMetricError      the aggregator's specs are known and do not declare the metric
        └── UnknownCategoryError    the value is neither a category (a label or an index) nor a number
            └── InvalidNumberError  the value is a number but NaN or an infinity

Every transport or storage problem is absorbed, logged once and counted instead (see
``Reporter.counters()``); background work never raises into the app.
"""

from __future__ import annotations

__all__ = ["ReporterError", "ConfigError", "UnknownMetricError", "UnknownCategoryError", "InvalidNumberError"]


class ReporterError(ValueError):
    """The root of every error the Veil client raises into the app."""


class ConfigError(ReporterError):
    """A Reporter setting is invalid (bad type, out of range, unreadable file)."""


class UnknownMetricError(ReporterError):
    """The aggregator's specs are known and do not declare this metric."""


class UnknownCategoryError(ReporterError):
    """The value is neither a category (a label or an index) nor a number: no metric could take it."""


class InvalidNumberError(UnknownCategoryError):
    """The value is NaN or an infinity: no number a numeric metric can report (and no category)."""
