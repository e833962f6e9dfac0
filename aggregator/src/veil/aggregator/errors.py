"""Every error the aggregator raises on purpose, in one light module (no numpy), so that a
caller, the CLI included, can catch them without loading the rest.

The hierarchy::

    Exception
    ├── AggregatorError             the aggregator's own errors
    │   ├── ConfigError             (also a ValueError) the configuration is wrong; names the key
    │   ├── InvalidBatch            (also a ValueError) an upload is malformed; nothing of it is counted
    │   ├── UnknownMetric           (also a ValueError) a request names a metric not declared
    │   │   ├── UnknownWindow       ... or a window the metric does not declare
    │   │   └── UnknownCategory     ... or a category label the metric does not declare
    │   ├── StaleSpec               (also a ValueError) an upload was randomized under another spec
    │   └── InvalidRange            (also a ValueError) a range of buckets that cannot be read
    └── StoreError                  a store failed
        ├── StoreUnavailable        unreachable, too slow, or refusing writes for now: retry
        └── StoreMisconfigured      set up so that counting exactly once cannot hold: an operator must fix it

Store errors are not AggregatorErrors: they are the store's trouble, never the caller's, and
the service answers them with UNAVAILABLE (StoreUnavailable: retry with the same batch id) or
INTERNAL.
"""

from __future__ import annotations

__all__ = [
    "AggregatorError",
    "ConfigError",
    "InvalidBatch",
    "UnknownMetric",
    "UnknownWindow",
    "UnknownCategory",
    "StaleSpec",
    "InvalidRange",
    "StoreError",
    "StoreUnavailable",
    "StoreMisconfigured",
]


_QUOTED_CHARACTERS = 64


def quoted(name: str) -> str:
    """A name from a request, quoted for an error message: at most 64 characters of it. A
    caller's name is echoed, never whole: a 100,000-character one would make trailers larger
    than a client accepts, and it would see RESOURCE_EXHAUSTED instead of the refusal."""
    return repr(name if len(name) <= _QUOTED_CHARACTERS else name[:_QUOTED_CHARACTERS] + "...")


class AggregatorError(Exception):
    """The root of the aggregator's own errors."""


class ConfigError(AggregatorError, ValueError):
    """The configuration is wrong; the message names the key."""


class InvalidBatch(AggregatorError, ValueError):
    """An upload has a malformed report (or is malformed as a whole); nothing of it is counted."""

    def __init__(self, reason: str, report: int | None = None) -> None:
        self.reason = reason
        self.report = report  # index of the first bad report in the batch, None for the batch itself
        where = "batch" if report is None else f"report {report}"
        super().__init__(f"{where}: {reason}")


class UnknownMetric(AggregatorError, ValueError):
    """A request names a metric this aggregator does not declare."""


class UnknownWindow(UnknownMetric):
    """A window name the metric does not declare."""


class UnknownCategory(UnknownMetric):
    """A group names a label the metric does not declare."""


class StaleSpec(AggregatorError, ValueError):
    """An upload was randomized under a spec other than the metric's current one."""


class InvalidRange(AggregatorError, ValueError):
    """A range of buckets that cannot be read (the total window, too many buckets)."""


class StoreError(Exception):
    """The root of every store failure."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, did not answer in time, or refuses writes for now (memory
    full, disk full, a read-only replica); the caller may retry."""


class StoreMisconfigured(StoreError):
    """The store answers but is set up so that counting exactly once cannot hold (e.g. Redis
    evicting keys); an operator must fix it."""
