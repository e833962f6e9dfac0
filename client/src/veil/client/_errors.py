"""The error root of veil.client: misuse at the call raises a subclass of ValueError.

Only misuse raises (an unknown metric, a value outside a metric's categories, a bad setting);
every transport or storage problem is absorbed, logged once and counted instead.
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
