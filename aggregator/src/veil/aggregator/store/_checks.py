"""Checks both stores make of a BatchWrite before touching anything: a failure is a caller's bug."""

from __future__ import annotations

from ._base import BatchWrite

__all__ = ["check_write"]


def check_write(write: BatchWrite) -> None:
    if not write.metric:
        raise ValueError("A batch needs a metric name.")
    if write.dedupe_ttl < 1:
        raise ValueError(f"dedupe_ttl must be at least 1 second, not {write.dedupe_ttl}.")
    for key, _ in write.targets:
        # RedisStore relies on this: all of a batch's keys share the metric's hash slot.
        if key.metric != write.metric:
            raise ValueError(f"Batch of metric {write.metric!r} targets a bucket of {key.metric!r}.")
