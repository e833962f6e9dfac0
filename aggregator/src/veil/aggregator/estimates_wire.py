"""The estimates on the wire: EstimatesResponse bytes written by hand, and cached.

A response of k = 1024 categories over 3 windows is some 3000 CategoryEstimate messages:
built one message at a time it takes longer than the estimates themselves. So the wire bytes
of the categories are written by one numba kernel from the estimate's arrays (every record a
prefix that depends only on the label and on how many of its numbers are non-zero, cached per
label set, then the tagged numbers), and cached per window bucket and version. The bytes are exactly what
SerializeToString writes for the message the fields describe (tests compare them): fields in
number order, proto3 defaults (0.0, "", false) left out, an undefined number as NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import cast

import numpy as np

from veil.client import numeric_to_proto
from veil.mechanism import HashedSpec, wire_shape
from veil.wire.v1 import veil_pb2

from . import _kernels
from .live import WindowEstimate
from .store import Version
from .strings_estimates import metric_name, strings_message

__all__ = ["ResponseCache", "encode_categories", "encode_window", "estimates_field", "warm_up"]

_NUMBERS = ("estimate", "stderr", "lower", "upper", "projected")  # CategoryEstimate fields 2..6
_NUMBER_TAGS = np.array([(field << 3) | 1 for field in range(2, 7)], np.uint8)  # 64-bit wire type
_CATEGORY_TAG = (11 << 3) | 2  # WindowEstimate.categories: length-delimited
_ESTIMATES_TAG = (1 << 3) | 2  # EstimatesResponse.estimates: length-delimited
_NUMBER_BYTES = 1 + 8  # tag and double


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


class _Prefixes:
    """For each category j and each count c of non-zero numbers, the bytes of its record before
    the numbers (tag, length, label), padded into one array: bytes[c, j, :length[c, j]]."""

    def __init__(self, labels: tuple[str, ...]) -> None:
        label_fields = [_field(0x0A, label.encode()) if label else b"" for label in labels]
        rows = [
            [bytes((_CATEGORY_TAG,)) + _varint(len(f) + _NUMBER_BYTES * c) + f for f in label_fields]
            for c in range(len(_NUMBERS) + 1)
        ]
        width = max(len(b) for row in rows for b in row)
        self.length = np.array([[len(b) for b in row] for row in rows], np.int64)
        self.bytes = np.zeros((len(rows), len(labels), width), np.uint8)
        for c, row in enumerate(rows):
            for j, b in enumerate(row):
                self.bytes[c, j, : len(b)] = np.frombuffer(b, np.uint8)


@functools.lru_cache(maxsize=256)
def _prefixes(labels: tuple[str, ...]) -> _Prefixes:
    return _Prefixes(labels)


def encode_categories(labels: tuple[str, ...], columns: Sequence[np.ndarray]) -> bytes:
    """The repeated WindowEstimate.categories field (field 11) of the categories with these
    labels and the five number columns (estimate, stderr, lower, upper, projected) as
    SerializeToString writes it; a number that is not finite goes as NaN."""
    k = len(labels)
    numbers = np.empty((k, len(_NUMBERS)), np.float64)
    for i, column in enumerate(columns):
        numbers[:, i] = column
    prefixes = _prefixes(labels)
    out = np.empty(k * (prefixes.bytes.shape[2] + _NUMBER_BYTES * len(_NUMBERS)), np.uint8)
    size = _kernels.encode_categories(numbers, _NUMBER_TAGS, prefixes.bytes, prefixes.length, out)
    return out[:size].tobytes()


def warm_up() -> None:
    """Compile, or load from numba's cache, the encoder's kernel and the estimator's
    (EstimatesService does)."""
    encode_categories(("a", "b"), [np.array([0.5, np.nan])] * len(_NUMBERS))
    _kernels.score_intervals(np.zeros((1, 1)), np.zeros(1), np.ones(1), 1.0, 0.5, 2.0, *np.zeros((3, 1, 1)))
    _kernels.simplex_projections(*np.zeros((2, 1, 1)))


def estimates_field(e: WindowEstimate) -> bytes:
    """One EstimatesResponse.estimates field (field 1): a response is these, joined."""
    return _field(_ESTIMATES_TAG, encode_window(e))


def encode_window(e: WindowEstimate) -> bytes:
    """One WindowEstimate message, serialized exactly as the message SerializeToString would."""
    spec = e.metric.spec
    # A strings round's design is never declared, so it is no registered mechanism (wire_shape).
    mechanism = HashedSpec.proto if spec.strings is not None else wire_shape(spec.mechanism.name).proto
    head = veil_pb2.WindowEstimate(
        metric=metric_name(spec),
        window=e.window.name,
        start_unix=e.start,
        end_unix=e.end,
        n=e.n,
        mechanism=cast(veil_pb2.Mechanism, mechanism),  # protoc's .pyi: no int
        epsilon=spec.mechanism.epsilon,
        spec_fingerprint=spec.fingerprint,
        withheld=e.withheld,
        reason=e.reason,
    ).SerializeToString()
    group = (
        None
        if e.group is None
        else veil_pb2.GroupEstimate(
            labels=e.group.labels,
            estimate=e.group.estimate,
            stderr=e.group.stderr,
            lower=e.group.lower,
            upper=e.group.upper,
        )
    )
    tail = veil_pb2.WindowEstimate(
        estimand=e.estimand,
        reports_per_device=e.reports_per_device,
        period_seconds=spec.period,
        group=group,
        provisional=e.provisional,
        periods=e.periods,
        numeric=None if spec.numeric is None else numeric_to_proto(spec.numeric),
        mean=None
        if e.mean is None
        else veil_pb2.MeanEstimate(
            estimate=e.mean.estimate, stderr=e.mean.stderr, lower=e.mean.lower, upper=e.mean.upper
        ),
        quantiles=[
            veil_pb2.QuantileEstimate(q=x.q, estimate=x.estimate, lower=x.lower, upper=x.upper) for x in e.quantiles
        ],
        strings=strings_message(e.strings),
    ).SerializeToString()
    if e.estimate is None or spec.strings is not None:  # a strings metric has no categories
        return head + tail
    est = e.estimate
    assert est.projection is not None  # live estimates are always projected
    # Fields go in number order: 1..10, then 11 (the categories), then 12..21.
    return (
        head + encode_categories(spec.labels, (est.estimate, est.stderr, est.lower, est.upper, est.projection)) + tail
    )


class ResponseCache:
    """Serialized EstimatesResponse messages of recent requests, and each window's encoded
    bytes, reused while the windows' buckets and versions stay the same: a repeated Get with
    unchanged counts costs a dict lookup, and gRPC sends the bytes as they are (see
    add_estimates_to_server). Bounded by the config: one entry per (metric, window) pair and
    one per request shape (metric name or "", window name or ""), names the config declares."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], tuple[tuple[int, Version, int, int, bool, str], bytes]] = {}
        self._responses: dict[tuple[str, str], tuple[tuple, bytes]] = {}

    def response(self, shape: tuple[str, str], estimates: list[WindowEstimate]) -> bytes:
        marker = tuple((e.metric.name, e.window.name, *self._state(e)) for e in estimates)
        held = self._responses.get(shape)
        if held is not None and held[0] == marker:
            return held[1]
        data = b"".join(self._window(e) for e in estimates)
        self._responses[shape] = (marker, data)
        return data

    def _window(self, e: WindowEstimate) -> bytes:
        key = (e.metric.name, e.window.name)
        held = self._windows.get(key)
        state = self._state(e)
        if held is not None and held[0] == state:
            return held[1]
        encoded = estimates_field(e)
        self._windows[key] = (state, encoded)
        return encoded

    @staticmethod
    def _state(e: WindowEstimate) -> tuple[int, Version, int, int, bool, str]:
        """What a window's bytes depend on besides its metric and window: its bucket and version,
        what time alone changes (a period begun: c and the estimand; its lateness ended), and its
        spec (a strings metric's verification round changes with the period)."""
        return (e.start, e.version, e.reports_per_device, e.spanned, e.provisional, e.metric.spec.fingerprint)
