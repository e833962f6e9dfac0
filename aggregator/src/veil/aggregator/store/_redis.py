"""RedisStore: integer counters in Redis hashes, one atomic Lua script per group of batches.

Keys (every key carries a hash tag, <tag>, so that a batch's keys share one Redis Cluster slot;
metric, fingerprint and window are percent-encoded, so no name can break the grammar, escape
the tag or collide with another):

    veil:{<tag>}:c:<fingerprint>:<window>:<bucket>  hash of integers: n:<t> and v:<t>:<j>
                                                    (non-zero only), batches (batches added),
                                                    version (drawn at random by each write);
                                                    and periods, the reporting periods with
                                                    data (",p1,p2,", see _periods)
    veil:{<tag>}:q:<fingerprint>:<window>:<bucket>  the packed copy of an ended bucket's hash, made by
                                                    settled_read: int64s (version, k, the number
                                                    of rows held and of periods, the rows held:
                                                    weights, n, V, then the periods); expires with it
    veil:{<tag>}:b:<batch id in hex>                "1", expiring after the batch's dedupe_ttl
    veil:{<metric>}:s:<fingerprint>                 when counting of the spec began (Store.since)

On one Redis (``redis://``, ``rediss://``, ``unix://``) the tag is the metric: one shard. A store
given a ``namespace`` (``veil demo`` draws one per run) tags its keys ``<namespace>:<metric>``
(its probe key too), so they are its own and ``remove_namespace`` finds and deletes them all.

On a Redis Cluster (``redis+cluster://host:port,host:port``, ``rediss+cluster://`` for TLS, with
``?ssl_ca_certs=/path/to/ca.crt`` for a private CA; the hosts are where to start, the client
finds the rest) each metric's counters are split over S
shards, so that a hot metric is not bound by one core of one node: shard s has the tag
``<metric>#<s>.<j>``, j the first number that hashes it into the s-th of S equal ranges of the
16384 slots (so a cluster whose masters hold equal ranges, as ``redis-cli --cluster create``
makes, holds S / masters shards each). A batch goes to the shard crc32(batch id) mod S, all of it
(dedupe key and counter hashes, one slot, one atomic script): a retry lands on the same shard,
so exactly once holds as on one Redis. Reads sum the shards, with one pipeline per node (sent to
all nodes at once); a bucket's version is then the tuple of its shards' versions. S is
``shards`` (default: one per master), recorded in the cluster (key ``veil:shards``) by the
first aggregator to use it: later ones use the recorded number, and one configured with
another raises StoreError (its ping too, so health says NOT_SERVING), as a batch id's shard,
and so exactly once, depends on it. Group commit is per shard, so more shards mean smaller
groups and more Redis CPU per batch (bench_capacity.py measures it); more shards than masters
only leave room to spread over masters added later.

Needs Redis >= 7.0 (EXPIREAT ... GT, PEXPIRETIME in add_batch.lua), and ``maxmemory-policy
noeviction`` (Redis's default): an evicted batch id would let a retried batch count twice, so
``ping`` raises StoreMisconfigured under any other policy. A Redis that answers but refuses
writes (memory full under noeviction, a failed RDB save or AOF write, a read-only replica) is
StoreUnavailable, never a final error, and ``ping`` writes a short-lived probe key to find it.

A bucket's version, which caches compare, is a random 63-bit number each script call writes
along with its counts, not the number of batches: after a failover or a restore lost writes,
"batches" can climb back to a number it had before, with other counts behind it, while a
drawn version does not come back (the chance is 2^-63 per write).

Group commit: concurrent ``add`` calls for the same buckets (same metric, shard, targets,
dedupe TTL and design) are written together by one script call (see _coalesce): the script
checks every batch id of the group first and, when all are new, remembers them all and adds the group's
summed counts once per target; when some were already applied it adds nothing and names them,
and the rest go again, summed again. So a script call costs about what one batch did, however
many batches it carries, and every id is still counted at most once: the check and the
increments are one atomic step, ids repeated within a group are sent once (the later copies
answer "duplicate"), and when a call fails every batch of the group hears StoreUnavailable and
is retried by its own client under its own id. ``coalesce`` caps the batches per call; 1 sends
every batch on its own.

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
  means the replicas received the batch, not that they wrote it to disk. On a cluster the
  script and its WAIT go to the master of the batch's shard, on one connection.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from importlib import resources
from typing import Any, ClassVar, Protocol, cast
from urllib.parse import parse_qs, quote, unquote, urlsplit

import numpy as np
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ClusterError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry
from redis.typing import EncodableT

from ..counts import PERIOD_NOT_SAID, Counts
from ..errors import StoreError, StoreMisconfigured, StoreUnavailable
from ._base import AppliedObserver, BatchWrite, CountsKey, FlushObserver, Store, Version
from ._checks import check_write
from ._coalesce import Coalescer
from ._periods import periods_of

__all__ = ["MAX_SHARDS", "RedisStore", "counts_key", "dedupe_key", "shard_of", "shard_tags"]

_VERSIONS = (1 << 63) - 1  # versions are drawn from 1 .. 2^63 - 1: Redis integers, never 0
_ADD_BATCH = resources.files(__package__).joinpath("add_batch.lua").read_text(encoding="utf-8")
_READ_SETTLED = resources.files(__package__).joinpath("read_settled.lua").read_text(encoding="utf-8")

# Errors after which the same call may succeed later: Redis down, slow, loading its data, a
# replica promoted or a cluster resharding (MOVED/ASK where the client does not follow them, a
# cluster no node of which answers). AuthenticationError/AuthorizationError subclass
# ConnectionError but are configuration mistakes; they are caught first.
_TRANSIENT = (
    redis.ConnectionError,
    redis.TimeoutError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    ClusterError,
    AskError,
    RedisClusterException,
    OutOfMemoryError,
)  # OOM: a Redis refusing writes for now (memory full under noeviction)

_SLOTS = 16384
_SHARDS_KEY = "veil:shards"  # a cluster's shard count, written once by the first aggregator
MAX_SHARDS = 1024
# Error replies (also from inside add_batch.lua) that a later retry can turn into success: a
# script running long, a failed RDB save or AOF write (a full disk), too few replicas, loading.
_REFUSING_FOR_NOW = ("BUSY", "MISCONF", "NOREPLICAS", "LOADING", "MASTERDOWN", "OOM", "READONLY")
_PROBE_KEY = "veil:probe"  # written by every ping (PX below), so a store refusing writes is seen
_PROBE_MS = 10_000
_PING_TIMEOUT = 1.0  # seconds: health follows a frozen Redis within about a ping period


def _tag(metric: str, namespace: str = "") -> str:
    if not metric:
        # "{}" would hash the whole key, scattering the metric's keys over the cluster.
        raise ValueError("A metric name cannot be empty.")
    # No quoted name holds a ":", so no namespace's keys are another's or a metric's without one.
    return f"{quote(namespace, safe='')}:{quote(metric, safe='')}" if namespace else quote(metric, safe="")


def shard_tags(metric: str, shards: int, namespace: str = "") -> tuple[str, ...]:
    """The hash tags of a metric's shards: the metric itself for one shard (the keys of one
    Redis), else shard s's ``<metric>#<s>.<j>`` in the s-th of `shards` equal slot ranges."""
    base = _tag(metric, namespace)
    if shards == 1:
        return (base,)
    tags = []
    for s in range(shards):
        low, high = s * _SLOTS // shards, (s + 1) * _SLOTS // shards
        j = 0  # about `shards` tries each: a tag lands in a range of 1/shards of the slots
        while not low <= key_slot(f"{base}#{s}.{j}".encode()) < high:
            j += 1
        tags.append(f"{base}#{s}.{j}")
    return tuple(tags)


def shard_of(batch_id: bytes, shards: int) -> int:
    """The shard of a batch id: the same on every retry."""
    return zlib.crc32(batch_id) % shards if shards > 1 else 0


def counts_key(key: CountsKey, tag: str | None = None) -> str:
    """The Redis hash holding one bucket's counts (in the shard of that tag; the metric's by default)."""
    fingerprint, window = quote(key.fingerprint, safe=""), quote(key.window, safe="")
    return f"veil:{{{tag or _tag(key.metric)}}}:c:{fingerprint}:{window}:{int(key.bucket)}"


def since_key(metric: str, fingerprint: str, namespace: str = "") -> str:
    """The Redis string holding when counting of a metric's spec began (one key, not sharded)."""
    return f"veil:{{{_tag(metric, namespace)}}}:s:{quote(fingerprint, safe='')}"


def _packed_key(counts_hash: str) -> str:
    """The Redis string holding the packed copy of a counts hash (Store.settled_read): its key
    with "c" made "q", so in the same slot ("p" held copies without the periods)."""
    head, _, rest = counts_hash.partition("}:c:")
    return f"{head}}}:q:{rest}"


def _pack(version: int, counts: Counts) -> bytes:
    """A packed copy: int64 little-endian version, k, the number R of rows held, the number P
    of periods, their weights, their n, their V rows (R x k), the P periods; the rows of
    weights with no reports are left out (RAPPOR has k + 1 weights, most of them never reported)."""
    rows = np.flatnonzero((counts.n != 0) | counts.v.any(axis=1))
    weights = np.asarray(counts.weights, np.int64)[rows]
    periods = np.array(sorted(counts.periods), np.int64)
    head = np.array([version, counts.k, rows.size, periods.size], np.int64)
    return b"".join(
        part.astype("<i8", copy=False).tobytes() for part in (head, weights, counts.n[rows], counts.v[rows], periods)
    )


def _unpack(packed: bytes, version: int, weights: tuple[int, ...], k: int) -> tuple[int, Counts] | None:
    """(version, counts) from a packed copy of a hash at `version`, the design (weights, k); None
    when it is of another version or does not fit the design (then the hash is read: it says
    what is wrong, if anything)."""
    if len(packed) < 32 or len(packed) % 8:
        return None
    flat = np.frombuffer(packed, "<i8")
    held, held_k, rows, count = flat[:4].tolist()
    if held != version or held_k != k or rows < 0 or count < 0 or flat.size != 4 + rows * (k + 2) + count:
        return None
    row_of = {t: r for r, t in enumerate(weights)}
    at = [row_of.get(t, -1) for t in flat[4 : 4 + rows].tolist()]
    if -1 in at:
        return None
    n, v = flat[4 + rows : 4 + 2 * rows], flat[4 + 2 * rows : flat.size - count].reshape(rows, k)
    periods = frozenset(flat[flat.size - count :].tolist())
    if at == list(range(len(weights))):  # every row, in order: n and V read-only views of the copy, not copied
        return version, Counts(weights, n, v, periods)
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64), periods)
    counts.n[at] = n
    counts.v[at] = v
    return version, counts


def dedupe_key(metric: str, batch_id: bytes, tag: str | None = None) -> str:
    """The Redis key remembering that a batch id of a metric has been applied."""
    return f"veil:{{{tag or _tag(metric)}}}:b:{batch_id.hex()}"


class RedisStore(Store):
    """Counters in Redis (``redis://``, ``rediss://`` or ``unix://`` URL) or in a Redis Cluster
    (``redis+cluster://`` or ``rediss+cluster://``); see the module doc."""

    SETTINGS: ClassVar[dict[str, str]] = {
        "timeout": "seconds to wait for Redis: connecting and each reply",
        "wait_replicas": "replicas that must have each write before it is acknowledged (WAIT)",
        "wait_timeout_ms": "how long WAIT waits for them",
        "shards": "a Redis Cluster only: the shards each metric's counters are spread over",
    }

    @classmethod
    def config_options(cls, url: str, settings: Mapping[str, object]) -> dict[str, object]:
        options: dict[str, object] = {}
        for key, value in settings.items():
            if key not in cls.SETTINGS:
                super().config_options(url, {key: value})
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if key == "timeout":
                if number is None or not 0 < number < float("inf"):
                    raise StoreMisconfigured(f"store.timeout: expected a number of seconds above 0, got {value!r}.")
                options.update(socket_timeout=float(number), socket_connect_timeout=float(number))
                continue
            low = 0 if key == "wait_replicas" else 1
            if not isinstance(number, int) or number < low:
                raise StoreMisconfigured(f"store.{key}: expected a whole number of at least {low}, got {value!r}.")
            if key == "shards" and not url.startswith(("redis+cluster://", "rediss+cluster://")):
                raise StoreMisconfigured(
                    f"store.shards: applies to a Redis Cluster (redis+cluster://) only, and the "
                    f"store is {url.split(':')[0]!r}."
                )
            options[key] = number
        return options

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
        coalesce: int = 64,
        shards: int | None = None,
        namespace: str = "",
    ) -> None:
        if retries < 0 or wait_replicas < 0:
            raise ValueError("retries and wait_replicas cannot be negative.")
        if coalesce < 1:
            raise ValueError("coalesce must be at least 1 (1: every batch on its own).")
        if wait_replicas and not 1 <= wait_timeout_ms < socket_timeout * 1000:
            # WAIT 0 blocks forever; a WAIT longer than the socket timeout would time out the read.
            raise ValueError("wait_timeout_ms must be at least 1 and shorter than socket_timeout.")
        scheme = urlsplit(url).scheme
        self._cluster = scheme in ("redis+cluster", "rediss+cluster")
        if shards is not None and not (self._cluster and 1 <= shards <= MAX_SHARDS):
            raise ValueError(f"shards applies to a Redis Cluster (redis+cluster://) only, from 1 to {MAX_SHARDS}.")
        self._where = _address(url)
        self._namespace = namespace
        self._probe_key = f"veil:{{{quote(namespace, safe='')}:}}:probe" if namespace else _PROBE_KEY
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
        packer = _packer()
        options: dict[str, Any] = dict(
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=retry,
            max_connections=max_connections,
            decode_responses=False,
        )
        self._lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        self._add_batch: Script | None = None
        self._settled_script: Script | None = None  # read_settled.lua, registered on first use
        self._probe: redis.Redis | None = None
        if self._cluster:
            seeds = _cluster_seeds(url)  # a bad URL is refused now; the nodes are asked on first use
            self._connect = lambda: _cluster_client(seeds, packer, options)
            self._wanted_shards = shards
            self._shards = 0  # found on first use: the count recorded in the cluster
        else:
            options.update({} if packer is None else {"command_packer": packer})
            self._client = redis.Redis.from_url(url, **options)
            self._add_batch = self._client.register_script(_ADD_BATCH)
            self._shards = 1
            # Health's own client: one short attempt, no retries, so a frozen Redis turns health
            # NOT_SERVING within about a second rather than after the uploads' timeouts and retries.
            self._probe = redis.Redis.from_url(
                url,
                socket_timeout=min(socket_timeout, _PING_TIMEOUT),
                socket_connect_timeout=min(socket_connect_timeout, _PING_TIMEOUT),
                retry=Retry(ExponentialWithJitterBackoff(), 0),
                max_connections=2,
            )
        self._packed = packer is not None  # the increments go pre-encoded (see _Resp)
        self._coalescer: Coalescer[BatchWrite, bool] | None = (
            Coalescer(self._write_group, max_batches=coalesce) if coalesce > 1 else None
        )
        self._flush_observers: list[FlushObserver] = []
        self._applied_observers: list[AppliedObserver] = []
        self._keys: dict[tuple[CountsKey, str], str] = {}  # counts_key() of recent targets and shards
        self._tags: dict[str, tuple[str, ...]] = {}  # shard_tags() of recent metrics
        self._masters: dict[object, redis.Redis] = {}  # a cluster: the client of the master of a key's slot

    @property
    def _redis(self) -> redis.Redis | RedisCluster:
        """The client; a cluster's is made on first use (redis-py's asks the nodes at once, and an
        aggregator starts, NOT_SERVING, while they are down)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    @property
    def _redis_cluster(self) -> RedisCluster:
        """The client of a cluster store."""
        client = self._redis
        assert isinstance(client, RedisCluster)
        return client

    def _script(self) -> Script:
        """add_batch.lua: EVALSHA, loading the script again when Redis answers NOSCRIPT (a
        restart, SCRIPT FLUSH); on a cluster registered with its client, on first use."""
        if self._add_batch is None:
            self._add_batch = self._redis.register_script(_ADD_BATCH)
        return self._add_batch

    def shard_count(self) -> int:
        """S, the shards each metric's counters are split over: 1 on one Redis; on a cluster the
        number recorded there, or, for the first aggregator, the configured one (default: one
        per master), recorded. StoreError when the configured number differs from the recorded one."""
        if self._shards:
            return self._shards
        with self._boundary("shards"):
            client = self._redis_cluster
            recorded = client.get(_SHARDS_KEY)
            if recorded is None:
                client.set(_SHARDS_KEY, self._wanted_shards or len(client.get_primaries()), nx=True)
                recorded = client.get(_SHARDS_KEY)
        assert recorded is not None  # set just now, by this aggregator or another
        shards = int(recorded)
        if self._wanted_shards and shards != self._wanted_shards:
            raise StoreError(
                f"Redis Cluster at {self._where} splits counters over {shards} shards ({_SHARDS_KEY}), "
                f"not the {self._wanted_shards} configured: a batch's shard depends on it, so use "
                f"{shards} (or leave it out)"
            )
        self._shards = shards
        return shards

    def _shard_tags(self, metric: str) -> tuple[str, ...]:
        tags = self._tags.get(metric)
        if tags is None:
            if len(self._tags) >= 4096:
                self._tags.clear()
            tags = self._tags[metric] = shard_tags(metric, self.shard_count(), self._namespace)
        return tags

    def observe_flushes(self, observer: FlushObserver) -> None:
        """Call observer(batches, seconds, failed) after every script call that adds batches."""
        self._flush_observers.append(observer)
        if self._coalescer is not None:
            self._coalescer.observe(observer)

    def observe_applied(self, observer: AppliedObserver) -> None:
        """Call observer(target, version_before, version_after, counts) for every target of a
        group this process applied, once the call succeeded (WAIT included), before any of its
        batches' ``add`` returns; observer(target, None, None, None) for every target of a call
        that failed. See AppliedObserver. Writes of other processes are never observed here.
        With S > 1 shards the versions are tuples of S with None but at the shard written."""
        self._applied_observers.append(observer)

    def _notify(
        self, targets: Sequence[CountsKey], shard: int, before: Sequence[int] | None, after: int, counts: Counts | None
    ) -> None:
        shards = self._shards
        for i, target in enumerate(targets):
            for observer in self._applied_observers:
                try:
                    if before is None or before[i] < 0:
                        observer(target, None, None, None)
                    elif shards == 1:
                        observer(target, before[i], after, counts)
                    else:
                        observer(target, _at(shards, shard, before[i]), _at(shards, shard, after), counts)
                except Exception:  # noqa: BLE001 (an observer must never fail a write)
                    pass

    def add(self, write: BatchWrite) -> bool:
        """True when this call applied the batch. A retry after an attempt that was applied but
        not acknowledged answers False (already counted), as for any duplicate."""
        check_write(write)
        if self._coalescer is None:
            return self._observed_group([write])[0]
        return self._coalescer.submit(self._group_of(write), write)

    def add_many(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        """One script call per group (metric, shard, targets, TTL, design) of the writes, one
        group after another; a group that fails fails its own writes only."""
        groups: dict[tuple, list[int]] = {}
        for i, write in enumerate(writes):
            check_write(write)
            groups.setdefault(self._group_of(write), []).append(i)
        results: list[bool | StoreError] = [False] * len(writes)
        for group, members in groups.items():
            batch = [writes[i] for i in members]
            try:
                if self._coalescer is None:
                    answers: Sequence[bool | StoreError] = self._observed_group(batch)
                else:
                    answers = self._coalescer.submit_many(group, batch)
            except StoreError as err:
                answers = [err] * len(members)
            for i, answer in zip(members, answers):
                results[i] = answer
        return results

    def _group_of(self, write: BatchWrite) -> tuple:
        """What a group written in one script call shares: add_batch.lua takes one set of targets,
        TTL, design and period, on one shard (whose slot its dedupe keys and counter hashes share)."""
        shard = shard_of(write.batch_id, len(self._shard_tags(write.metric)))
        period = PERIOD_NOT_SAID if write.period is None else write.period
        return (write.metric, shard, write.targets, write.dedupe_ttl, write.counts.weights, write.counts.k, period)

    def _observed_group(self, writes: Sequence[BatchWrite]) -> list[bool]:
        started = time.perf_counter()
        failed = True
        try:
            results = self._write_group(writes)
            failed = False
            return results
        finally:
            for observer in self._flush_observers:
                observer(len(writes), time.perf_counter() - started, failed)

    def _write_group(self, writes: Sequence[BatchWrite]) -> list[bool]:
        """Apply batches of the same metric, shard, targets, dedupe TTL, design and period; for each, True
        when this call applied it, False when its id had been applied before (or earlier in writes)."""
        first = writes[0]
        tags = self._shard_tags(first.metric)
        shard = shard_of(first.batch_id, len(tags))
        tag = tags[shard]
        targets = [self._counts_key(key, tag) for key, _ in first.targets]
        expiries = ["" if at is None else int(at) for _, at in first.targets]
        period = PERIOD_NOT_SAID if first.period is None else first.period
        pending: dict[bytes, BatchWrite] = {}
        for write in writes:
            pending.setdefault(write.batch_id, write)  # a repeated id goes once; its copies are duplicates
        applied: set[bytes] = set()
        while pending:
            ids = list(pending)
            if len(ids) == 1:
                counts = pending[ids[0]].counts
            else:
                counts = Counts.summed([pending[i].counts for i in ids])
            keys = [*(dedupe_key(first.metric, i, tag) for i in ids), *targets]
            version = 1 + secrets.randbelow(_VERSIONS)  # never 0, which stands for "no version"
            args: list[int | str | _Resp] = [len(ids), int(first.dedupe_ttl), version, period, *expiries]
            if self._packed:
                args.append(_increments_resp(counts))
            else:
                args += _increments(counts)
            try:
                seen, before = self._run_script(keys, args, len(ids))
            except BaseException:
                if self._applied_observers:
                    self._notify([key for key, _ in first.targets], shard, None, version, None)
                raise
            if not seen:
                applied.update(ids)
                if self._applied_observers:
                    added = Counts(counts.weights, counts.n, counts.v, frozenset((period,)))
                    self._notify([key for key, _ in first.targets], shard, before, version, added)
                break
            for position in seen:
                del pending[ids[int(position) - 1]]
        results = []
        for write in writes:
            results.append(write.batch_id in applied)
            applied.discard(write.batch_id)  # the later copies of a repeated id: duplicates
        return results

    def _run_script(self, keys: list[str], args: list[int | str | _Resp], batches: int) -> tuple[list[int], list[int]]:
        """One add_batch.lua call (with WAIT when asked): the positions it found already applied
        (none when it applied the group), and when it applied the group each target's version
        before it (0: none; -1: the hash is gone)."""
        # A _Resp goes through redis-py untouched, to _Packer, which writes it (redis-py's types know none).
        wire_args = cast("list[EncodableT]", args)
        with self._boundary("add"):
            script = self._script()
            if self._cluster:
                answer, acked = self._run_on_master(script, keys, wire_args)
            elif not self._wait_replicas:
                answer, acked = script(keys, wire_args), 0
            else:
                # WAIT counts the writes of its own connection: the script and WAIT share a pipeline.
                pipe = self._redis.pipeline(transaction=False)
                script(keys, wire_args, client=pipe)
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
                answer, acked = pipe.execute()
            if acked < self._wait_replicas:
                what = "the batch" if batches == 1 else f"a group of {batches} batches"
                raise StoreUnavailable(
                    f"Redis at {self._where}: {acked} of {self._wait_replicas} replicas acknowledged {what} "
                    f"within {self._wait_timeout_ms} ms; it may have been applied, and a retry counts it at "
                    "most once"
                )
        answer = [int(a) for a in answer]
        if answer and answer[0] == 0:  # applied: {0, each target's version before}
            return [], answer[1:]
        return answer, []

    def _run_on_master(self, script: Script, keys: list[str], args: list[EncodableT]) -> tuple[list[int], int]:
        """The script (and WAIT, which counts the writes of its own connection: one pipeline) on
        the master of the keys' slot, through that node's own client: redis-py's cluster
        client costs some 50 us of CPU per call more, with nothing to gain for one slot. A
        MOVED (the slot has moved: the script did not run) is followed once, after the slot map
        is read again; an ASK or TRYAGAIN (the slot is moving) or a connection error raises,
        and the caller's retry finds the new map."""
        for attempt in (1, 2):
            name = keys[0]
            client = self._masters.get(name)
            if client is None:
                cluster = self._redis_cluster
                client = cluster.get_redis_connection(cluster.get_node_from_key(name))
                if len(self._masters) >= 4096:
                    self._masters.clear()
                self._masters[name] = client
            try:
                if not self._wait_replicas:
                    return script(keys, args, client=client), 0
                pipe = client.pipeline(transaction=False)
                script(keys, args, client=pipe)
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
                answer, acked = pipe.execute()
                return answer, acked
            except (AskError, redis.ConnectionError, redis.TimeoutError) as error:
                self._masters.clear()
                with suppress(Exception):
                    self._redis_cluster.nodes_manager.initialize()
                if attempt == 2 or not isinstance(error, MovedError):
                    raise
        raise AssertionError("unreachable")

    def _counts_key(self, key: CountsKey, tag: str) -> str:
        name = self._keys.get((key, tag))
        if name is None:
            if len(self._keys) >= 4096:  # buckets turn over: forget the old ones now and then
                self._keys.clear()
            name = self._keys[key, tag] = counts_key(key, tag)
        return name

    def bucket_hashes(self, key: CountsKey) -> list[str]:
        """The Redis hashes holding a bucket's counts, one per shard."""
        return [self._counts_key(key, tag) for tag in self._shard_tags(key.metric)]

    def versioned_read(
        self, keys: Sequence[CountsKey], requests: Sequence[tuple[CountsKey, Sequence[int], int]]
    ) -> tuple[list[Version], list[tuple[Version, Counts]]]:
        """versions(keys) and the requests' counts in one pipeline, so one round trip (on a
        cluster one per node, sent at once), each bucket read with the version its counts are at:
        both from one command, so they belong to the same moment. A design with its field names
        cached (a q-subset design) is read with HMGET of exactly its fields and "version", and
        HLEN: half the reply of HGETALL, which also sends the names; when HLEN says the hash has
        other fields too (or changed in between), HGETALL reads it again (a second round trip).
        Redis runs the version reads first, so that version may be later than the one
        versions(keys) gave for the same bucket. With S > 1 shards a version is the tuple of
        the shards' versions and the counts are the shards' sum, each shard read atomically
        with its version."""
        with self._boundary("read" if requests else "versions"):
            key_hashes = [self.bucket_hashes(key) for key in keys]
            pipe = self._pipeline()
            for names in key_hashes:
                for name in names:
                    pipe.hget(name, "version")
            plans = [(name, tuple(weights), k) for key, weights, k in requests for name in self.bucket_hashes(key)]
            queued = self._queue_hashes(pipe, plans)
            found = iter(pipe.execute())
        versions = [_joined([int(next(found) or 0) for _ in names]) for names in key_hashes]
        return versions, self._by_bucket(self._parse_hashes(found, queued), len(requests))

    def settled_read(
        self, requests: Sequence[tuple[CountsKey, Sequence[int], int, int | None]]
    ) -> list[tuple[Version, Counts]]:
        """Store.settled_read: per hash (a bucket's, or each of its shards'), its size and
        "version", then its packed copy (_packed_key: the counts at a version, as one int64 array;
        see _pack), by slot (_read_settled); no hash reads as zeros, and a copy at the hash's
        version is its counts. The
        hashes without one are read as versioned_read reads them, in a second round trip, and a
        copy of each is written (SET with the bucket's expiry, in a third, failing quietly: the
        copy only saves time). A copy is never out of date in a way that matters: a later write
        gives the hash a new version (drawn at random, never reused), and the copy is then
        passed over and replaced."""
        plans = [(name, tuple(weights), k) for key, weights, k, _ in requests for name in self.bucket_hashes(key)]
        expiries = [expires_at for key, _, _, expires_at in requests for _ in self.bucket_hashes(key)]
        found = iter(self._read_settled([name for name, _, _ in plans], copies=True))
        hashes: list[tuple[int, Counts] | None] = []
        for name, weights, k in plans:
            size, version, packed = next(found), next(found), next(found)
            if not size:  # no hash (never written, or gone): zeros, as versioned_read reads it
                hashes.append(
                    (0, Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64)))
                )
                continue
            try:
                version = _version(version)
            except ValueError as error:
                raise _not_counts(name, weights, k, error) from None
            hashes.append(_unpack(packed, version, weights, k) if version and packed else None)
        missing = [i for i, held in enumerate(hashes) if held is None]
        if missing:
            with self._boundary("read"):
                pipe = self._pipeline()
                queued = self._queue_hashes(pipe, [plans[i] for i in missing])
                read = self._parse_hashes(iter(pipe.execute()), queued)
            pipe = self._pipeline()
            for i, (version, counts) in zip(missing, read):
                hashes[i] = (version, counts)
                if version:  # a hash that exists: 0 is no hash, whose zeros need no copy
                    pipe.set(_packed_key(plans[i][0]), _pack(version, counts), exat=expiries[i])
            with suppress(redis.RedisError):
                pipe.execute()
        return self._by_bucket(hashes, len(requests))  # type: ignore[arg-type]  # every None was read above

    def versions(self, keys: Sequence[CountsKey]) -> list[Version]:
        """Store.versions through read_settled.lua: one script call per slot, not one command
        per hash (a polled series of 720 buckets asks for all their versions)."""
        key_hashes = [self.bucket_hashes(key) for key in keys]
        found = self._read_settled([name for names in key_hashes for name in names])[1::2]
        at = iter(found)
        return [_joined([int(next(at) or 0) for _ in names]) for names in key_hashes]

    def _read_settled(self, names: list[str], *, copies: bool = False) -> list[Any]:  # as redis-py types them
        """The size and version of each of these hashes, in their order, and with copies its
        packed copy (or None) after them: one read_settled.lua call per slot (one on one Redis;
        one per shard on a cluster, each routed by its keys), not commands per hash, whose
        client-side cost was most of a 720-bucket read; with copies, one MGET per slot after it.
        A copy read after its hash's version can only match that version if it holds the counts
        at it (versions are never reused), so the two need not be one atomic read."""
        by_slot: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            by_slot.setdefault(name[: name.index("}")], []).append(i)
        each = 3 if copies else 2
        found: list[object] = [None] * (each * len(names))
        with self._boundary("read" if copies else "versions"):
            script = self._settled_script
            if script is None:
                script = self._settled_script = self._redis.register_script(_READ_SETTLED)
            for members in by_slot.values():
                hashes = [names[i] for i in members]
                answer = script(hashes)
                packed = self._redis.mget([_packed_key(name) for name in hashes]) if copies else None
                for position, i in enumerate(members):
                    found[each * i : each * i + 2] = answer[2 * position : 2 * position + 2]
                    if packed is not None:
                        found[each * i + 2] = packed[position]
        return found

    def _pipeline(self):
        return self._redis.pipeline(transaction=False) if not self._cluster else self._redis.pipeline()

    def _queue_hashes(
        self, pipe, plans: list[tuple[str, tuple[int, ...], int]]
    ) -> list[tuple[str, tuple[int, ...], int, bool]]:
        """Queue on pipe the commands reading each (hash, weights, k) with its version: HLEN and
        HMGET of exactly the design's fields and "version" where the design's field names are
        cached (a q-subset design; half the reply of HGETALL, which also sends the names),
        HGETALL otherwise. The plans, each marked with whether it is read by field."""
        queued = []
        for name, weights, k in plans:
            fields = _field_resp(weights, k, True) if self._packed else None
            if fields is None:
                pipe.hgetall(name)
            else:
                pipe.hlen(name)
                pipe.execute_command("HMGET", name, fields)
            queued.append((name, weights, k, fields is not None))
        return queued

    def _parse_hashes(
        self, found: Iterator[Any], queued: list[tuple[str, tuple[int, ...], int, bool]]
    ) -> list[tuple[int, Counts]]:
        """(version, counts) of each hash _queue_hashes queued, from the pipeline's answers. A hash
        read by field whose HLEN says it has other fields too (or changed in between) is read
        again with HGETALL (a second round trip)."""
        counts: list[tuple[int, Counts] | None] = []
        again = []
        for i, (name, weights, k, by_field) in enumerate(queued):
            if not by_field:
                counts.append(_checked_versioned(name, next(found), weights, k))
                continue
            size, values = next(found), next(found)
            try:
                flat, present = _integers(values[:-2])
                version = _version(values[-2])
                periods = periods_of(values[-1]) if size else frozenset()
            except (ValueError, OverflowError) as error:
                raise _not_counts(name, weights, k, error) from None
            # "batches", "version" and (but in a hash kept from before) "periods" besides the counts, or nothing
            if size != (present + 2 + (values[-1] is not None) if present else 0):
                counts.append(None)
                again.append(i)
                continue
            n, v = flat[: len(weights)], flat[len(weights) :].reshape(len(weights), k)
            counts.append((version, Counts(weights, n, v, periods)))
        if again:
            with self._boundary("read"):
                pipe = self._pipeline()
                for i in again:
                    pipe.hgetall(queued[i][0])
                for i, fields in zip(again, pipe.execute(), strict=True):
                    counts[i] = _checked_versioned(queued[i][0], fields, queued[i][1], queued[i][2])
        return counts  # type: ignore[return-value]

    @staticmethod
    def _by_bucket(hashes: list[tuple[int, Counts]], buckets: int) -> list[tuple[int | tuple[int, ...], Counts]]:
        """Each bucket's (version, counts) from its hashes' (one, or one per shard, in order)."""
        shards = len(hashes) // buckets if buckets else 1
        if shards == 1:
            return hashes  # type: ignore[return-value]
        return [_summed(hashes[i : i + shards]) for i in range(0, len(hashes), shards)]

    def since(self, metric: str, fingerprint: str, now: int) -> int:
        """SET NX GET: one round trip records the time unless one is there, and returns the old."""
        with self._boundary("since"):
            found = self._redis.set(since_key(metric, fingerprint, self._namespace), int(now), nx=True, get=True)
        return int(now) if found is None else int(found)

    def ping(self) -> None:
        """Redis answers (on a cluster: every master, and the shard count is known), and with
        wait_replicas=N at least N replicas are connected (to every master): fewer could not
        acknowledge any write, so the store counts as unavailable (health NOT_SERVING). On one
        Redis it must also answer within a second, take a write (a probe key) and evict
        nothing (StoreMisconfigured otherwise)."""
        if self._cluster:
            try:
                self._ping_cluster()
            except StoreError:
                # Maybe the client's map of the masters is out of date (a failover): the next
                # ping asks the cluster again.
                if isinstance(self._client, RedisCluster):
                    with suppress(Exception):
                        self._client.nodes_manager.initialize()
                raise
            return
        assert self._probe is not None  # one Redis has its probe client
        with self._boundary("ping"):
            pipe = self._probe.pipeline(transaction=False)
            pipe.info("memory")
            pipe.info("replication")
            pipe.set(self._probe_key, b"1", px=_PROBE_MS)
            memory, replication, _ = pipe.execute()
        policy = memory.get("maxmemory_policy", "noeviction")
        if policy != "noeviction":
            raise StoreMisconfigured(
                f"Redis at {self._where} evicts keys (maxmemory-policy {policy}): an evicted batch id would count a "
                "retried batch twice; set maxmemory-policy noeviction"
            )
        connected = int(replication.get("connected_slaves", 0))
        if connected < self._wait_replicas:
            raise StoreUnavailable(
                f"Redis at {self._where} has {connected} of the {self._wait_replicas} replicas each write waits for"
            )

    def _ping_cluster(self) -> None:
        self.shard_count()
        with self._boundary("ping"):
            if not self._wait_replicas:
                self._redis.ping(target_nodes=RedisCluster.PRIMARIES)
                return
            infos = self._redis.info("replication", target_nodes=RedisCluster.PRIMARIES)
            connected = min(int(info.get("connected_slaves", 0)) for info in infos.values())
        if connected < self._wait_replicas:
            raise StoreUnavailable(
                f"Redis Cluster at {self._where} has a master with {connected} of the "
                f"{self._wait_replicas} replicas each write waits for"
            )

    def remove_namespace(self) -> int:
        """Delete every key of this store's namespace, and no other; the number deleted. For a
        namespace one process owns (``veil demo``'s), once its aggregator has stopped."""
        if not self._namespace:
            raise ValueError("Only a namespace's keys can be removed, and this store has none.")
        removed = 0
        with self._boundary("remove"):
            keys = self._redis.scan_iter(match=f"veil:{{{quote(self._namespace, safe='')}:*", count=1000)
            while chunk := list(itertools.islice(keys, 1000)):
                removed += self._redis.unlink(*chunk)
        return removed

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._probe is not None:
            self._probe.close()

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
            if str(error).startswith(_REFUSING_FOR_NOW):
                raise StoreUnavailable(f"Redis at {self._where} refused {what} for now: {_line(error)}") from error
            raise StoreError(f"Redis at {self._where} failed {what}: {_line(error)}") from error
        except redis.RedisError as error:
            raise StoreError(f"Redis at {self._where} failed {what}: {_line(error)}") from error


def _at(shards: int, shard: int, version: int) -> tuple[int | None, ...]:
    """A sharded bucket's version as one write sees it: its shard's, None at the others."""
    return tuple(version if s == shard else None for s in range(shards))


def _joined(versions: list[int]) -> Version:
    """A bucket's version from its shards': the one shard's number, or the tuple of them; 0
    (no version) while no shard has one."""
    return versions[0] if len(versions) == 1 or not any(versions) else tuple(versions)


def _summed(shards: Sequence[tuple[int, Counts]]) -> tuple[Version, Counts]:
    """A bucket's (version, counts) from its shards' (version, counts)."""
    return _joined([version for version, _ in shards]), Counts.summed([c for _, c in shards])


def _cluster_seeds(url: str) -> dict[str, Any]:
    """RedisCluster's startup nodes, credentials and TLS from a
    ``redis+cluster://[user:password@]host:port,host:port`` URL (``rediss+cluster://`` for TLS,
    verifying the nodes against the system's roots or ``?ssl_ca_certs=/path/to/ca.crt``);
    ValueError when it is not one."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    tls = parts.scheme == "rediss+cluster"
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.path not in ("", "/", "/0") or parts.fragment or set(query) - ({"ssl_ca_certs"} if tls else set()):
        raise ValueError(
            "a cluster URL names hosts only (a cluster has one database, 0), and rediss+cluster:// "
            "may add ?ssl_ca_certs=/path/to/ca.crt."
        )
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"expected host:port, got {host!r}.")
        nodes.append(ClusterNode(name.strip("[]"), int(port)))
    seeds: dict[str, object] = {
        "startup_nodes": nodes,
        "username": unquote(username) or None,
        "password": unquote(password) or None,
        "ssl": tls,
    }
    if "ssl_ca_certs" in query:
        seeds["ssl_ca_certs"] = query["ssl_ca_certs"][-1]
    return seeds


def _cluster_client(seeds: dict[str, Any], packer: _Packer | None, options: dict[str, Any]) -> RedisCluster:
    if packer is not None:
        # The cluster client makes each node's client itself, taking no packer; every new
        # connection gets it here, before its first command.
        def use_packer(connection: redis.Connection) -> None:
            connection._command_packer = packer

        options = {**options, "redis_connect_func": use_packer}
    return RedisCluster(**seeds, **options)


def _increments(counts: Counts) -> list[str | int]:
    """Field, increment pairs of the non-zero counts: n:<t> and v:<t>:<j>, t a report weight."""
    names = _field_names(counts.weights, counts.k)
    if names is None:
        weights = np.asarray(counts.weights, dtype=np.int64)
        (ns,) = np.nonzero(counts.n)
        rows, cols = np.nonzero(counts.v)
        fields = [f"n:{t}" for t in weights[ns].tolist()]
        fields += [f"v:{t}:{j}" for t, j in zip(weights[rows].tolist(), cols.tolist(), strict=True)]
        values = counts.n[ns].tolist() + counts.v[rows, cols].tolist()  # Python ints: redis-py encodes no numpy
    else:
        flat = np.concatenate([counts.n, counts.v.ravel()])
        (present,) = np.nonzero(flat)
        fields = names[present].tolist()
        values = flat[present].tolist()
    pairs: list[str | int] = [0] * (2 * len(fields))
    pairs[0::2] = fields
    pairs[1::2] = values
    return pairs


class _Resp:
    """Command arguments already encoded in RESP: how many, and their bytes. _Packer splices
    them in as they are. A script call carries some 2000 field and increment arguments at
    k = 1024, which redis-py and hiredis encode one Python object at a time (about 0.5 ms);
    from cached pieces the same bytes take a join."""

    __slots__ = ("count", "data")

    def __init__(self, count: int, data: bytes) -> None:
        self.count = count
        self.data = data


class _CommandPacker(Protocol):
    def pack(self, *args: object) -> list[bytes]: ...


class _Packer:
    """redis-py's own command packer, except for a command whose last argument is a _Resp:
    that one is written here, the _Resp's bytes spliced in after the other arguments."""

    def __init__(self, inner: _CommandPacker) -> None:
        self._inner = inner

    def pack(self, *args: object) -> list[bytes]:
        if not args or not isinstance(args[-1], _Resp):
            return self._inner.pack(*args)
        tail = args[-1]
        head = b"".join(_bulk(arg) for arg in args[:-1])
        return [b"*%d\r\n" % (len(args) - 1 + tail.count) + head + tail.data]


def _bulk(arg: object) -> bytes:
    if isinstance(arg, str):
        arg = arg.encode()
    elif isinstance(arg, int):
        arg = b"%d" % arg
    elif not isinstance(arg, bytes):
        raise TypeError(f"cannot encode {type(arg).__name__} for Redis")
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def _packer() -> _Packer | None:
    """The packer redis-py would use, wrapped; None where this redis-py lacks what it needs
    (the increments then go as plain arguments)."""
    try:
        from redis._parsers import Encoder
        from redis.connection import HiredisRespSerializer, PythonRespSerializer
        from redis.utils import HIREDIS_AVAILABLE
    except ImportError:
        return None
    if HIREDIS_AVAILABLE:
        return _Packer(HiredisRespSerializer())  # type: ignore[arg-type]  # redis-py types pack()'s arguments as lists
    return _Packer(PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode))


_SMALL = 1 << 14
_SMALL_VALUES = np.empty(_SMALL, object)  # b"$<digits>\r\n<v>\r\n" for v < _SMALL
_SMALL_VALUES[:] = [_bulk(v) for v in range(_SMALL)]
_FIELD_PIECES: dict[tuple[tuple[int, ...], int], np.ndarray] = {}


def _increments_resp(counts: Counts) -> _Resp:
    """_increments(counts), RESP-encoded."""
    names = _field_names(counts.weights, counts.k)
    if names is None:
        pairs = _increments(counts)
        return _Resp(len(pairs), b"".join(_bulk(arg) for arg in pairs))
    pieces = _FIELD_PIECES.get((counts.weights, counts.k))
    if pieces is None:
        pieces = np.empty(len(names), object)
        pieces[:] = [_bulk(name) for name in names.tolist()]
        if len(_FIELD_PIECES) >= 64:
            _FIELD_PIECES.clear()
        _FIELD_PIECES[counts.weights, counts.k] = pieces
    flat = np.concatenate([counts.n, counts.v.ravel()])
    (present,) = np.nonzero(flat)
    values = flat[present]
    out = np.empty(2 * present.size, object)
    out[0::2] = pieces[present]
    if values.size and values.max() < _SMALL:
        out[1::2] = _SMALL_VALUES[values]
    else:
        out[1::2] = [_bulk(v) for v in values.tolist()]
    return _Resp(out.size, b"".join(out.tolist()))


_FIELD_RESPS: dict[tuple[tuple[int, ...], int, bool], _Resp] = {}


def _field_resp(weights: tuple[int, ...], k: int, version: bool = False) -> _Resp | None:
    """Every field name of the design, RESP-encoded (HMGET's arguments), then "version" and
    "periods" when asked; None as for _field_names."""
    resp = _FIELD_RESPS.get((weights, k, version))
    if resp is None:
        names = _field_names(weights, k)
        if names is None:
            return None
        listed = names.tolist() + ([b"version", b"periods"] if version else [])
        resp = _Resp(len(listed), b"".join(_bulk(name) for name in listed))
        if len(_FIELD_RESPS) >= 64:
            _FIELD_RESPS.clear()
        _FIELD_RESPS[weights, k, version] = resp
    return resp


_NAMED_FIELDS = 1 << 16  # designs with at most this many counters have their field names cached
_FIELD_NAMES: dict[tuple[tuple[int, ...], int], np.ndarray] = {}


def _field_names(weights: tuple[int, ...], k: int) -> np.ndarray | None:
    """The field names (bytes, in an object array) of n, then of V row by row, of a design
    with few enough counters (a q-subset design has k + 1); None for larger ones (RAPPOR)."""
    if len(weights) * (k + 1) > _NAMED_FIELDS:
        return None
    names = _FIELD_NAMES.get((weights, k))
    if names is None:
        listed = [f"n:{t}".encode() for t in weights] + [f"v:{t}:{j}".encode() for t in weights for j in range(k)]
        names = np.empty(len(listed), object)
        names[:] = listed
        if len(_FIELD_NAMES) >= 64:
            _FIELD_NAMES.clear()
        _FIELD_NAMES[weights, k] = names
    return names


def _checked_counts(name: str, found: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> Counts:
    """Counts from HGETALL's fields; StoreError when the hash does not hold counts of this design."""
    try:
        return _counts_of(found, weights, k)
    except (ValueError, OverflowError) as error:  # OverflowError: a value int64 cannot hold
        raise _not_counts(name, weights, k, error) from None


def _checked_versioned(name: str, found: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> tuple[int, Counts]:
    """The version and the counts in HGETALL's fields; StoreError as _checked_counts."""
    try:
        version = _version(found.get(b"version"))
        periods = periods_of(found.pop(b"periods", None)) if found else frozenset()
    except (ValueError, OverflowError) as error:
        raise _not_counts(name, weights, k, error) from None
    counts = _checked_counts(name, found, weights, k)
    counts.periods = periods
    return version, counts


def _version(value: bytes | None) -> int:
    """A hash's "version" field: 0 when not set; ValueError when not a whole number."""
    if value is None:
        return 0
    if not value.isdigit():
        raise ValueError(f"version is {value!r}, not a whole number")
    return int(value)


def _not_counts(name: str, weights: tuple[int, ...], k: int, error: Exception) -> StoreError:
    design = f"{len(weights)} weights, k = {k}"
    return StoreError(f"Redis hash {name} does not hold counts of this design ({design}): {error}")


_INT64_MAX = np.iinfo(np.int64).max
_DIGITS = b"0123456789"


def _integers(values: list[bytes | None]) -> tuple[np.ndarray, int]:
    """HMGET's values as int64, a field not set (None) as 0, and how many were set; ValueError
    (or OverflowError) when one is not an integer int64 holds.

    The values are joined with spaces and parsed by numpy in one call (some 5x faster at
    k = 1024 than an array of bytes objects cast to int64), but only when each is certainly
    what Redis writes for a count: digits, and fewer than int64's limit (numpy saturates).
    Anything else goes the strict way, whose result or error it then is."""
    try:
        text = b" ".join(values)  # type: ignore[arg-type]  # a full hash: no None (a None raises TypeError)
        present = len(values)
    except TypeError:
        present = len(values) - values.count(None)
        text = b" ".join([b"0" if value is None else value for value in values])
    count = len(values)
    # Only digits besides the count - 1 separators, and no empty value.
    if (
        count
        and len(text.translate(None, _DIGITS)) == count - 1
        and b"  " not in text
        and text[:1] != b" "
        and text[-1:] != b" "
    ):
        flat = np.fromstring(text, dtype=np.int64, sep=" ")
        if flat.size == count and flat.max() < _INT64_MAX:
            return flat, present
    return np.array([b"0" if value is None else value for value in values]).astype(np.int64), present


def _counts_of(fields: dict[bytes, bytes], weights: tuple[int, ...], k: int) -> Counts:
    """Parse a hash's fields into Counts; ValueError when a field does not fit the design."""
    counts = Counts(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), k), np.int64))
    fields.pop(b"batches", None)
    fields.pop(b"version", None)
    fields.pop(b"periods", None)  # not counts: _checked_versioned reads them
    if not fields:
        return counts
    positions = _field_positions(weights, k)
    if positions is not None:
        try:
            where = [positions[name] for name in fields]
        except KeyError:
            pass  # a field of another design: the general parser below names it
        else:
            flat = np.zeros(len(weights) * (k + 1), np.int64)
            flat[where] = np.array(list(fields.values())).astype(np.int64)
            counts.n[:] = flat[: len(weights)]
            counts.v[:] = flat[len(weights) :].reshape(len(weights), k)
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


_FIELD_POSITIONS: dict[tuple[tuple[int, ...], int], dict[bytes, int]] = {}


def _field_positions(weights: tuple[int, ...], k: int) -> dict[bytes, int] | None:
    """Field name -> its position in _field_names(weights, k), for designs that have those."""
    positions = _FIELD_POSITIONS.get((weights, k))
    if positions is None:
        names = _field_names(weights, k)
        if names is None:
            return None
        positions = {name: i for i, name in enumerate(names.tolist())}
        if len(_FIELD_POSITIONS) >= 64:
            _FIELD_POSITIONS.clear()
        _FIELD_POSITIONS[weights, k] = positions
    return positions


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
    if parts.scheme.endswith("+cluster"):
        return parts.netloc.rpartition("@")[2]
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


def _line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
