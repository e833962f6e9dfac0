"""Stores of integer counters: SqliteStore (the single-node default), RedisStore (shared by
several aggregators) and MemoryStore (volatile: tests, and where losing everything is fine); a
SQLite file checked without being opened (check_database, describe_database: `veil store`)."""

from ._base import BatchWrite, CountsKey, Store, Version
from ._memory import MemoryStore
from ._open import open_store, store_options
from ._redis import RedisStore
from ._sqlite import SqliteStore, check_database, describe_database

__all__ = [
    "Store",
    "CountsKey",
    "BatchWrite",
    "Version",
    "MemoryStore",
    "RedisStore",
    "SqliteStore",
    "open_store",
    "store_options",
    "check_database",
    "describe_database",
]
