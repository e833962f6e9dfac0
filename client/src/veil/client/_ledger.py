"""The device's privacy ledger: per metric, the reports sent and the epsilon spent in the current
reporting period, and the epsilon spent over the device's lifetime.

report() asks the ledger before anything is randomized: a report beyond the period's allowance
(``reports_per_period``) or one that would take the period's or the lifetime's spending past its
budget is refused, and the caller drops and counts it. A report that needs a new randomized
response costs epsilon; a memoized response sent again costs nothing new (the observer learns
nothing it had not seen), but still takes one of the period's reports. A report refused for its
budget takes its place among the period's reports too, so a period never sends a later value in
place of one it could not pay for (docs/protocol.md, section 6).

Epsilon is counted exactly, in whole nano-epsilon (``units``): spending is a sum of integers,
compared with a budget in the same units (protocol.md section 6 states the rule both SDKs follow).

A period once closed never reopens: the period a metric's state belongs to is the latest one the
ledger admitted in (its high-water mark), and a report of an earlier period (a clock set back) is
refused. Clocks set ahead are bounded by the aggregator's (``_clock``).

With a queue directory the ledger lives in ``ledger.log`` (owner-only), an append-only file of
JSON lines, each the whole state of one metric after a report it admitted; the last line of a
metric wins, and the latest period of all its lines is its mark. Processes sharing the directory
are one device: each admits under an exclusive file lock after reading what the others appended,
so together they stay within the bounds. A report is admitted only once its line is written: a
ledger that cannot be written (a full disk) refuses reports (``UNWRITABLE``) and keeps no spending
it could not record. Lines are synced to disk before any report they admitted leaves the device
(the worker calls ``sync`` before it batches), so a crash can forget a spending only together
with its report. A torn last line is cut off at load. The file grows by about 100 bytes per
admitted report (one report per day of ten metrics: about 0.4 MB a year); it is never rewritten,
so no crash can lose what it holds. Without a queue directory the ledger lives in memory and a
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

__all__ = ["Ledger", "PrivacySpent", "PERIOD", "BUDGET", "UNWRITABLE", "units"]

PERIOD = "period"  # refusal reasons
BUDGET = "budget"
UNWRITABLE = "unwritable"

UNIT = 1e9  # units per epsilon
# Units are exact as doubles and survive the file's decimal epsilon (n / UNIT, read back by
# units()) below 2**51; a budget of that many units or more (2,251,799.8 epsilon) is no cap.
NO_CAP = 2**51


def units(epsilon: float) -> int:
    """Epsilon in whole nano-epsilon, rounded half up: floor(epsilon * 1e9 + 0.5), computed in
    doubles as written (the TypeScript SDK computes the very same)."""
    return math.floor(epsilon * UNIT + 0.5)


def _cap(budget: float | None) -> int | None:
    """A budget in units; None: no cap."""
    if budget is None or not budget * UNIT < NO_CAP:
        return None
    return units(budget)


@dataclass(frozen=True)
class PrivacySpent:
    """What this device has spent on one metric (epsilon), and what it may spend."""

    metric: str
    period_start: int  # Unix seconds: the current reporting period is [period_start, period_end)
    period_end: int
    reports: int  # reports of the metric admitted in this period, and those refused for their budget
    reports_per_period: int
    period_epsilon: float  # spent in this period
    period_budget: float  # the most this period may spend (the operator's, or the app's if lower)
    lifetime_epsilon: float  # spent over the device's lifetime (as long as its ledger lives)
    lifetime_budget: float  # inf: no lifetime cap


@dataclass(frozen=True)
class _State:
    period: int  # the latest period admitted in: the mark
    reports: int = 0
    period_units: int = 0
    lifetime_units: int = 0

    def line(self, metric: str) -> bytes:
        # Formatted by hand, as json.dumps would write it (floats by repr), at a third of its cost:
        # this runs in report() for every admitted report.
        return (
            f'{{"metric":{_json_string(metric)},"period":{self.period},"reports":{self.reports},'
            f'"period_epsilon":{self.period_units / UNIT!r},"lifetime_epsilon":{self.lifetime_units / UNIT!r}}}\n'
        ).encode()

    def at(self, period: int) -> _State:
        """The state in ``period``, not earlier than the mark: a new period starts afresh."""
        return self if period <= self.period else _State(period, lifetime_units=self.lifetime_units)


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
        self, spec: MetricSpec, period: int, cost: float, period_budget: float | None, lifetime_budget: float
    ) -> str | None:
        """Record one report of ``spec`` in ``period`` spending ``cost`` epsilon, or refuse it:
        PERIOD when the period's reports were sent or the period is before the mark, BUDGET when
        a budget would be exceeded (``period_budget`` None: the period's reports are its only
        bound), UNWRITABLE when the ledger cannot record it; None: admitted."""
        with self._lock:
            if self._file is None:
                refused, state = self._next(spec, period, cost, period_budget, lifetime_budget)
                self._states[spec.name] = state
                return refused
            try:
                with self._file.lock():
                    self._read_new()  # another process of this device may have spent meanwhile
                    refused, state = self._next(spec, period, cost, period_budget, lifetime_budget)
                    if state is not self._states.get(spec.name):
                        self._file.append(state.line(spec.name))
                        self._states[spec.name] = state  # only what the file holds
                    return refused
            except OSError:
                self._log.warning(
                    "ledger:write",
                    "The Veil privacy ledger cannot be written (is the queue directory's disk full?); "
                    "reports are refused until it can record their spending.",
                )
                return UNWRITABLE

    def _next(
        self, spec: MetricSpec, period: int, cost: float, period_budget: float | None, lifetime_budget: float
    ) -> tuple[str | None, _State]:
        """Why a report is refused (None: it is admitted), and the metric's state after it."""
        known = self._states.get(spec.name)
        if known is not None and period < known.period:
            self._log.warning(
                "ledger:behind",
                "The device's clock is behind a reporting period Veil already reported in; "
                "reports of earlier periods are not sent.",
            )
            return PERIOD, known
        state = _State(period) if known is None else known.at(period)
        if state.reports >= spec.reports_per_period:
            return PERIOD, state
        cost_units = units(cost)
        period_cap = _cap(period_budget)
        lifetime_cap = _cap(lifetime_budget)
        if (period_cap is not None and state.period_units + cost_units > period_cap) or (
            lifetime_cap is not None and state.lifetime_units + cost_units > lifetime_cap
        ):
            # The refused report takes its place among the period's reports: a later one of the
            # period is not sent in its stead (the estimand: the period's first values).
            return BUDGET, _State(state.period, state.reports + 1, state.period_units, state.lifetime_units)
        return None, _State(
            state.period, state.reports + 1, state.period_units + cost_units, state.lifetime_units + cost_units
        )

    def spent(self, spec: MetricSpec, now: float, period_budget: float | None, lifetime_budget: float) -> PrivacySpent:
        period = spec.period_index(now)
        with self._lock:
            if self._file is not None:
                try:
                    with self._file.lock():
                        self._read_new()  # what other processes of this device spent
                except OSError:
                    pass
        known = self._states.get(spec.name)
        state = _State(period) if known is None else known.at(period)
        period_cap = _cap(period_budget)
        return PrivacySpent(
            spec.name,
            state.period * spec.period,
            (state.period + 1) * spec.period,
            state.reports,
            spec.reports_per_period,
            state.period_units / UNIT,
            (spec.reports_per_period * units(spec.mechanism.epsilon) if period_cap is None else period_cap) / UNIT,
            state.lifetime_units / UNIT,
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
                spent = float(record["period_epsilon"]), float(record["lifetime_epsilon"])
                if not all(map(math.isfinite, spent)):
                    raise ValueError
                state = _State(int(record["period"]), int(record["reports"]), *map(units, spent))
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
        # spending: keep the later period (the mark), and the larger lifetime spending.
        known = self._states.get(metric)
        if known is not None and (known.period > state.period or known.lifetime_units > state.lifetime_units):
            later = known if known.period > state.period else state
            state = _State(
                later.period, later.reports, later.period_units, max(known.lifetime_units, state.lifetime_units)
            )
        self._states[metric] = state
