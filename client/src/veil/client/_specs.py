"""Metric specs from the aggregator: rebuilt, checked against their fingerprint, cached.

Every spec the aggregator sends is rebuilt as a ``veil.mechanism.MetricSpec`` from its name,
labels, mechanism, epsilon, reporting period, reports per period and budgets (and its numeric
part, or its strings round: HASHED, labels derived from the round's parents); its recomputed
fingerprint (and q) must equal the aggregator's, or the spec is refused (a device never
randomizes under a spec it cannot reproduce). With a queue directory the last response is kept
on disk, so a restart without the network still knows its specs; a cached spec past its TTL is
still used while fetching fails.

Revision 2: the response names its version (``version``); the worker asks again with it
(``if_version``), and an ``unchanged`` answer keeps the specs held and costs the aggregator
almost nothing. Each answer also carries the aggregator's clock: ``server_now()`` is that clock
now (its time plus the time elapsed since the answer, sleep included), what the ledger bounds the
device's clock by; None until an answer of this process said it (a cached response's time is
stale).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from veil.mechanism import (
    DEFAULT_PERIOD,
    DISTRIBUTION,
    MEAN,
    PARTS,
    HashedSpec,
    MechanismError,
    MetricSpec,
    NumericSpec,
    StringsRound,
    wire_shape,
    wire_shape_of,
)
from veil.wire.v1 import veil_pb2

from ._fs import write_atomic
from ._log import LogOnce, logger

__all__ = ["SpecCache", "spec_from_proto", "spec_to_proto", "numeric_to_proto", "strings_to_proto"]


def spec_from_proto(message: veil_pb2.MetricSpec) -> MetricSpec:
    """The MetricSpec a proto describes; MechanismError when it is invalid or its fingerprint
    or q is not the one this device computes."""
    rule: dict[str, Any] = {
        "period": message.period_seconds or DEFAULT_PERIOD,
        "reports_per_period": message.reports_per_period or 1,
        "period_budget": message.period_budget or None,
        "lifetime_budget": message.lifetime_budget or None,
    }
    if message.HasField("strings"):
        # HASHED is derived for a strings metric's rounds alone, never a registered mechanism.
        if message.mechanism != HashedSpec.proto or message.labels or message.HasField("numeric"):
            raise MechanismError(f"Metric {message.name!r} is a strings round that is not hashed over its parents.")
        spec = MetricSpec.strings_round(_strings_from_proto(message.strings), message.epsilon, **rule)
    else:
        try:
            mechanism = wire_shape_of(message.mechanism).name
        except MechanismError:
            raise MechanismError(f"Metric {message.name!r} names an unknown mechanism.") from None
        spec = MetricSpec.create(
            message.name,
            tuple(message.labels),
            mechanism,
            message.epsilon,
            numeric=_numeric_from_proto(message) if message.HasField("numeric") else None,
            **rule,
        )
    if spec.fingerprint != message.fingerprint or (spec.mechanism.q or 0) != message.q:
        raise MechanismError(f"Metric {message.name!r} has a fingerprint this device does not reproduce.")
    return spec


_PARTS = {veil_pb2.NUMERIC_MEAN: MEAN, veil_pb2.NUMERIC_DISTRIBUTION: DISTRIBUTION}


def _numeric_from_proto(message: veil_pb2.MetricSpec) -> NumericSpec:
    numeric = message.numeric
    part = _PARTS.get(numeric.part)
    if part is None:
        raise MechanismError(f"Metric {message.name!r} is a part of a numeric metric this device does not know.")
    return NumericSpec(numeric.metric, part, numeric.low, numeric.high, tuple(numeric.boundaries), numeric.levels)


def _strings_from_proto(strings: veil_pb2.StringsRound) -> StringsRound:
    return StringsRound(strings.metric, strings.round, strings.buckets, tuple(strings.parents), strings.rounds)


def strings_to_proto(strings: StringsRound) -> veil_pb2.StringsRound:
    """The proto of a strings metric's round (a round's spec carries it)."""
    return veil_pb2.StringsRound(
        metric=strings.metric,
        round=strings.round,
        rounds=strings.rounds,
        buckets=strings.buckets,
        parents=strings.parents,
    )


def numeric_to_proto(numeric: NumericSpec) -> veil_pb2.NumericSpec:
    """The proto of a numeric metric's part (specs and estimates carry it)."""
    part = next(value for value, name in _PARTS.items() if name == numeric.part)
    return veil_pb2.NumericSpec(
        metric=numeric.metric,
        part=part,
        low=numeric.low,
        high=numeric.high,
        boundaries=numeric.boundaries,
        levels=numeric.levels,
    )


def spec_to_proto(spec: MetricSpec) -> veil_pb2.MetricSpec:
    """The proto of a spec, as the aggregator serves it."""
    # An enum value, maybe one this proto's enum does not name (proto3 keeps it): protoc's .pyi
    # types enum values as the enum.
    design = spec.mechanism
    mechanism = cast(
        veil_pb2.Mechanism, design.proto if isinstance(design, HashedSpec) else wire_shape(design.name).proto
    )
    return veil_pb2.MetricSpec(
        name=spec.name,
        labels=() if spec.strings is not None else spec.labels,  # a round's candidates are never listed
        mechanism=mechanism,
        epsilon=spec.mechanism.epsilon,
        q=spec.mechanism.q or 0,
        fingerprint=spec.fingerprint,
        period_seconds=spec.period,
        reports_per_period=spec.reports_per_period,
        period_budget=spec.period_budget or 0.0,
        lifetime_budget=spec.lifetime_budget or 0.0,
        numeric=None if spec.numeric is None else numeric_to_proto(spec.numeric),
        strings=None if spec.strings is None else strings_to_proto(spec.strings),
    )


def _elapsed() -> float:
    """Seconds on a clock no one can set that keeps counting while the device sleeps: a phone
    asleep overnight must not wake in yesterday (the aggregator's time is the bound's, moved on
    by this clock). Linux and Android have CLOCK_BOOTTIME; elsewhere the monotonic clock."""
    return time.clock_gettime(_BOOT_CLOCK) if _BOOT_CLOCK is not None else time.monotonic()


_BOOT_CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)


class SpecCache:
    """The specs this device may report under. ``specs`` is replaced whole on every update,
    so report() reads it without a lock."""

    FILE = "specs.pb"

    def __init__(self, directory: Path | None, log: LogOnce, elapsed: Callable[[], float] | None = None) -> None:
        self._path = directory / self.FILE if directory is not None else None
        self._elapsed = elapsed or _elapsed  # seconds on a clock that only moves as time passes
        self._log = log
        self.specs: Mapping[str, MetricSpec] = {}
        # What report() needs, replaced whole with `specs`: a metric of categories by name ->
        # (spec, label -> index); a numeric metric by name -> its parts (mean first).
        self.entries: Mapping[str, tuple[MetricSpec, Mapping[str, int]]] = {}
        self.numeric: Mapping[str, tuple[tuple[MetricSpec, NumericSpec], ...]] = {}
        # A strings metric by name -> its rounds served now, by round.
        self.strings: Mapping[str, Mapping[int, MetricSpec]] = {}
        self.refused: frozenset[str] = frozenset()
        self.max_batch: int | None = None  # the most reports per upload the aggregator accepts, if it says
        self.fetched_at: float | None = None  # Unix time of the response in use
        self.version = ""  # the aggregator's specs_version of the response in use ("" : not said)
        # fingerprint -> the granularity (seconds) of made_unix: time_resolution_seconds or the period
        self.resolutions: Mapping[str, int] = {}
        self.max_lateness: int | None = None  # seconds after a slot's end the aggregator still counts it
        # (server_time_unix, self._elapsed() when it arrived), from the last answer that said it
        self.server_time: tuple[int, float] | None = None
        self.ready = threading.Event()  # set once specs have been obtained (disk or network)

    def server_now(self) -> float | None:
        """The aggregator's clock now (Unix seconds), as its last answer in this process said it
        and time has passed since; None when no answer said it."""
        said = self.server_time
        return None if said is None else said[0] + (self._elapsed() - said[1])

    def answered_at(self) -> int | None:
        """The aggregator's clock (Unix seconds) when its last answer in this process confirmed
        the specs held (a full or an ``unchanged`` one); None before any said it."""
        said = self.server_time
        return None if said is None else said[0]

    def resolution(self, spec: MetricSpec) -> int:
        """The granularity, in seconds, of when ``spec``'s reports were made (made_unix)."""
        return self.resolutions.get(spec.fingerprint) or spec.period

    def load(self) -> None:
        """Read the cached response from disk, if any (never raises)."""
        if self._path is None:
            return
        try:
            data = self._path.read_bytes()
            fetched_at = self._path.stat().st_mtime
            response = veil_pb2.GetMetricSpecsResponse.FromString(data)
        except FileNotFoundError:
            return
        except Exception:  # noqa: BLE001 (unreadable or corrupt: the network will tell)
            self._log.warning("specs:disk", "The cached Veil metric specs cannot be read; waiting for the aggregator.")
            return
        self._install(response, fetched_at)

    def update(self, response: veil_pb2.GetMetricSpecsResponse) -> None:
        """Install a fresh response from the aggregator and keep it on disk; an ``unchanged``
        one keeps the specs held."""
        if response.server_time_unix:
            self.server_time = (response.server_time_unix, self._elapsed())
        if response.max_lateness_seconds:
            self.max_lateness = response.max_lateness_seconds
        if response.unchanged:
            self.fetched_at = time.time()
            return
        self._install(response, time.time())
        if self._path is not None:
            try:
                write_atomic(self._path, response.SerializeToString())
            except OSError:
                self._log.warning("specs:save", "The Veil metric specs cannot be saved under the queue directory.")

    def _install(self, response: veil_pb2.GetMetricSpecsResponse, fetched_at: float) -> None:
        specs: dict[str, MetricSpec] = {}
        refused: set[str] = set()
        for message in response.specs:
            try:
                specs[message.name] = spec_from_proto(message)
            except (MechanismError, ValueError):
                refused.add(message.name)
                if message.HasField("numeric"):  # the metric apps report it under
                    refused.add(message.numeric.metric)
                if message.HasField("strings"):
                    refused.add(message.strings.metric)
                self._log.warning(
                    f"specs:refused:{message.name}:{message.fingerprint}",
                    "Refusing the aggregator's spec of metric %r: it does not match its fingerprint "
                    "or is invalid; its reports are dropped.",
                    message.name,
                )
        self.resolutions = {
            message.fingerprint: message.time_resolution_seconds
            for message in response.specs
            if message.name in specs and message.time_resolution_seconds
        }
        numeric: dict[str, list[tuple[MetricSpec, NumericSpec]]] = {}
        strings: dict[str, dict[int, MetricSpec]] = {}
        for spec in specs.values():
            if spec.numeric is not None:
                numeric.setdefault(spec.numeric.metric, []).append((spec, spec.numeric))
            if spec.strings is not None:
                strings.setdefault(spec.strings.metric, {})[spec.strings.round] = spec
        self.entries = {
            name: (spec, {label: i for i, label in enumerate(spec.labels)})
            for name, spec in specs.items()
            if spec.numeric is None and spec.strings is None
        }
        self.numeric = {
            name: tuple(sorted(parts, key=lambda part: PARTS.index(part[1].part))) for name, parts in numeric.items()
        }
        self.strings = strings
        self.specs = specs
        self.refused = frozenset(refused)
        self.max_batch = response.max_batch or None
        self.version = response.specs_version
        self.max_lateness = response.max_lateness_seconds or self.max_lateness
        self.fetched_at = fetched_at
        if not self.ready.is_set():
            logger.info("Veil knows %d metric spec(s).", len(specs))
        self.ready.set()
