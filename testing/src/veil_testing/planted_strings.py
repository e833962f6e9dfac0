"""A strings metric's verification round over devices holding planted values, computed for real:
each device's report made with HashedSpec.randomize_prefix, the reports counted with
discovery.count_hashed, the round estimated and its discovery made, all as the WindowEstimate
the aggregator serves (docs/protocol.md 10)."""

from __future__ import annotations

import math

import numpy as np

from veil.aggregator.config import MetricConfig, Window
from veil.aggregator.counts import Counts
from veil.aggregator.discovery import count_hashed, discovered
from veil.aggregator.estimate import estimate
from veil.aggregator.live import WindowEstimate
from veil.mechanism import ROUNDS, MetricSpec, SeededRandomSource, StringsRound, buckets_for, string_code

__all__ = ["DAY", "PLANTED", "strings_round", "verified", "withheld"]

DAY = Window("1d", 86400, 7 * 86400)
START = 1_790_000_000 // 86400 * 86400  # a period's start (Unix seconds)
# Frequent values and their shares of the devices: a short value, one with a character that is not
# ASCII, and one of more than CODE_BYTES (6) bytes (shown by its hash); the rest of the devices hold
# values of their own, none of them a candidate.
PLANTED = {"SIGBUS": 0.30, "hang": 0.18, "NullPointerException at Foo.bar": 0.12, "é": 0.06}
ABSENT = ("never", "OOM at Baz.qux(Baz.java:12)")  # candidates no device holds


def strings_round(metric: str = "crash_signature", epsilon: float = 4.0) -> MetricSpec:
    """The verification round (round ROUNDS - 1) over the planted values' codes and the absent ones'."""
    codes = tuple(string_code(v) for v in (*PLANTED, *ABSENT))
    strings = StringsRound(metric, ROUNDS - 1, buckets_for(math.exp(epsilon)), codes)
    return MetricSpec.strings_round(strings, epsilon, period=DAY.span)


def verified(n: int = 4000, seed: int = 7, metric: str = "crash_signature", epsilon: float = 4.0) -> WindowEstimate:
    """The round's estimate from n devices, PLANTED's shares of them holding its values (reports
    seeded), with what it found, in a 1d bucket."""
    spec = strings_round(metric, epsilon)
    assert spec.strings is not None
    source = SeededRandomSource(seed)
    # Exactly these shares of the n devices (the estimand: a share of the devices that answered).
    held = [value for value, share in PLANTED.items() for _ in range(round(share * n))]
    codes = [string_code(value) for value in held] + [string_code(f"rare {i}") for i in range(n - len(held))]
    reports = np.array([spec.mechanism.randomize_prefix(spec.strings.prefix_of(c), source) for c in codes], np.uint32)
    counts = Counts.zeros(spec.mechanism)
    assert count_hashed(spec, reports, counts) == -1
    e = estimate(spec.mechanism, counts, project=True)
    return WindowEstimate(
        MetricConfig(spec, (DAY,)),
        DAY,
        START,
        START + 86400,
        1,
        e.n,
        e,
        "",
        estimand=f"share of devices by their value of {metric} in the 1-day period",
        strings=discovered(spec, e),
    )


def withheld(metric: str = "crash_signature") -> WindowEstimate:
    """The round's estimate withheld (too few reports): no estimate and no discovery."""
    spec = strings_round(metric)
    reason = "12 reports so far; estimates are shown from 100"
    return WindowEstimate(MetricConfig(spec, (DAY,)), DAY, START, START + 86400, 1, 12, None, reason)
