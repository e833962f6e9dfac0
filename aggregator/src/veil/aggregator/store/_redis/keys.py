"""The Redis key grammar and the shard tags of RedisStore.

Every key carries a hash tag, <tag>, so that a batch's keys share one Redis Cluster slot;
metric, fingerprint and window are percent-encoded, so no name can break the grammar, escape
the tag or collide with another:

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
    veil:shards                                     a cluster's shard count (see cluster)

On one Redis the tag is the metric: one shard. A store given a ``namespace`` (``veil demo``
draws one per run) tags its keys ``<namespace>:<metric>`` (its probe key too), so they are its
own and ``remove_namespace`` finds and deletes them all. On a Redis Cluster each metric's
counters are split over S shards: shard s has the tag ``<metric>#<s>.<j>``, j the first number
that hashes it into the s-th of S equal ranges of the 16384 slots (so a cluster whose masters
hold equal ranges, as ``redis-cli --cluster create`` makes, holds S / masters shards each), and
a batch goes to the shard crc32(batch id) mod S, all of it.
"""

from __future__ import annotations

import zlib
from urllib.parse import quote

from redis.crc import key_slot

from .._base import CountsKey

__all__ = [
    "MAX_SHARDS",
    "SHARDS_KEY",
    "counts_key",
    "dedupe_key",
    "packed_key",
    "shard_of",
    "shard_tags",
    "since_key",
]


_SLOTS = 16384
SHARDS_KEY = "veil:shards"  # a cluster's shard count, written once by the first aggregator
MAX_SHARDS = 1024


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


def packed_key(counts_hash: str) -> str:
    """The Redis string holding the packed copy of a counts hash (Store.settled_read): its key
    with "c" made "q", so in the same slot ("p" held copies without the periods)."""
    head, _, rest = counts_hash.partition("}:c:")
    return f"{head}}}:q:{rest}"


def dedupe_key(metric: str, batch_id: bytes, tag: str | None = None) -> str:
    """The Redis key remembering that a batch id of a metric has been applied."""
    return f"veil:{{{tag or _tag(metric)}}}:b:{batch_id.hex()}"
