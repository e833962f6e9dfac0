"""RedisStore: integer counters in Redis hashes, one atomic Lua script call per set of batches.

The keys and their hash tags are in keys; a Redis Cluster's seeds and shards in cluster; the
command encoding that sends a script call's counts pre-encoded in resp; the reading of replies
into counts in replies.

Needs Redis >= 7.0 (EXPIREAT ... GT, PEXPIRETIME in add_batch.lua), and ``maxmemory-policy
noeviction`` (Redis's default): an evicted batch id would let a retried batch count twice, so
``ping`` raises StoreMisconfigured under any other policy. A Redis that answers but refuses
writes (memory full under noeviction, a failed RDB save or AOF write, a read-only replica) is
StoreUnavailable, never a final error, and ``ping`` writes a short-lived probe key to find it.

A bucket's version, which caches compare, is a random 63-bit number each script call writes
along with its counts, not the number of batches: after a failover or a restore lost writes,
"batches" can climb back to a number it had before, with other counts behind it, while a
drawn version does not come back (the chance is 2^-63 per write).

Group commit: every batch bound for one Redis (on a cluster, for one master) goes in one
script call with the others queued meanwhile (see _coalesce), ``add_many``'s set of batches
(an upload of a device's metrics) in one call whole. The call holds groups: batches of the same
metric, shard, targets, dedupe TTL, design and period, whose counts are summed and added once
per target. For each group the script checks every batch id first and, when all are new,
remembers them all and adds the group's counts; when some were already applied it adds nothing
of the group and names them, and the group's rest goes again, in a second call, summed again.
So a call costs about what one batch did, however many batches and metrics it carries, and
every id is still counted at most once: the script is one atomic step, ids repeated within a
group are sent once (the later copies answer "duplicate"), an id in two groups of a call counts
in the first, and when a call fails every batch in it hears StoreUnavailable and is retried by
its own client under its own id. A group whose command fails in Redis (data that is not
Veil's) fails its own batches only. ``coalesce`` caps the batches per call; 1 sends every
``add`` on its own.

On a cluster there is one call per master, all written before any answer is read (so a set
waits once, however many masters its batches' shards are on), each spanning the slots of the
shards its master holds (the script's ``allow-cross-slot-keys`` flag; the keys in its
arguments, one declared to route it). A call whose routing key's slot has moved or is moving
(MOVED, ASK, TRYAGAIN) runs nowhere, and a group whose slot is not its master's fails there
before any write of it; those go again per slot, as the slot map has it when read again. A
master whose call fails (no answer, an error, too few replicas acknowledging) fails its own
call's batches only: every other master's answer is still read, since a connection holding an
unread answer would hand it to its next command.

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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar, cast
from urllib.parse import quote, urlsplit

import numpy as np
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterCrossSlotError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry
from redis.typing import EncodableT

from ...counts import PERIOD_NOT_SAID, Counts
from ...errors import StoreError, StoreMisconfigured, StoreUnavailable
from .._base import AppliedObserver, BatchWrite, CountsKey, FlushObserver, Store, Version
from .._checks import check_write
from .._coalesce import Coalescer
from .._periods import periods_of
from .cluster import cluster_client, cluster_seeds, joined_version, shard_version, summed_shards
from .fields import increments
from .keys import MAX_SHARDS, SHARDS_KEY, counts_key, dedupe_key, packed_key, shard_of, shard_tags, since_key
from .packed import pack_counts, unpack_counts
from .replies import checked_versioned, integers, not_counts, parse_version
from .resp import Resp, command_packer, field_resp, increments_resp, joined

__all__ = ["RedisStore"]


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

# Error replies (also from inside add_batch.lua) that a later retry can turn into success: a
# script running long, a failed RDB save or AOF write (a full disk), too few replicas, loading.
_REFUSING_FOR_NOW = ("BUSY", "MISCONF", "NOREPLICAS", "LOADING", "MASTERDOWN", "OOM", "READONLY")
_PROBE_KEY = "veil:probe"  # written by every ping (PX below), so a store refusing writes is seen
_PROBE_MS = 10_000
_PING_TIMEOUT = 1.0  # seconds: health follows a frozen Redis within about a ping period


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
        packer = command_packer()
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
            seeds = cluster_seeds(url)  # a bad URL is refused now; the nodes are asked on first use
            self._connect = lambda: cluster_client(seeds, packer, options)
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
        self._packed = packer is not None  # the increments go pre-encoded (see Resp)
        self._coalescer: Coalescer[BatchWrite, bool | StoreError] | None = (
            Coalescer(self._write_set, max_batches=coalesce) if coalesce > 1 else None
        )
        self._flush_observers: list[FlushObserver] = []
        self._applied_observers: list[AppliedObserver] = []
        self._keys: dict[tuple[CountsKey, str], str] = {}  # counts_key() of recent targets and shards
        self._tags: dict[str, tuple[str, ...]] = {}  # shard_tags() of recent metrics
        self._masters: dict[str, tuple[str, redis.Redis]] = {}  # a cluster: a shard tag's master, its client

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
            recorded = client.get(SHARDS_KEY)
            if recorded is None:
                client.set(SHARDS_KEY, self._wanted_shards or len(client.get_primaries()), nx=True)
                recorded = client.get(SHARDS_KEY)
        assert recorded is not None  # set just now, by this aggregator or another
        shards = int(recorded)
        if self._wanted_shards and shards != self._wanted_shards:
            raise StoreError(
                f"Redis Cluster at {self._where} splits counters over {shards} shards ({SHARDS_KEY}), "
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
                        observer(
                            target, shard_version(shards, shard, before[i]), shard_version(shards, shard, after), counts
                        )
                except Exception:  # noqa: BLE001 (an observer must never fail a write)
                    pass

    def add(self, write: BatchWrite) -> bool:
        """True when this call applied the batch. A retry after an attempt that was applied but
        not acknowledged answers False (already counted), as for any duplicate."""
        check_write(write)
        result = self._observed([write])[0] if self._coalescer is None else self._coalescer.submit(None, write)
        if isinstance(result, StoreError):
            raise result
        return result

    def add_many(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        """One script call for all the writes (on a cluster one per master, side by side), with
        whatever else is queued meanwhile; a group (_group_of) that fails in Redis, or whose
        master's call fails, fails its own writes only."""
        for write in writes:
            check_write(write)
        try:
            if self._coalescer is None:
                return self._observed(writes)
            return list(self._coalescer.submit_many(None, writes))
        except StoreError as err:
            return [err] * len(writes)

    def _master_of(self, tag: str) -> tuple[str, redis.Redis]:
        """The name and the node's own client of the master of a shard tag's slot: redis-py's
        cluster client costs some 50 us of CPU per call more, with nothing to gain here."""
        found = self._masters.get(tag)
        if found is None:
            with self._boundary("add"):
                cluster = self._redis_cluster
                node = cluster.get_node_from_key(f"{{{tag}}}")
                found = (node.name, cluster.get_redis_connection(node))
            if len(self._masters) >= 4096:
                self._masters.clear()
            self._masters[tag] = found
        return found

    def _group_of(self, write: BatchWrite) -> tuple:
        """What a group of one script call shares: add_batch.lua adds a group's summed counts
        to one set of targets, with one TTL and period, on one shard (whose slot its dedupe
        keys and counter hashes share), of one design."""
        shard = shard_of(write.batch_id, len(self._shard_tags(write.metric)))
        period = PERIOD_NOT_SAID if write.period is None else write.period
        return (write.metric, shard, write.targets, write.dedupe_ttl, write.counts.weights, write.counts.k, period)

    def _observed(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        started = time.perf_counter()
        failed = True
        try:
            results = self._write_set(writes)
            failed = False
            return results
        finally:
            for observer in self._flush_observers:
                observer(len(writes), time.perf_counter() - started, failed)

    def _write_set(self, writes: Sequence[BatchWrite]) -> list[bool | StoreError]:
        """Apply writes bound for one Redis (on a cluster, one master): every group of them
        (_group_of) in one script call, then again, in another, the groups that named ids
        applied before, without those. For each write True when this call applied it, False
        when its id had been applied before (or is repeated here: its first copy counts), or
        the StoreError of its group."""
        results: list[bool | StoreError] = [False] * len(writes)
        groups: dict[tuple, dict[bytes, int]] = {}
        for i, write in enumerate(writes):
            groups.setdefault(self._group_of(write), {}).setdefault(write.batch_id, i)
        pending = [list(ids.values()) for ids in groups.values()]
        while pending:
            again = []
            for members, answer in zip(pending, self._write_groups(writes, pending)):
                if isinstance(answer, StoreError):
                    for i in members:  # each caller raises its own exception object
                        results[i] = _copy(answer)
                elif answer:
                    seen = {members[position - 1] for position in answer}
                    rest = [i for i in members if i not in seen]
                    if rest:
                        again.append(rest)
                else:
                    for i in members:
                        results[i] = True
            pending = again
        return results

    def _write_groups(self, writes: Sequence[BatchWrite], groups: list[list[int]]) -> list[list[int] | StoreError]:
        """One add_batch.lua call (per slot where a cluster's slots are moving) adding each
        group of writes (positions in writes, of one _group_of): for each group, [] when it
        was applied, the positions (1-based) of its ids found applied before, or the
        StoreError that failed it. Raises what fails the whole call."""
        sections = [self._section([writes[i] for i in members]) for members in groups]
        try:
            with self._boundary("add"):
                replies = self._run_script(sections, sum(len(members) for members in groups))
        except BaseException:
            if self._applied_observers:
                for section in sections:
                    self._notify(section.counted, section.shard, None, section.version, None)
            raise
        answers: list[list[int] | StoreError] = []
        for section, reply in zip(sections, replies):
            if not isinstance(reply, StoreError):
                if reply[0] == -2:
                    reply = StoreError(f"Redis at {self._where} failed add: {_line(Exception(reply[1].decode()))}")
                else:
                    reply = [int(a) for a in reply]
            if isinstance(reply, StoreError):
                if self._applied_observers:
                    self._notify(section.counted, section.shard, None, section.version, None)
                answers.append(reply)
            elif reply[0] == 0:  # applied: {0, each target's version before}
                if self._applied_observers:
                    self._notify(section.counted, section.shard, reply[1:], section.version, section.added)
                answers.append([])
            else:
                answers.append(reply)
        return answers

    def _section(self, writes: list[BatchWrite]) -> _Section:
        """The part of a script call that adds a group of writes (one _group_of, distinct ids)."""
        first = writes[0]
        tags = self._shard_tags(first.metric)
        shard = shard_of(first.batch_id, len(tags))
        tag = tags[shard]
        targets = [self._counts_key(key, tag) for key, _ in first.targets]
        counts = first.counts if len(writes) == 1 else Counts.summed([write.counts for write in writes])
        period = PERIOD_NOT_SAID if first.period is None else first.period
        version = 1 + secrets.randbelow(_VERSIONS)  # never 0, which stands for "no version"
        ids = [dedupe_key(first.metric, write.batch_id, tag) for write in writes]
        args: list[int | str | Resp] = [len(writes), len(targets), int(first.dedupe_ttl), version, period]
        args += [*ids, *targets, *("" if at is None else int(at) for _, at in first.targets)]
        if self._packed:
            encoded = increments_resp(counts)
            args += [encoded.count, encoded]
        else:
            pairs = increments(counts)
            args += [len(pairs), *pairs]
        return _Section(
            tag=tag,
            shard=shard,
            route=ids[0],
            args=args,
            batches=len(writes),
            counted=[key for key, _ in first.targets],
            version=version,
            added=Counts(counts.weights, counts.n, counts.v, frozenset((period,))),
        )

    def _run_script(self, sections: list[_Section], batches: int) -> list[Any]:
        """The script's answer for these sections (with WAIT when asked). On a cluster, one call
        per master, all written before any answer is read (one wait for all), and the sections
        whose slots turn out to be elsewhere or moving again per slot; the sections of a master
        or slot whose call failed are answered by the StoreError that failed them."""
        script = self._script()
        if not self._cluster:
            client = self._redis
            assert isinstance(client, redis.Redis)  # one Redis: not a cluster's client
            return self._call(script, client, sections, batches)
        masters: dict[str, list[int]] = {}
        for n, section in enumerate(sections):
            masters.setdefault(self._master_of(section.tag)[0], []).append(n)
        parts = [(self._master_of(sections[m[0]].tag)[1], [sections[n] for n in m]) for m in masters.values()]
        if len(parts) == 1:
            try:
                answers: list[Any] = [self._call(script, parts[0][0], parts[0][1], batches)]
            except (redis.ConnectionError, redis.TimeoutError, ResponseError) as error:
                answers = [error]
        else:
            answers = self._call_masters(script, parts)
            for i, answer in enumerate(answers):
                if isinstance(answer, (redis.ConnectionError, redis.TimeoutError)):
                    # Again through redis-py, with the retries its own calls get (a script applied
                    # but not answered finds its ids applied: the batches answer duplicate).
                    try:
                        answers[i] = self._call(script, parts[i][0], parts[i][1], batches)
                    except (redis.ConnectionError, redis.TimeoutError, ResponseError) as error:
                        answers[i] = error
        replies: list[Any] = [None] * len(sections)
        elsewhere: list[int] = []
        for members, answer in zip(masters.values(), answers):
            if isinstance(answer, (AskError, TryAgainError, ClusterCrossSlotError)):
                elsewhere += members  # a redirection of the call's routing key: it ran nowhere
            elif isinstance(answer, BaseException):
                if isinstance(answer, (redis.ConnectionError, redis.TimeoutError)):
                    self._masters.clear()  # a failover, maybe: the next call asks the cluster again
                    with suppress(Exception):
                        self._redis_cluster.nodes_manager.initialize()
                if len(parts) == 1:
                    raise answer
                failed = self._translated(answer)
                for n in members:
                    replies[n] = failed
            else:
                for n, reply in zip(members, answer):
                    replies[n] = reply
                    if reply[0] == -2 and _misrouted(reply[1]):
                        elsewhere.append(n)  # its slot is not this master's: it failed before any write
        if elsewhere:
            self._masters.clear()
            with suppress(Exception):
                self._redis_cluster.nodes_manager.initialize()
        slots: dict[str, list[int]] = {}
        for n in elsewhere:
            slots.setdefault(sections[n].tag, []).append(n)
        for members in slots.values():
            part = [sections[n] for n in members]
            try:
                with self._boundary("add"):
                    answer = self._run_on_master(script, part)
            except StoreError as error:
                answer = [error] * len(part)
            for n, reply in zip(members, answer):
                replies[n] = reply
        return replies

    def _translated(self, error: BaseException) -> StoreError:
        """The StoreError that _boundary makes of a redis-py error."""
        try:
            with self._boundary("add"):
                raise error
        except StoreError as translated:
            return translated
        raise AssertionError("unreachable")

    def _call_masters(self, script: Script, parts: list[tuple[redis.Redis, list[_Section]]]) -> list[Any]:
        """_call on several masters at once: every call (and its WAIT) written on a connection of
        its master before any answer is read, so that they run side by side and the caller
        waits once. For each, its answer, or the error it ended with (redis-py's, or
        StoreUnavailable when too few replicas acknowledged).

        A connection goes back to its pool only with every reply sent for read: one whose
        replies were left unread would hand them to its next command (another call's answer
        taken for this one's). So one master's failure never stops the others' answers being
        read, and a connection left mid-exchange by anything else is closed, not reused."""
        answers: list[Any] = [None] * len(parts)
        taken: list[redis.Connection | None] = [None] * len(parts)
        in_step = [False] * len(parts)
        try:
            for i, (client, sections) in enumerate(parts):
                try:
                    taken[i] = client.connection_pool.get_connection()
                    self._send(taken[i], script.sha, sections)  # type: ignore[arg-type]  # taken just now
                except redis.RedisError as error:
                    answers[i] = error  # the connection is closed below (maybe partly written)
            for i, (held, (_, sections)) in enumerate(zip(taken, parts)):
                if answers[i] is None and held is not None:
                    try:
                        answers[i] = self._receive(held, script, sections)
                        in_step[i] = True
                    except StoreUnavailable as error:  # every reply read: too few replicas acknowledged
                        answers[i] = error
                        in_step[i] = True
                    except redis.RedisError as error:
                        answers[i] = error
                        in_step[i] = isinstance(error, ResponseError)  # an error reply, read in full
        finally:
            for (client, _), held, settled in zip(parts, taken, in_step):
                if held is not None:
                    if not settled:
                        held.disconnect()
                    client.connection_pool.release(held)
        return answers

    def _send(self, connection: redis.Connection, sha: str, sections: list[_Section]) -> None:
        args = [arg for section in sections for arg in section.args]
        connection.send_command("EVALSHA", sha, 1, sections[0].route, *([joined(args)] if self._packed else args))
        if self._wait_replicas:
            connection.send_command("WAIT", self._wait_replicas, self._wait_timeout_ms)

    def _receive(self, connection: redis.Connection, script: Script, sections: list[_Section]) -> Any:
        """The answer to what _send sent (loading the script and sending again on NOSCRIPT);
        error replies raised once every reply sent for is read, so the connection stays in step."""
        answer = _reply(connection)
        acked = _reply(connection) if self._wait_replicas else 0
        if isinstance(answer, NoScriptError):
            connection.send_command("SCRIPT", "LOAD", script.script)
            script.sha = connection.read_response().decode()
            self._send(connection, script.sha, sections)
            answer = _reply(connection)
            acked = _reply(connection) if self._wait_replicas else 0
        for reply in (answer, acked):
            if isinstance(reply, ResponseError):
                raise reply
        if acked < self._wait_replicas:
            batches = sum(section.batches for section in sections)
            raise StoreUnavailable(self._unacknowledged(acked, batches))
        return answer

    def _call(self, script: Script, client: redis.Redis, sections: list[_Section], batches: int) -> list[Any]:
        """One call of the script with the sections' keys and arguments on this client, and
        WAIT after it when asked (WAIT counts the writes of its own connection: one pipeline)."""
        keys = [sections[0].route]  # see add_batch.lua: the call's other keys are in args
        args = [arg for section in sections for arg in section.args]
        # A Resp goes through redis-py untouched, to Packer, which writes it (redis-py's types know none).
        wire_args = cast("list[EncodableT]", [joined(args)] if self._packed else args)
        if not self._wait_replicas:
            return script(keys, wire_args, client=client)
        pipe = client.pipeline(transaction=False)
        script(keys, wire_args, client=pipe)
        pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
        answer, acked = pipe.execute()
        if acked < self._wait_replicas:
            raise StoreUnavailable(self._unacknowledged(acked, batches))
        return answer

    def _unacknowledged(self, acked: int, batches: int) -> str:
        what = "the batch" if batches == 1 else f"a group of {batches} batches"
        return (
            f"Redis at {self._where}: {acked} of {self._wait_replicas} replicas acknowledged {what} "
            f"within {self._wait_timeout_ms} ms; it may have been applied, and a retry counts it at most once"
        )

    def _run_on_master(self, script: Script, sections: list[_Section]) -> list[Any]:
        """The script for sections of one slot, on its master. A MOVED (the slot has moved: the
        script did not run) is followed once, after the slot map is read again; an ASK or
        TRYAGAIN (the slot is moving) or a connection error raises, and the caller's retry
        finds the new map."""
        batches = sum(section.batches for section in sections)
        for attempt in (1, 2):
            try:
                return self._call(script, self._master_of(sections[0].tag)[1], sections, batches)
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
        versions = [joined_version([int(next(found) or 0) for _ in names]) for names in key_hashes]
        return versions, self._by_bucket(self._parse_hashes(found, queued), len(requests))

    def settled_read(
        self, requests: Sequence[tuple[CountsKey, Sequence[int], int, int | None]]
    ) -> list[tuple[Version, Counts]]:
        """Store.settled_read: per hash (a bucket's, or each of its shards'), its size and
        "version", then its packed copy (packed_key: the counts at a version, as one int64 array;
        see pack_counts), by slot (_read_settled); no hash reads as zeros, and a copy at the hash's
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
                version = parse_version(version)
            except ValueError as error:
                raise not_counts(name, weights, k, error) from None
            hashes.append(unpack_counts(packed, version, weights, k) if version and packed else None)
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
                    pipe.set(packed_key(plans[i][0]), pack_counts(version, counts), exat=expiries[i])
            with suppress(redis.RedisError):
                pipe.execute()
        return self._by_bucket(hashes, len(requests))  # type: ignore[arg-type]  # every None was read above

    def versions(self, keys: Sequence[CountsKey]) -> list[Version]:
        """Store.versions through read_settled.lua: one script call per slot, not one command
        per hash (a polled series of 720 buckets asks for all their versions)."""
        key_hashes = [self.bucket_hashes(key) for key in keys]
        found = self._read_settled([name for names in key_hashes for name in names])[1::2]
        at = iter(found)
        return [joined_version([int(next(at) or 0) for _ in names]) for names in key_hashes]

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
                packed = self._redis.mget([packed_key(name) for name in hashes]) if copies else None
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
            fields = field_resp(weights, k, True) if self._packed else None
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
                counts.append(checked_versioned(name, next(found), weights, k))
                continue
            size, values = next(found), next(found)
            try:
                flat, present = integers(values[:-2])
                version = parse_version(values[-2])
                periods = periods_of(values[-1]) if size else frozenset()
            except (ValueError, OverflowError) as error:
                raise not_counts(name, weights, k, error) from None
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
                    counts[i] = checked_versioned(queued[i][0], fields, queued[i][1], queued[i][2])
        return counts  # type: ignore[return-value]

    @staticmethod
    def _by_bucket(hashes: list[tuple[int, Counts]], buckets: int) -> list[tuple[int | tuple[int, ...], Counts]]:
        """Each bucket's (version, counts) from its hashes' (one, or one per shard, in order)."""
        shards = len(hashes) // buckets if buckets else 1
        if shards == 1:
            return hashes  # type: ignore[return-value]
        return [summed_shards(hashes[i : i + shards]) for i in range(0, len(hashes), shards)]

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


@dataclass(frozen=True)
class _Section:
    """A group's part of a script call: its keys and arguments (add_batch.lua's), and what
    observers hear of it: the buckets it adds to, its new version and the counts added."""

    tag: str  # the hash tag of its shard
    shard: int
    route: str  # a key of its slot, which a cluster routes a call by
    args: list[int | str | Resp]
    batches: int
    counted: list[CountsKey]
    version: int
    added: Counts


def _reply(connection: redis.Connection) -> Any:
    """The next reply on the connection; an error reply returned, not raised."""
    try:
        return connection.read_response()
    except ResponseError as error:
        return error


def _misrouted(message: bytes) -> bool:
    """Whether a group failed because its slot is not (or not wholly) on the node it was sent to."""
    return b"non local key" in message or b"cluster is down" in message


def _copy(error: StoreError) -> StoreError:
    """A fresh exception of the same class and message (one per caller that raises it)."""
    return type(error)(*error.args)


def _address(url: str) -> str:
    """Where the store is, for messages: host:port or socket path, never the password."""
    parts = urlsplit(url)
    if parts.scheme.endswith("+cluster"):
        return parts.netloc.rpartition("@")[2]
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


def _line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
