"""Chaos: `veil serve` SIGKILLed at random moments under load from several SDK clients with retries.

The aggregator is killed (no chance to finish anything) while four devices keep reporting
subset, RAPPOR and k-RR metrics; two keep unsent batches in memory, two spool them under a queue
directory. A kill can land before a batch reaches Redis (the SDK retries it), after Redis
applied it but before the answer reached the device (the retry is a duplicate that the Lua
script counts once), or between uploads. After the last restart every device flushes; then
Redis must hold exactly the counts of the reports the devices saw acknowledged: n, and V_j per
report weight (RAPPOR's n_t and V_j^(t)), in the total window and summed over hourly buckets.

On loopback the applied-but-unacknowledged window lasts about a millisecond, so random kills
rarely hit it (in one 20-kill run, deleting every dedupe key as soon as it was written changed
no count). The default run therefore reaches Redis through ReplyDelayProxy, which holds
Redis's replies for 25 ms: many kills then strand applied batches, and the test asserts that
duplicates did arrive (UploadResponse.duplicate, seen by the devices) and were counted once.

Seeded: the kill moments (random.Random), the reports (SeededRandomSource), the true values.
10 cycles by default (about 25 s); 100 cycles, direct and delayed, under `-m slow`.
"""

from __future__ import annotations

import random
import time

import pytest
from reliability_kit import Load, assert_exact, flush_all
from veil_testing.waiting import wait_until

pytestmark = pytest.mark.starts_first  # a minute or more on a loaded machine: SIGKILL cycles

DEVICES = 4
REPLY_DELAY = 0.025  # seconds Redis's replies are held by the proxy ("delayed" runs)


def stranded(devices) -> bool:
    """Whether a retry has been answered as a duplicate (a kill stranded an applied batch), within
    a second for the retries of the last kill to arrive."""
    return wait_until(lambda: sum(d.duplicates for d in devices) > 0, 1.0)


@pytest.mark.parametrize(
    ("cycles", "route"),
    [
        (10, "delayed"),
        pytest.param(100, "delayed", marks=pytest.mark.slow),
        pytest.param(100, "direct", marks=pytest.mark.slow),
    ],
)
def test_sigkill_cycles_under_load_end_with_exact_counts(
    cycles, route, make_redis_server, make_proxy, make_aggregator, make_device, tmp_path
):
    redis = make_redis_server()
    store_url = make_proxy(redis.port, REPLY_DELAY).url if route == "delayed" else redis.url
    serve = make_aggregator(store_url).start()
    devices = [
        make_device(serve.endpoint, seed, queue_dir=tmp_path / f"device-{seed}" if seed % 2 else None)
        for seed in range(DEVICES)
    ]
    rng = random.Random(20240 + cycles)
    downtime = []
    started = time.monotonic()
    with Load(devices, rate=200):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        # `cycles` kills, and on the delayed route more (up to three times as many) until one has
        # stranded an applied batch: whether a reply is held at the moment of a kill is a matter
        # of timing, which a loaded machine shifts.
        while len(downtime) < cycles or (route == "delayed" and len(downtime) < 3 * cycles and not stranded(devices)):
            time.sleep(rng.uniform(0.1, 0.4))  # load flows
            serve.kill()
            killed = time.monotonic()
            time.sleep(rng.uniform(0.0, 0.2))  # down a while longer
            serve.start()
            downtime.append(time.monotonic() - killed)
        time.sleep(0.3)
    kills = len(downtime)
    # Kills come faster than the devices can catch up (each restart takes 1-2 s and the SDK
    # backs off), so backlogs build up over the cycles and drain at the end.
    flush_all(devices, timeout=60 + 2 * kills)
    summary = assert_exact(devices, redis.url)

    assert serve.starts == kills + 1
    assert summary["sent"] > 10 * cycles, summary  # load flowed throughout
    assert summary["retried"] > 0, summary  # the kills interrupted uploads
    if route == "delayed":
        assert summary["duplicates"] > 0, "no kill stranded an applied batch: the exactly-once path went untested"
    print(
        f"\n{kills} SIGKILL cycles ({route}) in {time.monotonic() - started:.1f} s (down {min(downtime):.2f}-"
        f"{max(downtime):.2f} s each): {summary}"
    )
