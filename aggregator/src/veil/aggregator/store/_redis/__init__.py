"""RedisStore (store), its keys and shard tags (keys), a Redis Cluster's seeds and shards
(cluster), the RESP fast path of its script calls (resp), the counts hash's fields (fields),
replies read into counts (replies) and ended buckets' packed copies (packed)."""

from .keys import MAX_SHARDS, counts_key, dedupe_key, shard_of, shard_tags, since_key
from .store import RedisStore

__all__ = ["MAX_SHARDS", "RedisStore", "counts_key", "dedupe_key", "shard_of", "shard_tags", "since_key"]
