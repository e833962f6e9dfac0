"""A strings metric's estimates as served (docs/protocol.md 10): what its verification round
found (veil.aggregator.discovery.Discovery) as the JSON of /v1/estimates, as the StringsEstimate
message, and as /metrics gauges.

A strings metric is served under its own name, not its round's ("crash_signature", not
"crash_signature.r6"), with no categories: the round's candidates are codes chosen by the
rounds before, and only those above the detection floor mean anything (the floor says what
could not have been found). /metrics is bounded like the categories: per metric and window the
``top`` largest values (each with its standard error and selective 95% interval), and the
floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2

from .discovery import Discovery

__all__ = ["metric_name", "strings_json", "strings_message", "StringsGauges"]

_NUMBERS = ("estimate", "stderr", "lower", "upper")


def metric_name(spec: MetricSpec) -> str:
    """The name an estimate is served under: a strings round's metric, else the spec's own."""
    return spec.name if spec.strings is None else spec.strings.metric


def strings_json(found: Discovery | None) -> dict[str, object]:
    """The "strings" key of a strings metric's estimate (none when there is no discovery: another
    kind of metric, or withheld): the values largest first, the floor, candidates and n."""
    if found is None:
        return {}
    values = [
        {"code": v.code.hex(), "text": v.text, **{x: _finite(getattr(v, x)) for x in _NUMBERS}} for v in found.values
    ]
    return {"strings": {"values": values, "floor": _finite(found.floor), "candidates": found.candidates, "n": found.n}}


def strings_message(found: Discovery | None) -> veil_pb2.StringsEstimate | None:
    """WindowEstimate.strings (field 21); None leaves it out."""
    if found is None:
        return None
    return veil_pb2.StringsEstimate(
        values=[
            veil_pb2.DiscoveredValue(
                code=v.code, text=v.text, estimate=v.estimate, stderr=v.stderr, lower=v.lower, upper=v.upper
            )
            for v in found.values
        ],
        floor=found.floor,
        candidates=found.candidates,
        n=found.n,
    )


def _finite(x: float) -> float | None:
    """JSON has no NaN: an undefined number (a floor of no reports) is null."""
    return x if math.isfinite(x) else None


class StringsGauges:
    """The /metrics gauges of strings metrics' estimates: veil_strings_share{metric, window,
    value} (the value's text) with _stderr, _lower and _upper, for the ``top`` largest values
    of each, and veil_strings_floor{metric, window}."""

    def __init__(self, top: int) -> None:
        self._top = top
        labels = ["metric", "window", "value"]
        self._share = [
            GaugeMetricFamily("veil_strings_share", "Unbiased estimate of a found value's share.", labels=labels),
            GaugeMetricFamily("veil_strings_share_stderr", "Standard error of veil_strings_share.", labels=labels),
            GaugeMetricFamily(
                "veil_strings_share_lower",
                "Lower end of veil_strings_share's selective 95% interval (allowing for the value "
                "having been found because its estimate cleared the floor).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "veil_strings_share_upper", "Upper end of veil_strings_share's selective 95% interval.", labels=labels
            ),
        ]
        self._floor = GaugeMetricFamily(
            "veil_strings_floor",
            "Detection floor of a strings metric: a value with a smaller share cannot be found.",
            labels=["metric", "window"],
        )

    def add(self, window: str, found: Discovery) -> None:
        """A strings metric's discovery in a window: its top values and its floor."""
        self._floor.add_metric([found.metric, window], found.floor)
        seen: set[str] = set()
        for v in found.values[: self._top]:  # largest first
            # Two codes can show as the same text (a byte that is not UTF-8, and its escape
            # spelt out): the larger keeps the series, as two series may not share labels.
            if v.text in seen:
                continue
            seen.add(v.text)
            for family, x in zip(self._share, (v.estimate, v.stderr, v.lower, v.upper)):
                family.add_metric([found.metric, window, v.text], x)

    def families(self) -> Iterator[GaugeMetricFamily]:
        yield from self._share
        yield self._floor
