"""read_many: several buckets in one call (one round trip on Redis), as read() gives each."""

from __future__ import annotations

import pytest
from store_cases import batch, key, random_counts

from veil.aggregator.counts import Counts
from veil.aggregator.errors import StoreError


def test_read_many_is_read_of_each(store, rng):
    places = [key(), key(window="1h", bucket=3600), key(metric="other"), key(window="1d", bucket=86400)]
    designs = [((2,), 16), ((2,), 16), ((0, 1, 2, 3), 3), ((5,), 1024)]
    for place, (weights, k) in zip(places[:3], designs):
        assert store.add(batch(random_counts(weights, k, rng), place))
    requests = [(place, weights, k) for place, (weights, k) in zip(places, designs)]
    got = store.read_many(requests)
    assert got == [store.read(*request) for request in requests]
    assert got[3] == Counts((5,), [0], [[0] * 1024])  # absent: zeros
    assert store.read_many([]) == []


def test_read_many_with_another_design_is_an_error(store, rng):
    assert store.add(batch(random_counts((3,), 5, rng), key()))
    with pytest.raises(StoreError, match="design"):
        store.read_many([(key(window="1h"), (3,), 5), (key(), (4,), 5)])


def test_versioned_read_gives_each_bucket_with_its_version(store, rng):
    """versioned_read: versions and read_many at once, each bucket's counts paired with the
    version they are at (on Redis from the same command as the counts; a hash without "version"
    is at version 0)."""
    places = [key(), key(window="1h", bucket=3600), key(metric="other")]
    designs = [((2,), 16), ((2,), 16), ((0, 1, 2, 3), 3)]
    assert store.add(batch(random_counts((2,), 16, rng), places[0], places[1]))
    assert store.add(batch(random_counts((2,), 16, rng), places[0]))
    requests = [(place, weights, k) for place, (weights, k) in zip(places, designs)]
    for keys, wanted in [(places, requests), (places[:1], requests[1:]), (places, []), ([], requests[::-1]), ([], [])]:
        versions, read = store.versioned_read(keys, wanted)
        assert versions == store.versions(keys)
        assert read == list(zip(store.versions([p for p, _, _ in wanted]), store.read_many(wanted)))
    versions = store.versions(places)
    assert [version for version, _ in store.versioned_read([], requests)[1]] == versions
    assert versions[2] == 0 and len(set(versions)) == 3
    with pytest.raises(StoreError, match="design"):
        store.versioned_read(places, [(key(), (4,), 16)])
