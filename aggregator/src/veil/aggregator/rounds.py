"""The rounds of every strings metric, period by period (docs/protocol.md 10).

In period t a strings metric serves round 0 (the first byte of every code) and each round r of 1
to ROUNDS - 1 (6) whose parents survived round r - 1 in period t - 1. Those parents follow from
counts that stopped changing when period t - 1 ended (a round's batches made in another period
are refused), so every process of the aggregator, and the same process after a restart, derives
the same rounds from the store: nothing about them is kept anywhere else. Writes admitted just
before a period ended may still be landing as it begins, so the later rounds are fixed only
`settle` seconds into the period (a tenth of it, at most 10 s); until then round 0 is served alone.

A round's spec for a past period is cached once made (its counts are final); a period's rounds
need at most ROUNDS - 1 (six) reads when the period begins, each of one bucket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from veil.mechanism import ROUNDS

from .config import AggregatorConfig, MetricConfig, StringsConfig
from .discovery import first_round, next_round
from .estimate import estimate
from .store import CountsKey, Store

__all__ = ["Rounds", "settle_seconds"]

_MAX_SETTLE = 10


def settle_seconds(period: int) -> int:
    """How long into a period its later rounds are fixed: writes admitted before the period
    ended have landed by then."""
    return min(period // 10, _MAX_SETTLE)


def _period_at(s: StringsConfig, now: float) -> tuple[int, bool]:
    """The period of `s` holding `now`, and whether its later rounds are fixed by then."""
    period = int(now // s.period)
    return period, now - period * s.period >= settle_seconds(s.period)


class Rounds:
    """The round specs each strings metric serves at a time, derived from the store's counts."""

    def __init__(self, config: AggregatorConfig, store: Store, clock: Callable[[], float] = time.time) -> None:
        self._strings = {s.name: s for s in config.strings}
        self._owner = {name: s for s in config.strings for name in s.round_names}
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        # (metric, period index, round) -> the round's MetricConfig, or None when it had no parents.
        self._made: dict[tuple[str, int, int], MetricConfig | None] = {}

    @property
    def metrics(self) -> tuple[StringsConfig, ...]:
        return tuple(self._strings.values())

    def owner(self, name: str) -> StringsConfig | None:
        """The strings metric a round's wire name belongs to (None: not a round)."""
        return self._owner.get(name)

    def epoch(self, now: float) -> tuple[tuple[int, bool], ...]:
        """What the served rounds depend on at `now`: per strings metric, its period and whether
        that period's later rounds are fixed yet. The rounds change exactly when this does."""
        return tuple(_period_at(s, now) for s in self._strings.values())

    def current(self, now: float) -> tuple[MetricConfig, ...]:
        """Every round served at `now`, metric by metric, round by round."""
        served = []
        for s in self._strings.values():
            period, settled = _period_at(s, now)
            for r in range(ROUNDS if settled else 1):
                metric = self.round(s, period, r)
                if metric is not None:
                    served.append(metric)
        return tuple(served)

    def round(self, s: StringsConfig, period: int, round_index: int) -> MetricConfig | None:
        """Round `round_index` of `s` in period `period` (None when it has no parents). Asked of a
        period after the one before has ended: its parents come from that period's counts."""
        if round_index == 0:
            return s.round_config(first_round(s.name, s.buckets))
        key = (s.name, period, round_index)
        with self._lock:
            if key in self._made:
                return self._made[key]
        before = self.round(s, period - 1, round_index - 1)
        made = None
        if before is not None:
            counts = self._store.read(
                self.key(before, period - 1), before.spec.mechanism.estimator.weights, before.spec.k
            )
            following = next_round(before.spec, estimate(before.spec.mechanism, counts), s.survivors)
            made = None if following is None else s.round_config(following)
        if _period_at(s, self._clock()) < (period, True):
            return made  # the period before may still be landing: not final, so not kept
        with self._lock:
            for old in [k for k in self._made if k[1] < period - 2 * ROUNDS]:
                del self._made[old]  # far older than any round or estimate asks for
            self._made.setdefault(key, made)
            return self._made[key]

    @staticmethod
    def key(metric: MetricConfig, period: int) -> CountsKey:
        """Where a round's counts of one period are: its one window's bucket of that period."""
        window = metric.windows[0]
        assert window.span is not None
        return CountsKey(metric.name, metric.spec.fingerprint, window.name, period * window.span)
