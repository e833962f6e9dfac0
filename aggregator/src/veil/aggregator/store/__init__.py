"""Stores of integer counters: MemoryStore (embedded mode, the demo) and RedisStore."""

from ._base import BatchWrite, CountsKey, Store, StoreError, StoreUnavailable
from ._memory import MemoryStore
from ._open import open_store
from ._redis import RedisStore

__all__ = [
    "Store",
    "StoreError",
    "StoreUnavailable",
    "CountsKey",
    "BatchWrite",
    "MemoryStore",
    "RedisStore",
    "open_store",
]
