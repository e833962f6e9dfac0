"""The device's privacy ledger: per metric, the reports sent and the epsilon spent in the current
reporting period, and the epsilon spent over the device's lifetime.

report() asks the ledger before anything is randomized: a report beyond the period's allowance
(``reports_per_period``) or one that would take the period's or the lifetime's spending past its
budget is refused, and the caller drops and counts it. A report that needs a new randomized
response costs epsilon; a memoized response sent again costs nothing new (the observer learns
nothing it had not seen), but still takes one of the period's reports.

With a queue directory the ledger lives in ``ledger.log`` (owner-only), an append-only file of
JSON lines, each the whole state of one metric after a report it admitted; the last line of a
metric wins. Processes sharing the directory are one device: each admits under an exclusive
file lock after reading what the others appended, so together they stay within the bounds.
Lines are synced to disk before any report they admitted leaves the device (the worker calls
``sync`` before it batches), so a crash can forget a spending only together with its report.
A torn last line is cut off at load. The file grows by about 100 bytes per admitted report (one
report per day of ten metrics: about 0.4 MB a year); it is never rewritten, so no crash can
lose what it holds. Without a queue directory the ledger lives in memory and a
new process starts a new one.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from veil.mechanism import MetricSpec

from ._fs import DeviceFileOwner, DeviceLog
from ._log import LogOnce

__all__ = ["Ledger", "PrivacySpent", "PERIOD", "BUDGET"]

PERIOD = "period"  # refusal reasons
BUDGET = "budget"
# Spending compares with a little slack: ten reports of epsilon 0.1 must fit a budget of 1.0
# although their float sum is 0.9999999999999999 + 0.1.
_SLACK = 1e-9


@dataclass(frozen=True)
class PrivacySpent:
    """What this device has spent on one metric (epsilon), and what it may spend."""

    metric: str
    period_start: int  # Unix seconds: the current reporting period is [period_start, period_end)
    period_end: int
    reports: int  # reports of the metric admitted in this period
    reports_per_period: int
    period_epsilon: float  # spent in this period
    period_budget: float  # the most this period may spend (the operator's, or the app's if lower)
    lifetime_epsilon: float  # spent over the device's lifetime (as long as its ledger lives)
    lifetime_budget: float  # inf: no lifetime cap


@dataclass
class _State:
    period: int
    reports: int = 0
    period_epsilon: float = 0.0
    lifetime_epsilon: float = 0.0

    def line(self, metric: str) -> bytes:
        # Formatted by hand, as json.dumps would write it (floats by repr), at a third of its cost:
        # this runs in report() for every admitted report.
        return (
            f'{{"metric":{_json_string(metric)},"period":{self.period},"reports":{self.reports},'
            f'"period_epsilon":{self.period_epsilon!r},"lifetime_epsilon":{self.lifetime_epsilon!r}}}\n'
        ).encode()

    def moved_to(self, period: int) -> _State:
        return self if period == self.period else _State(period, lifetime_epsilon=self.lifetime_epsilon)


@functools.lru_cache(maxsize=256)
def _json_string(text: str) -> str:
    return json.dumps(text)


class Ledger(DeviceFileOwner):
    FILE = "ledger.log"
    _KIND, _WHAT = "ledger", "The Veil privacy ledger"
    _IN_MEMORY = "it lives in memory in this process."

    def __init__(self, directory: Path | None, log: LogOnce) -> None:
        super().__init__(log)
        self._states: dict[str, _State] = {}
        if directory is not None:
            try:
                self._file = DeviceLog(directory / self.FILE)
                with self._file.lock():
                    self._read_new()
            except OSError:
                log.warning(
                    "ledger:open",
                    "The Veil privacy ledger cannot be kept under the queue directory; it "
                    "lives in memory, and a restart starts a new one.",
                )
                self._close()

    # --- report()'s questions ---------------------------------------------------------------

    def full(self, metric: str, period: int, reports_per_period: int) -> bool:
        """The lock-free early answer: True when this period's reports were all sent already."""
        state = self._states.get(metric)
        return state is not None and state.period == period and state.reports >= reports_per_period

    def admit(
        self, spec: MetricSpec, period: int, cost: float, period_budget: float, lifetime_budget: float
    ) -> str | None:
        """Record one report of ``spec`` in ``period`` spending ``cost``, or refuse it: PERIOD when
        the period's reports were sent, BUDGET when a budget would be exceeded; None: admitted."""
        with self._lock:
            if self._file is None:
                return self._admit(spec, period, cost, period_budget, lifetime_budget)
            try:
                with self._file.lock():
                    self._read_new()  # another process of this device may have spent meanwhile
                    refused = self._admit(spec, period, cost, period_budget, lifetime_budget)
                    if refused is None:
                        self._file.append(self._states[spec.name].line(spec.name))
                    return refused
            except OSError:
                self._log.warning(
                    "ledger:write",
                    "The Veil privacy ledger cannot be written; refusing reports whose spending it cannot record.",
                )
                return BUDGET

    def _admit(
        self, spec: MetricSpec, period: int, cost: float, period_budget: float, lifetime_budget: float
    ) -> str | None:
        state = self._states.get(spec.name, _State(period)).moved_to(period)
        if period < state.period:  # the clock went back: count against the later period
            state = self._states[spec.name]
        if state.reports >= spec.reports_per_period:
            return PERIOD
        if cost > 0 and (
            state.period_epsilon + cost > period_budget * (1 + _SLACK)
            or state.lifetime_epsilon + cost > lifetime_budget * (1 + _SLACK)
        ):
            return BUDGET
        self._states[spec.name] = _State(
            state.period, state.reports + 1, state.period_epsilon + cost, state.lifetime_epsilon + cost
        )
        return None

    def spent(self, spec: MetricSpec, now: float, period_budget: float, lifetime_budget: float) -> PrivacySpent:
        period = spec.period_index(now)
        with self._lock:
            if self._file is not None:
                try:
                    with self._file.lock():
                        self._read_new()  # what other processes of this device spent
                except OSError:
                    pass
        state = self._states.get(spec.name, _State(period)).moved_to(period)
        return PrivacySpent(
            spec.name,
            state.period * spec.period,
            (state.period + 1) * spec.period,
            state.reports,
            spec.reports_per_period,
            state.period_epsilon,
            period_budget,
            state.lifetime_epsilon,
            lifetime_budget,
        )

    # --- the file ----------------------------------------------------------------------------

    def _read_new(self) -> None:
        assert self._file is not None
        data = self._file.unread()
        position = 0
        while (end := data.find(b"\n", position)) >= 0:
            try:
                record = json.loads(data[position:end])
                state = _State(
                    int(record["period"]),
                    int(record["reports"]),
                    float(record["period_epsilon"]),
                    float(record["lifetime_epsilon"]),
                )
                if not all(map(math.isfinite, (state.period_epsilon, state.lifetime_epsilon))):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                break
            self._merge(str(record["metric"]), state)
            position = end + 1
        self._file.offset += position
        if position < len(data):
            self._log.warning("ledger:torn", "Cutting a torn line off the Veil privacy ledger.")
            self._file.cut(self._file.offset)

    def _merge(self, metric: str, state: _State) -> None:
        # Lines come in the order they were admitted, but a clock set back must never undo a
        # spending: keep the later period, and the larger lifetime spending.
        known = self._states.get(metric)
        if known is not None and (known.period > state.period or known.lifetime_epsilon > state.lifetime_epsilon):
            state = _State(
                max(known.period, state.period),
                known.reports if known.period > state.period else state.reports,
                known.period_epsilon if known.period > state.period else state.period_epsilon,
                max(known.lifetime_epsilon, state.lifetime_epsilon),
            )
        self._states[metric] = state
