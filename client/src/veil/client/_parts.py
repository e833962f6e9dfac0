"""What one device reuses for every report of a numeric metric's part (docs/protocol.md section 9).

A number is reported in each part as a category of it; what does not change from one report to
the next is computed once per device and spec: the part's rounding threshold alpha (a mean
part's, from the device secret), whether it memoizes, its budgets, and its categories' memo keys
(a number's few points or buckets come back again and again, and the HMAC is a good part of a
report()'s cost). So a number costs about what a category does (bench/bench_client.py).
"""

from __future__ import annotations

from veil.mechanism import MEAN, MetricSpec, NumericSpec

from ._memo import MemoStore

__all__ = ["DevicePart"]


class DevicePart:
    """One device's precomputed view of one numeric part's spec."""

    __slots__ = ("spec", "numeric", "alpha", "memoize", "budgets", "_memo", "_keys")

    def __init__(
        self,
        spec: MetricSpec,
        numeric: NumericSpec,
        memo: MemoStore,
        memoize: bool,
        budgets: tuple[float | None, float],
    ) -> None:
        self.spec, self.numeric = spec, numeric
        self.alpha = memo.alpha(spec.name, spec.fingerprint) if numeric.part == MEAN else 0.0
        self.memoize = memoize
        self.budgets = budgets  # (period, lifetime), as Reporter._budgets says them
        self._memo = memo
        self._keys: dict[int, bytes] = {}

    def memo_key(self, index: int) -> bytes:
        """The memo key of the part's category ``index`` (MemoStore.key), kept."""
        key = self._keys.get(index)
        if key is None:
            key = self._keys[index] = self._memo.key(self.spec.name, self.spec.fingerprint, index)
        return key
