"""RedisStore: integer counters in Redis hashes, one atomic Lua script per batch.

Keys (every key of a metric carries the metric in a hash tag, so a Redis Cluster keeps a metric
in one slot; metric, fingerprint and window are percent-encoded, so no name can break the
grammar, escape the tag or collide with another):

    veil:{<metric>}:c:<fingerprint>:<window>:<bucket>  hash of integers: n:<t> and v:<t>:<j>
                                                       (non-zero only), batches (batches added)
    veil:{<metric>}:b:<batch id in hex>                "1", expiring after the batch's dedupe_ttl

Needs Redis >= 7.0 (EXPIREAT ... GT, PEXPIRETIME in add_batch.lua).

Durability is Redis's own:

- ``appendonly yes`` + ``appendfsync always``: Redis writes and fsyncs the append-only file before
  it replies, so no batch that ``add`` acknowledged is lost when Redis or its host crashes.
- ``appendonly yes`` + ``appendfsync everysec``: fsync once a second; a crash of the host can lose
  about the last second of acknowledged batches (up to 2 s when the disk lags, and then a crash
  of Redis alone can too). RDB snapshots alone lose everything since the last snapshot; without
  persistence a restart loses everything.
- Replication is asynchronous: a failover can lose what the replicas had not received.
  ``wait_replicas=N`` sends WAIT N after every batch, on the same connection, and raises
  StoreUnavailable when fewer than N replicas acknowledged within ``wait_timeout_ms``. The batch
  may still have been applied then (and reach the replicas later); that is fine, because the
  caller retries it with the same batch id and the script counts an id at most once. WAIT
  means the replicas received the batch, not that they wrote it to disk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from urllib.parse import quote, urlsplit

import numpy as np
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry

from ..counts import Counts
from ._base import BatchWrite, CountsKey, Store, StoreError, StoreUnavailable
from ._checks import check_write

__all__ = ["RedisStore", "counts_key", "dedupe_key"]

_ADD_BATCH = resources.files(__package__).joinpath("add_batch.lua").read_text(encoding="utf-8")

# Errors after which the same call may succeed later: Redis down, slow, loading its data, a
# replica promoted or a cluster resharding. AuthenticationError/AuthorizationError subclass
# ConnectionError but are configuration mistakes; they are caught first.
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, ReadOnlyError, TryAgainError, ClusterDownError)


def _tag(metric: str) -> str:
    if not metric:
        # "{}" would hash the whole key, scattering the metric's keys over the cluster.
        raise ValueError("A metric name cannot be empty.")
    return quote(metric, safe="")


def counts_key(key: CountsKey) -> str:
    """The Redis hash holding one bucket's counts."""
    fingerprint, window = quote(key.fingerprint, safe=""), quote(key.window, safe="")
    return f"veil:{{{_tag(key.metric)}}}:c:{fingerprint}:{window}:{int(key.bucket)}"


def dedupe_key(metric: str, batch_id: bytes) -> str:
    """The Redis key remembering that a batch id of a metric has been applied."""
    return f"veil:{{{_tag(metric)}}}:b:{batch_id.hex()}"


class RedisStore(Store):
    """Counters in Redis (``redis://``, ``rediss://`` or ``unix://`` URL); see the module doc."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        socket_timeout: float = 2.0,
        socket_connect_timeout: float = 2.0,
        retries: int = 2,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        max_connections: int | None = None,
    ) -> None:
        if retries < 0 or wait_replicas < 0:
            raise ValueError("retries and wait_replicas cannot be negative.")
        if wait_replicas and not 1 <= wait_timeout_ms < socket_timeout * 1000:
            # WAIT 0 blocks forever; a WAIT longer than the socket timeout would time out the read.
            raise ValueError("wait_timeout_ms must be at least 1 and shorter than socket_timeout.")
        self._where = _address(url)
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms
        # redis-py re-sends a command after a connection error or a timeout, even when Redis may
        # already have run it. That is safe for every command sent here only because reads are
        # reads and add_batch.lua sets the dedupe key and adds the counts in one atomic step: an
        # attempt that was applied but not acknowledged leaves the key behind, so any retry of
        # the same batch id (redis-py's, ours or the SDK's) finds it and counts nothing.
        # Few, short retries: a caller hears StoreUnavailable within a few timeouts.
        retry = Retry(
            ExponentialWithJitterBackoff(cap=0.5, base=0.05),
            retries,
            supported_errors=(redis.ConnectionError, redis.TimeoutError),
        )
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=retry,
            max_connections=max_connections,
            decode_responses=False,
        )
        # EVALSHA, loading the script again when Redis answers NOSCRIPT (restart, SCRIPT FLUSH).
        self._add_batch = self._redis.register_script(_ADD_BATCH)

    def add(self, write: BatchWrite) -> bool:
        """True when this call applied the batch. A retry after an attempt that was applied but
        not acknowledged answers False (already counted), as for any duplicate."""
        check_write(write)
        keys = [dedupe_key(write.metric, write.batch_id), *(counts_key(key) for key, _ in write.targets)]
        expiries = ("" if at is None else int(at) for _, at in write.targets)
        args = [int(write.dedupe_ttl), *expiries, *_increments(write.counts)]
        with self._boundary("add"):
            if not self._wait_replicas:
                return bool(self._add_batch(keys, args))
            # WAIT counts the writes of its own connection: the script and WAIT share a pipeline.
            pipe = self._redis.pipeline(transaction=False)
            self._add_batch(keys, args, client=pipe)
            pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
            applied, acked = pipe.execute()
        if acked < self._wait_replicas:
            raise StoreUnavailable(
                f"Redis at {self._where}: {acked} of {self._wait_replicas} replicas acknowledged the batch "
                f"within {self._wait_timeout_ms} ms; it may have been applied, and a retry counts it at most once"
            )
        return bool(applied)

    def read(self, key: CountsKey, weights: Sequence[int], k: int) -> Counts:
        name = counts_key(key)
        with self._boundary("read"):
            fields = self._redis.hgetall(name)
        try:
            return _counts_of(fields, tuple(weights), k)
        except ValueError as error:
            design = f"{len(weights)} weights, k = {k}"
            raise StoreError(f"Redis hash {name} does not hold counts of this design ({design}): {error}") from None

    def versions(self, keys: Sequence[CountsKey]) -> list[int]:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(counts_key(key), "batches")
        with self._boundary("versions"):
            found = pipe.execute()
        return [int(value or 0) for value in found]

    def ping(self) -> None:
        with self._boundary("ping"):
            self._redis.ping()

    def close(self) -> None:
        self._redis.close()

    @contextmanager
    def _boundary(self, what: str) -> Iterator[None]:
        """Translate redis-py's errors into the store's, with a one-line message."""
        try:
            yield
        except (AuthenticationError, AuthorizationError) as error:
            raise StoreError(f"Redis at {self._where} refused {what}: {_line(error)}") from error
        except _TRANSIENT as error:
            raise StoreUnavailable(f"Redis at {self._where} unavailable for {what}: {_line(error)}") from error
        except ResponseError as error:
            if str(error).startswith("BUSY"):  # another client's script is running long
                raise StoreUnavailable(f"Redis at {self._where} busy during {what}: {_line(error)}") from error
            raise StoreError(f"Redis at {self._where} failed {what}: {_line(error)}") from error
        except redis.RedisError as error:
            raise StoreError(f"Redis at {self._where} failed {what}: {_line(error)}") from error


def _increments(counts: Counts) -> list[object]:
    """Field, increment pairs of the non-zero counts: n:<t> and v:<t>:<j>, t a report weight."""
    weights = np.asarray(counts.weights, dtype=np.int64)
    (ns,) = np.nonzero(counts.n)
    rows, cols = np.nonzero(counts.v)
    fields = [f"n:{t}" for t in weights[ns].tolist()]
    fields += [f"v:{t}:{j}" for t, j in zip(weights[rows].tolist(), cols.tolist(), strict=True)]
    values = counts.n[ns].tolist() + counts.v[rows, cols].tolist()  # Python ints: redis-py encodes no numpy
    pairs: list[object] = [None] * (2 * len(fields))
    pairs[0::2] = fields
    pairs[1::2] = values
    return pairs


def _counts_of(fields: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> Counts:
    """Parse a hash's fields into Counts; ValueError when a field does not fit the design."""
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64))
    fields.pop(b"batches", None)
    if not fields:
        return counts
    names = np.array(list(fields))
    values = np.array(list(fields.values())).astype(np.int64)
    kinds = names.astype("S1")
    is_n, is_v = kinds == b"n", kinds == b"v"
    if not (is_n | is_v).all():
        raise ValueError(f"unknown field {names[~(is_n | is_v)][0]!r}")
    row_of = counts.row_of_weight()
    (t,) = _numbers(names[is_n], 2)
    counts.n[_rows(t, row_of)] = values[is_n]
    t, j = _numbers(names[is_v], 3)
    if j.size and (j.min() < 0 or j.max() >= k):
        raise ValueError("a category index out of range")
    counts.v[_rows(t, row_of), j] = values[is_v]
    return counts


def _numbers(names: np.ndarray, width: int) -> np.ndarray:
    """The integers after the kind of fields like b"v:<t>:<j>" (width 3), one row per number."""
    if not names.size:
        return np.zeros((width - 1, 0), np.int64)
    parts = np.array(b":".join(names.tolist()).split(b":")).reshape(-1, width)
    return parts[:, 1:].astype(np.int64).T


def _rows(t: np.ndarray, row_of: np.ndarray) -> np.ndarray:
    if t.size and (t.min() < 0 or t.max() >= len(row_of) or (row_of[t] < 0).any()):
        raise ValueError("a report weight outside the design")
    return row_of[t]


def _address(url: str) -> str:
    """Where the store is, for messages: host:port or socket path, never the password."""
    parts = urlsplit(url)
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


def _line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
