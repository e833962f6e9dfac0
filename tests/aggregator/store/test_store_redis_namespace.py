"""RedisStore's namespace (`veil demo --redis`'s): counts of their own, and remove_namespace
deletes its keys and no other."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from store_cases import batch, key, random_counts

from veil.aggregator.store import RedisStore


def test_a_namespace_counts_apart_and_removes_its_keys_alone(redis_server):
    plain, spaced = RedisStore(redis_server.url), RedisStore(redis_server.url, namespace="demo-1")
    counts = random_counts((1,), 4, np.random.default_rng(5))
    same = batch(counts, key("browser"), batch_id=b"\x01" * 16)
    try:
        # The same metric and batch id in each: both count it (their dedupe keys differ too).
        assert plain.add(same) and spaced.add(same)
        assert spaced.add(batch(counts, key("browser"), batch_id=b"\x02" * 16))
        for store in (plain, spaced):
            store.since("browser", "fp1", 100)
            store.ping()  # its probe key
        assert plain.read(key("browser"), (1,), 4).total == counts.total
        assert spaced.read(key("browser"), (1,), 4).total == 2 * counts.total
        raw = redis.Redis.from_url(redis_server.url)
        raw.set("someone:else", "1")
        kept = {name: raw.dump(name) for name in raw.scan_iter() if not name.startswith(b"veil:{demo-1:")}
        assert spaced.remove_namespace() == 5  # counts, 2 batch ids, since, probe; none of the rest
        assert {name: raw.dump(name) for name in raw.scan_iter()} == kept
        assert plain.read(key("browser"), (1,), 4).total == counts.total
        with pytest.raises(ValueError, match="has none"):
            plain.remove_namespace()
    finally:
        plain.close()
        spaced.close()
