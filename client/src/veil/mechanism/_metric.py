"""A metric: a name, its ordered category labels, the mechanism that randomizes it, and the
device's reporting rule (how often a device may report it, and how much privacy it may spend).

The reporting rule is what turns a per-report guarantee into a per-device one. A device sends at
most ``reports_per_period`` reports of the metric per reporting period (periods are aligned to the
Unix epoch in UTC: period i covers [i * period, (i + 1) * period)); the first report() calls of a
period are the ones sent, at once, and later calls in the same period are dropped on the device.
Each report that needs a new randomized response spends ``epsilon`` from the device's budget for
the period and for its lifetime (a memoized response sent again spends nothing new); a report
that would exceed either budget is dropped. The period and the number of reports per period
decide what the aggregator's estimates mean, so they are part of the fingerprint; the budgets
only cap what a device spends, so they are not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ._errors import MechanismError
from ._numeric import MEAN, NumericSpec
from ._specs import KrrSpec, MechanismSpec, SubsetSpec, fingerprint_of
from ._strings import HashedSpec, StringsRound, round_name
from ._wire import wire_shape

__all__ = ["DEFAULT_MECHANISM", "DEFAULT_PERIOD", "MAX_PERIOD", "spec_for", "MetricSpec", "parse_duration"]

DEFAULT_PERIOD = 86400  # one report per device per day, as Chrome's RAPPOR sends
MAX_PERIOD = 366 * 86400
_MAX_REPORTS_PER_PERIOD = 2**32 - 1  # a uint32 on the wire
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def parse_duration(text: object) -> int:
    """Seconds in a duration like "90s", "15m", "1h", "1d", "2w" (or a whole number of seconds):
    how periods, windows and ranges are written everywhere (config files, the CLI, HTTP)."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match or int(match.group(1)) == 0:
        raise MechanismError(f'expected a duration such as "15m", "1h" or "1d", got {text!r}.')
    return int(match.group(1)) * _UNITS[match.group(2)]


DEFAULT_MECHANISM = SubsetSpec.name


def spec_for(mechanism: str, k: int, epsilon: float) -> MechanismSpec:
    """The spec of a registered mechanism by name (one of MECHANISMS)."""
    return wire_shape(mechanism).spec(k=k, epsilon=epsilon)


@dataclass(frozen=True)
class MetricSpec:
    """What a device needs to report one metric; its fingerprint names it on the wire."""

    name: str
    labels: tuple[str, ...]
    mechanism: MechanismSpec
    period: int = DEFAULT_PERIOD  # seconds
    reports_per_period: int = 1
    # Epsilon a device may spend on this metric per period (None: what reports_per_period fresh
    # responses spend) and over its lifetime (None: no lifetime cap).
    period_budget: float | None = None
    lifetime_budget: float | None = None
    # A part of a numeric metric (revision 3): how a number becomes one of this spec's
    # categories. Its name, labels and k are then the part's (NumericSpec).
    numeric: NumericSpec | None = None
    # A round of a strings metric (revision 4): its candidates are its labels (never sent, so
    # they are derived from it), its design is HashedSpec.
    strings: StringsRound | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise MechanismError("A metric needs a non-empty name.")
        if (self.strings is not None) != isinstance(self.mechanism, HashedSpec):
            raise MechanismError(f"Metric {self.name!r}: a strings round, and only one, has the hashed design.")
        if self.strings is not None and tuple(self.labels) != self.strings.labels:
            raise MechanismError(f"Metric {self.name!r} is not labelled with its strings round's candidates.")
        if self.numeric is not None:
            numeric = self.numeric
            if self.name != numeric.name or tuple(self.labels) != numeric.labels:
                raise MechanismError(f"Metric {self.name!r} is not named and labelled as its numeric part says.")
            if numeric.part == MEAN and type(self.mechanism) is not KrrSpec:
                raise MechanismError(f"The mean part {self.name!r} is reported with k-ary randomized response.")
        labels = tuple(self.labels)
        if len(set(labels)) != len(labels) or not all(isinstance(x, str) and x for x in labels):
            raise MechanismError(f"Metric {self.name!r} needs distinct, non-empty category labels.")
        if len(labels) != self.mechanism.k:
            raise MechanismError(
                f"Metric {self.name!r} has {len(labels)} labels but its mechanism has k = {self.mechanism.k}."
            )
        object.__setattr__(self, "labels", labels)
        if not _whole(self.period) or not 1 <= self.period <= MAX_PERIOD:
            raise MechanismError(
                f"Metric {self.name!r} needs a reporting period of 1 s to 366 days, not {self.period!r}."
            )
        if not _whole(self.reports_per_period) or not 1 <= self.reports_per_period <= _MAX_REPORTS_PER_PERIOD:
            raise MechanismError(
                f"Metric {self.name!r} needs at least 1 report per period (and at most 2**32 - 1), "
                f"not {self.reports_per_period!r}."
            )
        epsilon = self.mechanism.epsilon
        for key in ("period_budget", "lifetime_budget"):
            budget = getattr(self, key)
            if budget is None:
                continue
            if (
                isinstance(budget, bool)
                or not isinstance(budget, (int, float))
                or math.isnan(budget)
                or budget < epsilon
            ):
                raise MechanismError(
                    f"Metric {self.name!r} needs a {key.replace('_', ' ')} of at least its epsilon "
                    f"({epsilon!r}), or none, not {budget!r}: a smaller one allows no report."
                )
            object.__setattr__(self, key, float(budget))

    @classmethod
    def create(
        cls,
        name: str,
        labels: Sequence[str],
        mechanism: str = DEFAULT_MECHANISM,
        epsilon: float = 1.0,
        *,
        period: int = DEFAULT_PERIOD,
        reports_per_period: int = 1,
        period_budget: float | None = None,
        lifetime_budget: float | None = None,
        numeric: NumericSpec | None = None,
    ) -> MetricSpec:
        return cls(
            name,
            tuple(labels),
            spec_for(mechanism, len(labels), epsilon),
            period,
            reports_per_period,
            period_budget,
            lifetime_budget,
            numeric,
        )

    @classmethod
    def numeric_part(
        cls, numeric: NumericSpec, mechanism: str = DEFAULT_MECHANISM, epsilon: float = 1.0, **rule: Any
    ) -> MetricSpec:
        """The spec of one part of a numeric metric (``rule``: create's period, reports_per_period
        and budgets): the mean's design is always k-RR over its rounding points; the
        distribution's is ``mechanism`` over its buckets."""
        design = KrrSpec.name if numeric.part == MEAN else mechanism
        return cls.create(numeric.name, numeric.labels, design, epsilon, numeric=numeric, **rule)

    @classmethod
    def strings_round(cls, strings: StringsRound, epsilon: float = 1.0, **rule: Any) -> MetricSpec:
        """The spec of one round of a strings metric (``rule``: create's period, reports_per_period
        and budgets): hashed over the round's candidates, named ``<metric>.r<round>``."""
        design = HashedSpec(len(strings.candidates), epsilon, strings.buckets)
        return cls(round_name(strings.metric, strings.round), strings.labels, design, strings=strings, **rule)

    @property
    def k(self) -> int:
        return self.mechanism.k

    @property
    def epsilon_per_period(self) -> float:
        """The epsilon a device may spend on this metric in one period."""
        if self.period_budget is not None:
            return self.period_budget
        return self.reports_per_period * self.mechanism.epsilon

    @property
    def epsilon_lifetime(self) -> float:
        """The epsilon a device may spend on this metric in its lifetime (inf: no cap)."""
        return math.inf if self.lifetime_budget is None else self.lifetime_budget

    def period_index(self, unix_time: float) -> int:
        """The reporting period containing a time: period i covers [i * period, (i + 1) * period)."""
        return int(unix_time // self.period)

    def canonical(self) -> dict[str, object]:
        return {
            "name": self.name,
            "labels": list(self.labels),
            **self.mechanism.canonical(),
            "period": self.period,
            "reports_per_period": self.reports_per_period,
            **({"numeric": self.numeric.canonical()} if self.numeric is not None else {}),
            **({"labels": [], "strings": self.strings.canonical()} if self.strings is not None else {}),
        }

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_of(self.canonical())

    def design_canonical(self) -> dict[str, object]:
        """A strings round's canonical with no parents (so k 0): what its reports depend on
        (docs/protocol.md section 10, the memo key), the same period after period."""
        if self.strings is None:
            raise MechanismError(f"Metric {self.name!r} is not a round of a strings metric.")
        return {**self.canonical(), "k": 0, "strings": {**self.strings.canonical(), "parents": []}}

    @cached_property
    def design(self) -> str:
        """The fingerprint of design_canonical(): the strings memo key's ``design``."""
        return fingerprint_of(self.design_canonical())

    def index(self, value: str | int) -> int:
        """The category index of a label (or of an index, checked)."""
        if isinstance(value, str):
            try:
                return self.labels.index(value)
            except ValueError:
                raise MechanismError(f"{value!r} is not a category of metric {self.name!r}.") from None
        return self.mechanism.check_value(value)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
