"""settled_read: the buckets of a range that has ended, exactly as versioned_read gives them,
on every store (RedisStore serves them from packed copies it writes on first read)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from store_cases import batch, key, random_counts

from veil.aggregator.counts import Counts
from veil.aggregator.errors import StoreError


def hours(n: int) -> list:
    return [key(window="1h", bucket=3600 * i) for i in range(n)]


def settled(places, weights, k, expires_at=None):
    return [(place, weights, k, expires_at) for place in places]


@pytest.mark.parametrize(("weights", "k", "rows"), [((5,), 1024, None), (tuple(range(17)), 16, 3)])
def test_settled_read_is_versioned_read_before_and_after_a_late_batch(store, rng, weights, k, rows):
    places = hours(6)
    for i in (0, 2, 3, 5):  # 1 and 4 never written: zeros at version 0
        assert store.add(batch(random_counts(weights, k, rng, rows), places[i]))
    plain = [(place, weights, k) for place in places]
    expected = store.versioned_read((), plain)[1]
    for _ in range(2):  # the second time from what the first kept, where a store keeps anything
        assert store.settled_read(settled(places, weights, k)) == expected
    # A late batch lands in a bucket already read as settled: the next read has it, exactly.
    late = random_counts(weights, k, rng, rows)
    assert store.add(batch(late, places[2]))
    again = store.settled_read(settled(places, weights, k))
    assert again == store.versioned_read((), plain)[1]
    assert again[2][0] != expected[2][0]
    assert again[2][1] == Counts(weights, expected[2][1].n + late.n, expected[2][1].v + late.v)
    assert [version for version, _ in again] == store.versions(places)
    assert store.settled_read([]) == []


def test_settled_read_of_another_design_is_an_error_even_once_kept(store):
    place = key(window="1h", bucket=3600)
    assert store.add(batch(Counts((3,), [5], [[1, 2, 3, 4, 5]]), place))  # its last counter not 0: see below
    store.settled_read(settled([place], (3,), 5))
    # (A Redis hash cannot tell a larger k, or a smaller one whose last counters are 0: it holds
    # the non-zero counters only; versioned_read reads those as zeros too.)
    for weights, k in [((4,), 5), ((3,), 4)]:
        with pytest.raises(StoreError, match="design"):
            store.settled_read(settled([place], weights, k))


def test_a_settled_bucket_goes_at_its_expiry(store, rng):
    place = key(window="1h", bucket=3600)
    expires_at = math.ceil(time.time()) + 1
    counts = random_counts((2,), 8, rng)
    assert store.add(batch(counts, (place, expires_at)))
    assert store.settled_read(settled([place], (2,), 8, expires_at))[0][1] == counts
    time.sleep(max(0.0, expires_at - time.time()) + 0.1)
    assert store.settled_read(settled([place], (2,), 8, expires_at)) == [(0, Counts((2,), [0], np.zeros((1, 8))))]
