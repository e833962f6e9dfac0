"""The Store contract, checked on MemoryStore and on RedisStore against a real redis-server."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from store_cases import AWKWARD_METRICS, batch, batches_added, doubled, key, random_counts
from veil_testing.waiting import wait_until

from veil.aggregator.counts import PERIOD_NOT_SAID, Counts
from veil.aggregator.errors import StoreError
from veil.aggregator.store import BatchWrite, Store
from veil.mechanism import spec_for


def assert_reads(store: Store, where, expected: Counts) -> None:
    got = store.read(where, expected.weights, expected.k)
    assert got.n.dtype == np.int64 and got.v.dtype == np.int64
    assert got == expected


@pytest.mark.parametrize("k", [2, 16, 1024])
def test_round_trip_of_a_subset_design(store, rng, k):
    weights = Counts.zeros(spec_for("subset", k, 1.0)).weights
    assert len(weights) == 1
    counts = random_counts(weights, k, rng)
    assert store.add(batch(counts, key()))
    assert_reads(store, key(), counts)


@pytest.mark.parametrize(("k", "rows"), [(16, None), (1024, 40)])
def test_round_trip_of_rappor_with_every_weight(store, rng, k, rows):
    weights = Counts.zeros(spec_for("rappor", k, 1.0)).weights
    assert weights == tuple(range(k + 1))
    counts = random_counts(weights, k, rng, rows)  # weights 0 and k always among the non-zero rows
    assert store.add(batch(counts, key()))
    assert_reads(store, key(), counts)


def test_batches_accumulate_and_every_write_brings_a_new_version(store, rng):
    first, second = random_counts((3,), 10, rng), random_counts((3,), 10, rng)
    assert batches_added(store, [key()]) == [0] and store.versions([key()]) == [0]
    seen = [0]
    for counts, added in [(first, 1), (second, 2)]:
        write = batch(counts, key())
        assert store.add(write)
        assert batches_added(store, [key()]) == [added]
        seen += store.versions([key()])
        assert not store.add(write)  # a duplicate changes nothing, its version included
        assert store.versions([key()]) == seen[-1:]
    assert len(set(seen)) == 3
    assert_reads(store, key(), Counts((3,), first.n + second.n, first.v + second.v))


def test_one_batch_goes_to_every_target_once(store, rng):
    counts = random_counts((1, 2), 8, rng)
    targets = [key(), key(window="1h", bucket=3600), key(window="1d", bucket=86400)]
    assert store.add(batch(counts, *((t, int(time.time()) + 600) for t in targets)))
    for target in targets:
        assert_reads(store, target, counts)
    assert batches_added(store, [*targets, key(window="1h", bucket=7200)]) == [1, 1, 1, 0]


def test_a_duplicate_batch_id_changes_nothing(store, rng):
    counts = random_counts((2,), 5, rng)
    first = batch(counts, key(), batch_id=b"\x07" * 16)
    assert store.add(first) is True
    # Whatever a duplicate carries (here other counts, another bucket), its id decides.
    again = batch(doubled(counts), key(), key(window="1h", bucket=3600), batch_id=b"\x07" * 16)
    assert store.add(again) is False
    assert_reads(store, key(), counts)
    assert batches_added(store, [key(), key(window="1h", bucket=3600)]) == [1, 0]


def test_reading_an_absent_bucket_gives_zeros(store):
    assert_reads(store, key(metric="never"), Counts((0, 1, 2), np.zeros(3), np.zeros((3, 2))))
    assert batches_added(store, [key(metric="never")]) == [0]
    assert batches_added(store, []) == []


def test_metrics_fingerprints_windows_and_buckets_never_mix(store, rng):
    places = [key(metric=m) for m in AWKWARD_METRICS]
    places += [key(fingerprint="fp2"), key(fingerprint="fp1:total"), key(window="1h"), key(window="1h", bucket=3600)]
    places += [key(window="total:0"), key(window="1h", bucket=7200), key(metric="a", fingerprint="c:fp")]
    expected = {}
    for place in places:
        expected[place] = random_counts((1,), 4, rng)
        assert store.add(batch(expected[place], place))
    for place in places:
        assert_reads(store, place, expected[place])
    assert batches_added(store, places) == [1] * len(places)


def test_batch_ids_of_different_metrics_never_collide(store, rng):
    same_id = b"\x01" * 16
    for metric in AWKWARD_METRICS:
        assert store.add(batch(random_counts((1,), 3, rng), key(metric=metric), batch_id=same_id))


def test_expired_buckets_and_batch_ids_are_forgotten(store, rng):
    # The hour is read once before it expires. On a loaded machine adding and reading can take
    # longer than the horizon, so a read that came too late is tried again, on a metric of its
    # own, with a horizon twice as long: what is checked is expiry, not speed.
    for horizon in (1, 2, 4, 8, 16):
        metric = f"m{horizon}"
        counts = random_counts((1,), 6, rng)
        hour = key(metric, window="1h", bucket=3600)
        expires_at = math.ceil(time.time()) + horizon
        write = batch(counts, key(metric), (hour, expires_at), ttl=horizon)
        assert store.add(write)
        before = store.read(hour, counts.weights, counts.k)
        if time.time() < expires_at:
            break
    assert before == counts
    time.sleep(max(0.0, expires_at - time.time()) + 0.1)
    assert_reads(store, hour, Counts((1,), [0], np.zeros((1, 6))))  # the hour has gone
    assert_reads(store, key(metric), counts)  # the total never goes
    assert batches_added(store, [key(metric), hour]) == [1, 0]
    # Its id is forgotten too (ttl seconds after the add, a moment after the hour): the batch
    # counts again. A refused add changes nothing, so asking until it counts is harmless.
    assert wait_until(lambda: store.add(write), timeout=30)
    assert_reads(store, key(metric), doubled(counts))


def test_a_target_already_past_its_expiry_is_dropped(store, rng):
    counts = random_counts((1,), 3, rng)
    old = key(window="1h", bucket=3600)
    assert store.add(batch(counts, key(), (old, int(time.time()) - 10)))
    assert_reads(store, key(), counts)
    assert_reads(store, old, Counts((1,), [0], np.zeros((1, 3))))
    assert batches_added(store, [old]) == [0]


def test_the_same_batch_added_ten_times_counts_once(store, rng):
    write = batch(random_counts((2, 3), 32, rng), key(), key(window="1h", bucket=3600))
    assert [store.add(write) for _ in range(10)] == [True] + [False] * 9
    assert_reads(store, key(), write.counts)
    assert batches_added(store, [key(), key(window="1h", bucket=3600)]) == [1, 1]


def test_the_same_batch_added_concurrently_counts_once(make_handle, rng):
    write = batch(random_counts(range(9), 8, rng), key(), key(window="1h", bucket=3600))
    handles = [make_handle() for _ in range(10)]  # RedisStore: each its own connections
    start = threading.Barrier(len(handles))
    outcomes: list[bool] = []

    def add(handle: Store) -> None:
        start.wait()
        outcomes.append(handle.add(write))

    threads = [threading.Thread(target=add, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == [False] * 9 + [True]
    assert_reads(handles[0], key(), write.counts)
    assert batches_added(handles[0], [key()]) == [1]


def test_reading_with_another_design_is_an_error(store, rng):
    assert store.add(batch(random_counts((3,), 5, rng), key()))
    with pytest.raises(StoreError, match="design"):
        store.read(key(), (4,), 5)


def test_malformed_batches_are_refused_before_anything_changes(store, rng):
    counts = random_counts((1,), 3, rng)
    with pytest.raises(ValueError, match="metric"):
        store.add(BatchWrite("m", b"\x02" * 16, counts, ((key(), None), (key(metric="other"), None)), 60))
    with pytest.raises(ValueError, match="dedupe_ttl"):
        store.add(BatchWrite("m", b"\x02" * 16, counts, ((key(), None),), 0))
    assert batches_added(store, [key()]) == [0]
    assert store.add(BatchWrite("m", b"\x02" * 16, counts, ((key(), None),), 60))  # the id was not taken


def test_ping_answers(store):
    store.ping()


def test_since_keeps_the_first_time_per_metric_and_spec(store):
    assert store.since("browser", "fp-a", 1_800_000_000) == 1_800_000_000
    assert store.since("browser", "fp-a", 1_800_000_500) == 1_800_000_000  # kept, never moved
    assert store.since("browser", "fp-b", 1_800_000_700) == 1_800_000_700  # another spec starts anew
    assert store.since("os", "fp-a", 1_800_000_900) == 1_800_000_900
    assert store.since("browser", "fp-a", 1_700_000_000) == 1_800_000_000  # not even backwards


def test_read_many_reads_a_series_of_buckets_as_read_does(store, rng):
    # The range reads of the series endpoints: 720 hourly buckets at k = 1024 in one call, the
    # buckets never written (or dropped) as zeros, each exactly what read() gives.
    weights, k = (5,), 1024
    places = [key(window="1h", bucket=3600 * i) for i in range(720)]
    written = {bucket: random_counts(weights, k, rng) for bucket in (0, 17, 719)}
    for i, counts in written.items():
        assert store.add(batch(counts, places[i]))
    got = store.read_many([(place, weights, k) for place in places])
    assert len(got) == 720
    zeros = Counts(weights, [0], [[0] * k])
    assert [got[i] for i in written] == list(written.values())
    assert all(c == zeros for i, c in enumerate(got) if i not in written)
    assert got[17] == store.read(places[17], weights, k)


def test_add_many_answers_each_batch_as_add_would(store, rng):
    """A set as a caller holding several uploads hands it over: new batches, one id twice, an id counted
    before, and another metric's batch, each answered on its own, each counted once."""
    earlier = batch(random_counts((1,), 8, rng), key())
    assert store.add(earlier)
    fresh = [batch(random_counts((1,), 8, rng), key(), key(window="1h", bucket=3600)) for _ in range(3)]
    other = batch(random_counts((1,), 8, rng), key(metric="other"))
    writes = [fresh[0], fresh[1], fresh[0], earlier, other, fresh[2]]
    assert store.add_many(writes) == [True, True, False, False, True, True]
    assert store.add_many([]) == []
    assert store.add_many(writes) == [False] * len(writes)
    assert_reads(store, key(), Counts.summed([earlier.counts, *(w.counts for w in fresh)]))
    assert_reads(store, key(window="1h", bucket=3600), Counts.summed([w.counts for w in fresh]))
    assert_reads(store, key(metric="other"), other.counts)
    assert batches_added(store, [key(metric="other")]) == [1]


def test_sets_of_overlapping_batches_added_concurrently_count_each_once(make_handle, rng):
    writes = [batch(random_counts((1,), 4, rng), key()) for _ in range(40)]
    handles = [make_handle() for _ in range(4)]
    start = threading.Barrier(len(handles))
    applied: list[bool] = []

    def add(handle: Store, offset: int) -> None:
        start.wait()
        mine = writes[offset:] + writes[:offset]  # every handle sends every batch, in another order
        for i in range(0, len(mine), 8):
            applied.extend(handle.add_many(mine[i : i + 8]))

    threads = [threading.Thread(target=add, args=(h, 10 * i)) for i, h in enumerate(handles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sum(applied) == len(writes) and len(applied) == len(writes) * len(handles)
    assert_reads(handles[0], key(), Counts.summed([w.counts for w in writes]))


def test_each_bucket_records_the_periods_that_received_reports(store, rng):
    hourly = key(window="1h", bucket=3600)
    for period, bucket in [(20000, hourly), (20002, hourly), (20000, key(window="1h", bucket=7200))]:
        assert store.add(batch(random_counts((2,), 4, rng), key(), bucket, period=period))
    # A duplicate records nothing, whatever period it carries.
    again = batch(random_counts((2,), 4, rng), key(), hourly, batch_id=b"\x09" * 16, period=20005)
    assert store.add(again)
    assert not store.add(batch(again.counts, key(), hourly, batch_id=b"\x09" * 16, period=20007))
    assert store.read(key(), (2,), 4).periods == {20000, 20002, 20005}
    assert store.read(hourly, (2,), 4).periods == {20000, 20002, 20005}
    assert store.read(key(window="1h", bucket=7200), (2,), 4).periods == {20000}
    assert store.read(key(metric="never"), (2,), 4).periods == frozenset()
    # versioned_read and settled_read carry them too (settled twice: a store may serve a copy).
    (_, counts), *_ = store.versioned_read((), [(hourly, (2,), 4)])[1]
    assert counts.periods == {20000, 20002, 20005}
    for _ in range(2):
        assert store.settled_read([(hourly, (2,), 4, None)])[0][1].periods == {20000, 20002, 20005}


def test_a_batch_without_its_period_is_recorded_as_not_said(store, rng):
    assert store.add(batch(random_counts((2,), 4, rng), key(), period=7))
    assert store.add(batch(random_counts((2,), 4, rng), key()))
    assert store.read(key(), (2,), 4).periods == {7, PERIOD_NOT_SAID}


def test_batches_of_several_periods_added_together_record_each(store, rng):
    writes = [batch(random_counts((2,), 4, rng), key(), period=100 + i % 3) for i in range(9)]
    assert store.add_many(writes) == [True] * 9
    assert store.read(key(), (2,), 4).periods == {100, 101, 102}
