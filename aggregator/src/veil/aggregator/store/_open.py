"""open_store(url): the store a configuration names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from ._base import Store
from ._memory import MemoryStore
from ._redis import RedisStore
from ._sqlite import SqliteStore

__all__ = ["open_store", "store_options"]

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def open_store(url: str, **options: Any) -> Store:  # each store's own options, checked by it
    """``sqlite:///path/to/veil.db`` -> SqliteStore(path, **options); ``memory`` -> MemoryStore
    (volatile: everything is lost at exit); ``redis://``, ``rediss://`` or ``unix://`` URLs, and
    ``redis+cluster://host:port,...`` or ``rediss+cluster://`` for a Redis Cluster ->
    RedisStore(url, **options)."""
    shown = _redact(url)
    if url == "memory":
        return MemoryStore(**options)
    parts = urlsplit(url)
    if parts.scheme == "memory":
        raise ValueError(
            f"Bad store URL {shown!r}: the memory store no longer writes a snapshot (a crash lost every "
            f"batch since the last clean stop), so use 'sqlite:///path/to/veil.db' to keep counts, or "
            f"'memory' to keep none."
        )
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc or parts.query or parts.fragment or not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"Bad store URL {shown!r}: use 'sqlite:///absolute/path/to/veil.db'.")
        return SqliteStore(path, **options)
    if parts.scheme in _REDIS_SCHEMES:
        try:
            return RedisStore(url, **options)
        except ValueError as error:  # e.g. a port that is not a number
            raise ValueError(f"Bad store URL {shown!r}: {error}") from error
    raise ValueError(
        f"Bad store URL {shown!r}: expected sqlite:///path, memory, redis://, rediss://, "
        "unix://, redis+cluster:// or rediss+cluster://."
    )


def store_options(url: str, settings: Mapping[str, object]) -> dict[str, object]:
    """The keyword arguments for open_store(url, ...) from a config file's [store] settings (its
    url aside), each checked by the store the URL names (Store.config_options):
    StoreMisconfigured names a setting that store does not take or a bad value. A URL that names
    no store is left to open_store to refuse."""
    scheme = "memory" if url == "memory" else urlsplit(url).scheme
    stores: dict[str, type[Store]] = {"memory": MemoryStore, "sqlite": SqliteStore}
    store = stores.get(scheme, RedisStore if scheme in _REDIS_SCHEMES else None)
    if store is None:
        return dict(settings)
    return store.config_options(url, settings)


def _redact(url: str) -> str:
    """The URL without its password, fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()
