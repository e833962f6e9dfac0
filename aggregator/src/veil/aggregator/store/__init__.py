"""Stores of integer counters: MemoryStore (embedded mode, the demo) and RedisStore."""

from ._base import BatchWrite, CountsKey, Store, StoreError, StoreUnavailable

__all__ = ["Store", "StoreError", "StoreUnavailable", "CountsKey", "BatchWrite"]
