"""Ranges and groups: every retained bucket's estimate, a merged range's, and a group's share.

LiveEstimates.series/merged on both stores against estimate() of what the store holds; the
group's variance against the exact transition matrix and against simulation; the same through
gRPC (Estimates.Series, group in Get) and `veil estimates --last/--merged/--group`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time

import grpc
import numpy as np
import pytest
from veil_testing.running import make_upload

from veil.aggregator.config import parse_config
from veil.aggregator.counts import Counts
from veil.aggregator.errors import InvalidRange, UnknownCategory
from veil.aggregator.estimate import _binomial_lower, estimate, group_estimate, rest_estimate
from veil.aggregator.live import LiveEstimates, with_group
from veil.aggregator.simulate import FastKeystream, simulate_counts
from veil.aggregator.store import BatchWrite, CountsKey, MemoryStore, RedisStore
from veil.cli import main
from veil.mechanism import MECHANISMS, spec_for, transition_matrix
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

HOUR, DAY = 3600, 86400
START = 1_700_006_400  # a day boundary
METRICS = [
    {
        "name": "browser",
        "labels": ["chrome", "safari", "edge", "firefox", "other"],
        "mechanism": "subset",
        "epsilon": 1.0,
        "windows": [
            "total",
            {"span": "1h", "retention": "30d"},
            {"span": "1d", "retention": "30d"},
            {"span": "1m", "retention": "30d"},
        ],
    }
]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def store(request):
    made = (
        MemoryStore(clock=lambda: START)
        if request.param == "memory"
        else RedisStore(request.getfixturevalue("redis_server").url)
    )
    yield made
    made.close()


def fill(store, hours: dict[int, int]) -> tuple[LiveEstimates, object, Clock]:
    """Reports into hour h's buckets (h hours after START), counting begun at START."""
    config = parse_config({"server": {"min_n": 50}, "store": {"url": "memory"}, "metrics": METRICS})
    metric = config.metrics[0]
    spec = metric.spec.mechanism
    store.since(metric.name, metric.spec.fingerprint, START)
    for h, reports in hours.items():
        now = START + h * HOUR
        values = np.random.default_rng(h).integers(0, spec.k, reports)
        targets = tuple(
            (CountsKey(metric.name, metric.spec.fingerprint, w.name, w.bucket(now)[0]), None) for w in metric.windows
        )
        assert store.add(BatchWrite(metric.name, os.urandom(16), simulate_counts(spec, values), targets, 3600))
    clock = Clock(START + 71.5 * HOUR)  # in the third day
    return LiveEstimates(config, store, clock=clock), metric, clock


def read(store, metric, window, start):
    spec = metric.spec.mechanism
    return store.read(CountsKey(metric.name, metric.spec.fingerprint, window, start), spec.weight_law().weights, spec.k)


def test_a_series_is_every_retained_bucket_estimated_as_the_current_one(store):
    live, metric, clock = fill(store, {0: 400, 5: 30, 30: 600, 71: 800})
    series = live.series("browser", "1h")
    # 30 days kept after each bucket ends: the current bucket and the 720 before it, no more.
    assert [e.start for e in series] == list(range(START + 71 * HOUR - 720 * HOUR, START + 72 * HOUR, HOUR))
    by_start = {e.start: e for e in series}
    assert len(series) == len(by_start) and all(e.end - e.start == HOUR for e in series)
    for h, n in {0: 400, 5: 30, 30: 600, 71: 800}.items():
        e = by_start[START + h * HOUR]
        assert e.n == n and e.reports_per_device == 1
        if n < 50:
            assert e.withheld and "30 reports" in e.reason
            continue
        want = estimate(metric.spec.mechanism, read(store, metric, "1h", e.start), project=True)
        for a, b in zip(
            (e.estimate.estimate, e.estimate.stderr, e.estimate.lower, e.estimate.upper),
            (want.estimate, want.stderr, want.lower, want.upper),
        ):
            np.testing.assert_array_equal(a, b)
    assert all(e.n == 0 and e.withheld for e in series if (e.start - START) // HOUR not in (0, 5, 30, 71))
    # The current bucket is the one current() serves.
    (now,) = live.current("browser", "1h")
    assert (series[-1].start, series[-1].n) == (now.start, now.n)
    # A past bucket written again (by another aggregator, say) is read again: its version moved.
    assert live.series("browser", "1h")[-72].n == 400
    spec = metric.spec.mechanism
    key = CountsKey(metric.name, metric.spec.fingerprint, "1h", START)
    assert store.add(
        BatchWrite(metric.name, os.urandom(16), simulate_counts(spec, np.zeros(7, np.int64)), ((key, None),), 3600)
    )
    assert live.series("browser", "1h")[-72].n == 407
    # from/to pick the buckets overlapping [from, to).
    picked = live.series("browser", "1h", START + 4 * HOUR + 1, START + 31 * HOUR)
    assert [e.start for e in picked] == list(range(START + 4 * HOUR, START + 31 * HOUR, HOUR))


def test_a_merged_range_adds_the_counts_and_allows_for_each_period_it_spans(store):
    live, metric, clock = fill(store, {0: 400, 5: 30, 30: 600, 71: 800})
    spec = metric.spec.mechanism
    merged = live.merged("browser", "1h")
    total = Counts.zeros(spec)
    for h in (0, 5, 30, 71):
        total.add(read(store, metric, "1h", START + h * HOUR))
    # Counting began at START, so the range's data span the 3 daily periods since.
    assert merged.n == 1830 and merged.reports_per_device == 3
    want = estimate(spec, total, project=True, reports_per_device=3)
    np.testing.assert_array_equal(merged.estimate.estimate, want.estimate)
    np.testing.assert_array_equal(merged.estimate.upper, want.upper)
    assert "pooled over the 3 periods in these" in merged.estimand
    # Merging the daily buckets gives the same counts, hence the same estimate: counts add exactly.
    days = live.merged("browser", "1d")
    assert days.n == 1830 and days.reports_per_device == 3
    np.testing.assert_array_equal(days.estimate.estimate, want.estimate)
    # One day's hours: one period, c = 1.
    first_day = live.merged("browser", "1h", START, START + DAY)
    assert (first_day.n, first_day.reports_per_device) == (430, 1)
    assert "pooled" not in first_day.estimand


def test_ranges_refuse_the_total_window_nothing_and_too_many_buckets(store):
    live, _, clock = fill(store, {0: 100})
    with pytest.raises(InvalidRange, match="no buckets"):
        live.series("browser", "total")
    with pytest.raises(InvalidRange, match="No retained"):
        live.merged("browser", "1h", START - 40 * DAY, START - 39 * DAY)
    assert live.series("browser", "1h", START - 40 * DAY, START - 39 * DAY) == []
    with pytest.raises(InvalidRange, match="43201 1m buckets"):
        live.series("browser", "1m")
    assert len(live.series("browser", "1m", START)) == 71 * 60 + 31
    with pytest.raises(UnknownCategory, match="opera"):
        with_group(live.current("browser", "1h")[0], ["chrome", "opera"])


# --- the group's variance -------------------------------------------------------------------

ENUMERABLE = [
    spec_for(name, k, epsilon)
    for name in MECHANISMS
    for k in (2, 3, 4, 5)
    for epsilon in (0.5, 4.0)
    if name != "warner" or k == 2
]


@pytest.mark.parametrize("spec", ENUMERABLE, ids=lambda s: f"{s.name}-k{s.k}-eps{s.epsilon}")
def test_group_moments_agree_with_the_exact_transition_matrix(spec):
    # Every report with its probability under a non-uniform pi: the mean of S = sum_G Y_j is
    # pi_G, and its variance pi_G A + (1 - pi_G) B - pi_G^2, for every group of every size.
    pi = np.random.default_rng(spec.k).dirichlet(np.ones(spec.k))
    reports, rows = transition_matrix(spec)
    probability = np.asarray(rows) @ pi
    for linear in spec.estimators().values():
        coefficients = dict(zip(linear.weights, zip(linear.alpha, linear.beta)))
        for size in range(1, spec.k + 1):
            group = set(range(spec.k - size, spec.k))  # not always the first: x = 0 is outside
            s = np.array(
                [coefficients[len(r)][0] * len(group & set(r)) + coefficients[len(r)][1] * size for r in reports]
            )
            mean = probability @ s
            share = pi[list(group)].sum()
            assert mean == pytest.approx(share, abs=1e-12)
            a, b = linear.group_moments(spec.weight_law(), spec.k, size)
            assert probability @ (s - mean) ** 2 == pytest.approx(share * a + (1 - share) * b - share**2, rel=1e-10)


def test_a_group_of_one_is_the_category_and_of_all_has_no_spread():
    spec = spec_for("subset", 16, 1.0)
    counts = simulate_counts(spec, np.random.default_rng(1).integers(0, 16, 5000))
    e = estimate(spec, counts, reports_per_device=2)
    one = group_estimate(spec, e, [3])
    # The same numbers up to rounding (group_moments sums the hypergeometric terms its own way).
    assert (one.estimate, one.stderr, one.lower, one.upper) == pytest.approx(
        (e.estimate[3], e.stderr[3], e.lower[3], e.upper[3]), rel=1e-12, abs=1e-15
    )
    everything = group_estimate(spec, e, range(16))
    assert everything.estimate == pytest.approx(1.0) and everything.stderr < 1e-6


@pytest.mark.parametrize(
    ("name", "k", "epsilon", "size"), [("subset", 64, 1.0, 5), ("krr", 8, 1.0, 3), ("rappor", 16, 2.0, 4)]
)
def test_group_intervals_cover_at_their_rate_in_simulation(name, k, epsilon, size):
    # Seeded: 300 samples of n = 2000 reports; the group's interval covers pi_G about 95% of the
    # time (binomial sd 1.3%: >= 91% is a four-sd bound) and its stderr matches the spread.
    spec = spec_for(name, k, epsilon)
    rng = np.random.default_rng(k)
    pi = rng.dirichlet(np.ones(k))
    members = list(range(1, 1 + size))
    truth = pi[members].sum()
    keystream = FastKeystream(k)
    covered, values, errors = 0, [], []
    for _ in range(300):
        values_x = rng.choice(k, size=2000, p=pi)
        g = group_estimate(spec, estimate(spec, simulate_counts(spec, values_x, keystream=keystream)), members)
        covered += g.lower <= truth <= g.upper
        values.append(g.estimate)
        errors.append(g.stderr)
    assert covered / 300 >= 0.91
    assert np.std(values) == pytest.approx(np.mean(errors), rel=0.15)


def test_the_rest_of_the_top_estimates_allows_for_its_choice():
    # The fold's estimate and stderr are the fixed group's; its interval reaches at least as
    # high, and where noise picks the top (k-RR, k = 1024, a few reports per category) far higher.
    spec = spec_for("krr", 1024, 1.0)
    rng = np.random.default_rng(11)
    e = estimate(spec, simulate_counts(spec, rng.integers(0, 1024, 2000), keystream=FastKeystream(11)))
    rest = rest_estimate(spec, e, 5)
    members = sorted(np.argsort(-e.estimate, kind="stable")[5:].tolist())
    plain = group_estimate(spec, e, members)
    assert (rest.estimate, rest.stderr, rest.lower) == (plain.estimate, plain.stderr, plain.lower)
    assert rest.upper > plain.upper + 0.2
    sharp = spec_for("subset", 16, 4.0)
    shares = np.arange(1, 17) / np.arange(1, 17).sum()  # category j's share grows with j
    values = np.repeat(np.arange(16), np.round(shares * 200_000).astype(int))
    clear = estimate(sharp, simulate_counts(sharp, values, keystream=FastKeystream(12)))
    fixed = group_estimate(sharp, clear, list(range(5)))
    folded = rest_estimate(sharp, clear, 11)  # the 5 smallest: a clear choice
    # (Exactly the same group: the union bound over 16 categories still costs a little width.)
    assert folded.lower == fixed.lower and fixed.upper <= folded.upper <= fixed.upper + 0.03
    with pytest.raises(ValueError, match="top"):
        rest_estimate(spec, e, 1024)


def test_the_exact_binomial_bound_is_clopper_pearsons():
    from scipy.stats import beta

    for hits, trials, level in [(10, 2000, 2.4e-5), (1, 100, 0.01), (500, 2000, 1e-4), (3, 10, 0.05)]:
        assert _binomial_lower(hits, trials, level) == pytest.approx(beta.ppf(level, hits, trials - hits + 1), rel=1e-9)
    assert _binomial_lower(0, 50, 0.01) == 0.0


# --- through gRPC and the CLI -----------------------------------------------------------------


@pytest.fixture
def hourly(start_aggregator):
    """An aggregator with browser reports in 3 of the last 4 hourly buckets (of the wall clock:
    the memory store drops buckets by it); returns it, its address and the first bucket's start."""
    base = int(time.time()) // HOUR * HOUR - 3 * HOUR
    clock = Clock(base)
    aggregator = start_aggregator(clock=clock, min_n=10)
    stub = veil_pb2_grpc.CollectorStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    for h, n in ((0, 600), (1, 5), (3, 900)):
        clock.now = base + h * HOUR + 10
        stub.Upload(make_upload("browser", n, seed=h), timeout=10)
    clock.now = base + 3 * HOUR + 20
    return aggregator, f"127.0.0.1:{aggregator.grpc_port}", base


def test_series_over_grpc_is_what_live_serves(hourly):
    aggregator, address, base = hourly
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(address))
    got = stub.Series(
        veil_pb2.SeriesRequest(metric="browser", window="1h", from_unix=base, group=["chrome", "edge"]), timeout=10
    )
    assert [(w.start_unix, w.n, w.withheld) for w in got.estimates] == [
        (base + h * HOUR, n, n < 10) for h, n in ((0, 600), (1, 5), (2, 0), (3, 900))
    ]
    live = aggregator.live.series("browser", "1h", base)
    for w, e in zip(got.estimates, live):
        assert w.estimand == e.estimand and w.reports_per_device == e.reports_per_device
        if e.withheld:
            assert not w.HasField("group") and not w.categories
            continue
        assert [c.estimate for c in w.categories] == e.estimate.estimate.tolist()
        g = with_group(e, ["chrome", "edge"]).group
        assert (w.group.estimate, w.group.stderr, w.group.lower, w.group.upper) == (
            g.estimate,
            g.stderr,
            g.lower,
            g.upper,
        )
        assert list(w.group.labels) == ["chrome", "edge"]
    merged = stub.Series(
        veil_pb2.SeriesRequest(metric="browser", window="1h", from_unix=base, merged=True), timeout=10
    ).estimates
    assert [(w.start_unix, w.end_unix, w.n) for w in merged] == [(base, base + 4 * HOUR, 1505)]
    current = stub.Get(veil_pb2.EstimatesRequest(metric="browser", window="1h", group=["safari"]), timeout=10)
    (w,) = current.estimates
    assert w.n == 900 and w.group.estimate == w.categories[1].estimate and w.group.upper == w.categories[1].upper
    for request, code in [
        (veil_pb2.SeriesRequest(metric="browser", window="total"), grpc.StatusCode.INVALID_ARGUMENT),
        (veil_pb2.SeriesRequest(metric="browser", window="9h"), grpc.StatusCode.NOT_FOUND),
        (veil_pb2.SeriesRequest(metric="browser", window="1h", group=["nope"]), grpc.StatusCode.NOT_FOUND),
    ]:
        with pytest.raises(grpc.RpcError) as raised:
            stub.Series(request, timeout=10)
        assert raised.value.code() == code


def test_cli_series_table_json_csv_and_group(hourly, capsys):
    aggregator, address, start = hourly
    args = ["estimates", "browser", "--address", address, "--window", "1h", "--from", str(start)]
    assert main([*args, "--json", "--group", "chrome,edge"]) == 0
    windows = json.loads(capsys.readouterr().out)["estimates"]
    assert [w["n"] for w in windows] == [600, 5, 0, 900]
    assert windows[0]["group"]["labels"] == ["chrome", "edge"] and "group" not in windows[1]
    assert main([*args, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 * 8 + 2  # two shown buckets of 8 categories, two withheld ones
    assert {r["label"] for r in rows if r["start"] == str(start)} == {c["label"] for c in windows[0]["categories"]}
    assert main([*args, "--group", "chrome,edge"]) == 0
    table = capsys.readouterr().out
    assert "withheld" in table and "chrome + edge" in table and table.count("\n") == 1 + 1 + 4 + 1 + 1
    # The buckets still within max_lateness of their end (all four: the last hours) are marked so.
    assert table.count("* ") == 4 + 1
    assert table.endswith("* provisional (reports made in this bucket may still arrive)\n")
    assert [w["provisional"] for w in windows] == [True] * 4
    assert main([*args, "--merged", "--json"]) == 0
    (merged,) = json.loads(capsys.readouterr().out)["estimates"]
    assert merged["n"] == 1505
    assert main(["estimates", "browser", "--address", address, "--window", "total", "--merged"]) != 0
    assert "no buckets" in capsys.readouterr().err


def test_series_and_groups_over_http(hourly):
    import urllib.error
    import urllib.request

    aggregator, address, start = hourly
    base = f"http://127.0.0.1:{aggregator.http_port}"

    def get(path: str) -> dict:
        return json.load(urllib.request.urlopen(base + path))

    over_http = get(f"/v1/series/browser?window=1h&from={start}&group=chrome,edge")["estimates"]
    assert [w["n"] for w in over_http] == [600, 5, 0, 900]
    assert over_http[0]["group"]["labels"] == ["chrome", "edge"]
    live = [with_group(e, ["chrome", "edge"]).to_json() for e in aggregator.live.series("browser", "1h", start)]
    assert over_http == json.loads(json.dumps(live))
    (merged,) = get("/v1/series/browser?window=1h&last=4h&merged=1")["estimates"]
    assert merged["n"] == 1505
    (current,) = get("/v1/estimates/browser?window=1h&top=3")["estimates"]
    assert len(current["group"]["labels"]) == 5  # the 8 categories but the 3 largest
    top3 = sorted(current["categories"], key=lambda c: -c["estimate"])[:3]
    assert not {c["label"] for c in top3} & set(current["group"]["labels"])
    for path, code in [
        ("/v1/series/browser?window=total", 400),
        ("/v1/series/nope?window=1h", 404),
        ("/v1/series/browser?window=1h&from=nan", 400),
        ("/v1/series/browser?window=1h&last=x", 400),
        ("/v1/estimates/browser?group=nope", 404),
        ("/v1/estimates/browser?top=-1", 400),
    ]:
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(base + path)
        assert raised.value.code == code, path
