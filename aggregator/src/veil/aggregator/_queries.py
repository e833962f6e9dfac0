"""The JSON answers of GET /v1/estimates and GET /v1/series, apart from the HTTP listener that
sends them (status, body), so the listener only routes:

    GET /v1/estimates[/{metric}]?window=1h&group=chrome,edge&top=10
    GET /v1/series/{metric}?window=1h&from=UNIX&to=UNIX&last=48h&merged=1&group=chrome,edge&top=10

group adds the share of the categories named to each window; top adds the share of every
category outside the window's top largest (the dashboard's "other"). A series is the window's
retained buckets overlapping [from, to) (last: from = now - last), oldest first; merged gives
one estimate of them all. Both bodies have the shape of /v1/estimates.
"""

from __future__ import annotations

import json
import math
import time

from .config import parse_duration
from .errors import ConfigError, InvalidRange, StoreError, UnknownMetric
from .live import LiveEstimates, WindowEstimate, estimates_json, with_group, with_rest

__all__ = ["estimates_answer", "series_answer"]


class _BadQuery(ValueError):
    """A query parameter that cannot be read."""


def estimates_answer(live: LiveEstimates, metric: str | None, query: dict[str, list[str]]) -> tuple[int, bytes]:
    return _answer(lambda: live.current(metric, _one(query, "window")), query)


def series_answer(live: LiveEstimates, metric: str, query: dict[str, list[str]]) -> tuple[int, bytes]:
    def read() -> list[WindowEstimate]:
        window = _one(query, "window") or ""
        start, end = _unix(query, "from"), _unix(query, "to")
        last = _one(query, "last")
        if last:
            try:
                start = time.time() - parse_duration(last, "last")
            except ConfigError as err:
                raise _BadQuery(str(err)) from None
        if _one(query, "merged") in ("1", "true", "yes"):
            return [live.merged(metric, window, start, end)]
        return live.series(metric, window, start, end)

    return _answer(read, query)


def _answer(read, query: dict[str, list[str]]) -> tuple[int, bytes]:
    try:
        found = read()
        group = [label for label in (_one(query, "group") or "").split(",") if label]
        top = _one(query, "top")
        if group:
            found = [with_group(e, group) for e in found]
        elif top:
            if not top.isdigit():
                raise _BadQuery(f"top: expected a whole number, got {top[:40]!r}.")
            # A strings metric lists what it found; its round's candidates have no "other".
            found = [e if e.metric.spec.strings is not None else with_rest(e, int(top)) for e in found]
    except UnknownMetric as err:
        return 404, _error(str(err))
    except (InvalidRange, _BadQuery) as err:
        return 400, _error(str(err))
    except StoreError:
        return 503, _error("The counter store is unavailable; try again.")
    return 200, estimates_json(found, time.time())


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _unix(query: dict[str, list[str]], name: str) -> float | None:
    text = _one(query, name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _BadQuery(f"{name}: expected Unix seconds, got {text[:40]!r}.")
    return value


def _error(message: str) -> bytes:
    return json.dumps({"error": message}, allow_nan=False).encode()
