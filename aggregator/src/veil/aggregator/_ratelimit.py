"""Per-token rate limits on reports: a token bucket per upload token.

A bucket holds up to `burst` reports and refills at `rate` reports per second. An upload of n
reports takes n from its token's bucket, or takes nothing and learns how long until n are
there (the retry hint the caller sends back as `retry-after-ms`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["RateLimiter"]


class _Bucket:
    __slots__ = ("rate", "burst", "level", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.stamp = rate, burst, burst, now


class RateLimiter:
    """take(name, n) -> 0.0 when n reports may pass now, else the seconds to wait for them.
    Names without a limit always pass."""

    def __init__(self, limits: Mapping[str, tuple[float, float]], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._buckets = {name: _Bucket(rate, burst, now) for name, (rate, burst) in limits.items() if rate > 0}
        self._lock = threading.Lock()

    def set_limits(self, limits: Mapping[str, tuple[float, float]]) -> None:
        """Limit by these from now on (tokens reloaded): a name whose rate and burst stay the same
        keeps its bucket as it is, so a reload never hands out a fresh burst; a new or changed
        limit starts full; a name left out passes from now on."""
        with self._lock:
            now = self._clock()
            old = self._buckets
            self._buckets = {
                name: old[name]
                if name in old and (old[name].rate, old[name].burst) == (rate, burst)
                else _Bucket(rate, burst, now)
                for name, (rate, burst) in limits.items()
                if rate > 0
            }

    def limit(self, name: str) -> tuple[float, float] | None:
        bucket = self._buckets.get(name)
        return (bucket.rate, bucket.burst) if bucket else None

    def take(self, name: str, n: int) -> float:
        bucket = self._buckets.get(name)
        if bucket is None:
            return 0.0
        wanted = min(float(n), bucket.burst)  # more than a burst is refused later as an oversize batch
        with self._lock:
            now = self._clock()
            bucket.level = min(bucket.burst, bucket.level + (now - bucket.stamp) * bucket.rate)
            bucket.stamp = now
            if bucket.level >= wanted:
                bucket.level -= wanted
                return 0.0
            return (wanted - bucket.level) / bucket.rate
