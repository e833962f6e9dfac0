"""Numeric metrics through the real SDK against a real in-process aggregator (issue 27,
docs/protocol.md section 9): `reporter.report("load_ms", 412.7)` reports the number in every
part the specs declare, each as a category of that part (its own memo, ledger and batch); values
outside the range are clipped and counted; NaN, infinities and non-numbers raise at the call; a
label for a numeric metric and a part by its own name are dropped and counted; a number made
before the specs are known waits as made; a steady value keeps its memoized response. The
vectors of section 9 are reproduced by the SDK's functions. The slow population test estimates
the mean of devices reporting a drifting number over several periods and checks its interval."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from veil_testing.running import InProcessAggregators, SimulatedTime

from veil.aggregator.daemon import Aggregator
from veil.aggregator.numeric import mean_estimate
from veil.client import Counters, InvalidNumberError, Reporter, ReporterError, UnknownCategoryError
from veil.client._log import LogOnce
from veil.client._memo import MemoStore, rounding_alpha
from veil.client._reporter import _number
from veil.mechanism import MEAN, MetricSpec, NumericSpec, SeededRandomSource

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto" / "veil" / "wire" / "v1" / "vectors"
DAY = 86400
START = 1_800_000_000 // DAY * DAY + 3600  # a simulated day, an hour in
FAST = dict(tls=False, schedule_delay_ms=20, retry_initial_backoff_ms=5, retry_max_backoff_ms=50)
# epsilon 4 split evenly: the mean part's epsilon 2 gives the rounding points of the vectors' load_ms.
LOAD_MS = {
    "name": "load_ms",
    "type": "numeric",
    "range": [0, 10000],
    "buckets": [100, 250, 500, 1000, 2500],
    "epsilon": 4.0,
    "windows": ["total"],
}
BROWSER = {"name": "browser", "labels": ["chrome", "safari", "edge"], "epsilon": 1.0, "windows": ["total"]}


@pytest.fixture
def clock() -> SimulatedTime:
    return SimulatedTime(START)


@pytest.fixture
def start_aggregator(clock: SimulatedTime) -> Iterator[Callable[..., Aggregator]]:
    """start_aggregator(*metrics) -> an in-process aggregator serving these [[metrics]] tables on
    the simulated clock (LOAD_MS and BROWSER by default), stopped after the test."""
    aggregators = InProcessAggregators()

    def start(*metrics: dict) -> Aggregator:
        tables = list(metrics or (LOAD_MS, BROWSER))
        return aggregators.start(sections={"metrics": tables}, clock=clock, min_n=1, http="")

    yield start
    aggregators.stop_all()


@pytest.fixture
def device(clock: SimulatedTime) -> Iterator[Callable[..., Reporter]]:
    """device(aggregator, **settings) -> a Reporter on the simulated clock with its specs known."""
    made: list[Reporter] = []

    def make(aggregator: Aggregator, **settings: object) -> Reporter:
        reporter = Reporter(
            f"127.0.0.1:{aggregator.grpc_port}", clock=clock, elapsed_clock=clock, **{**FAST, **settings}
        )
        made.append(reporter)
        assert reporter.wait_for_specs(10)
        return reporter

    yield make
    for reporter in made:
        reporter.shutdown(2)


def parts(reporter: Reporter) -> tuple[MetricSpec, MetricSpec]:
    return reporter.metrics["load_ms.mean"], reporter.metrics["load_ms.distribution"]


def numeric(spec: MetricSpec) -> NumericSpec:
    assert spec.numeric is not None
    return spec.numeric


def reported(aggregator: Aggregator, name: str) -> np.ndarray:
    """How many reports of the part's total window hold each category, recovered exactly from the
    served estimate (pi_hat = alpha V / n + beta for these one-weight designs)."""
    (window,) = aggregator.live.current(name, "total")
    assert window.estimate is not None, window.reason
    linear = window.metric.spec.mechanism.estimators()[window.estimate.estimator]
    return np.rint((window.estimate.estimate - linear.beta[0]) / linear.alpha[0] * window.n).astype(int)


def expected(spec: MetricSpec, categories: list[int], source: SeededRandomSource) -> np.ndarray:
    rows = np.zeros(spec.k, dtype=int)
    for category in categories:
        rows[list(spec.mechanism.randomize(category, source))] += 1
    return rows


def test_a_number_is_reported_in_every_part_as_its_category_and_clipped_ones_are_counted(
    start_aggregator, device, tmp_path
):
    aggregator = start_aggregator()
    secret = bytes(range(32))
    (tmp_path / "q").mkdir(mode=0o700)
    (tmp_path / "q" / "device.key").write_bytes(secret)
    seed = 11
    reporter = device(aggregator, queue_dir=tmp_path / "q", random_source=SeededRandomSource(seed))
    mean, distribution = parts(reporter)
    values = [412.7, -3, 25_000.5, 1000]  # one per device: this one, then three simulated ones
    devices = [reporter] + [reporter.simulated_device() for _ in values[1:]]
    for d, value in zip(devices, values):
        d.report("load_ms", value)
    assert reporter.force_flush(10)
    assert reporter.counters() == Counters(accepted=8, sent=8, clipped=2)
    # The categories report() drew for: the mean's with each device's own alpha (the first one's
    # from its device secret), the distribution's the value's bucket; randomized in that order.
    alphas = [rounding_alpha(secret, mean.name, mean.fingerprint)] + [
        d._memo.alpha(mean.name, mean.fingerprint) for d in devices[1:]
    ]
    clipped = [numeric(mean).clip(v)[0] for v in values]
    means = [numeric(mean).category(x, a) for x, a in zip(clipped, alphas)]
    buckets = [numeric(distribution).category(x, 0.0) for x in clipped]
    assert buckets == [2, 0, 5, 4]
    assert means[2] == numeric(mean).levels - 1 and means[1] == 0
    source = SeededRandomSource(seed)
    for _ in devices[1:]:  # each simulated device drew its secret from the source first
        [source.bits64() for _ in range(4)]
    want = {mean.name: np.zeros(mean.k, dtype=int), distribution.name: np.zeros(distribution.k, dtype=int)}
    for m, b in zip(means, buckets):
        want[mean.name] += expected(mean, [m], source)
        want[distribution.name] += expected(distribution, [b], source)
    for name, rows in want.items():
        assert reported(aggregator, name).tolist() == rows.tolist(), name
    spent = reporter.privacy_spent()
    assert spent["load_ms.mean"].lifetime_epsilon == 2.0 and spent["load_ms.distribution"].lifetime_epsilon == 2.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("-inf")])
def test_nan_and_infinities_raise_at_the_call_before_and_after_the_specs(start_aggregator, device, bad):
    offline = Reporter("127.0.0.1:1", tls=False, retry_initial_backoff_ms=5)  # no specs, ever
    try:
        for reporter in (device(start_aggregator()), offline):
            for metric in ("load_ms", "browser", "nope"):
                with pytest.raises(InvalidNumberError) as error:
                    reporter.report(metric, bad)
                assert isinstance(error.value, UnknownCategoryError) and isinstance(error.value, ReporterError)
                assert str(error.value).count(".") == 1  # one plain sentence, without the value
            assert reporter.counters() == Counters()
    finally:
        offline.shutdown(0)


# Bytes are no misuse: a strings metric takes them (test_strings.py: dropped for other metrics).
@pytest.mark.parametrize("bad", [True, False, None, object(), 1j])
def test_what_is_no_number_and_no_label_raises_for_a_numeric_metric(start_aggregator, device, bad):
    reporter = device(start_aggregator())
    with pytest.raises(UnknownCategoryError) as error:
        reporter.report("load_ms", bad)
    assert not isinstance(error.value, InvalidNumberError)
    assert reporter.counters() == Counters()


def test_numbers_of_any_numeric_type_are_reported(start_aggregator, device):
    aggregator = start_aggregator()
    reporter = device(aggregator)
    devices = [reporter] + [reporter.simulated_device() for _ in range(4)]
    for d, value in zip(devices, [7, np.float32(412.5), np.int64(9000), Fraction(1, 3), 10**400]):
        d.report("load_ms", value)
    assert reporter.force_flush(10)
    assert reporter.counters() == Counters(accepted=10, sent=10, clipped=1)  # 10**400: past the range


def test_a_label_a_part_by_its_name_and_a_number_for_categories_are_dropped_counted_and_logged_once(
    start_aggregator, device, caplog
):
    # The operator's config decides what is numeric: a running app must not break on it.
    reporter = device(start_aggregator())
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        for _ in range(2):
            reporter.report("load_ms", "fast")
            reporter.report("load_ms.mean", 3)
            reporter.report("load_ms.distribution", "[0, 100)")
            reporter.report("browser", 412.7)
            reporter.report("browser", -1)
    assert reporter.counters() == Counters(dropped=10)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'load_ms' is numeric" in m for m in messages) == 1
    assert sum("'load_ms.mean' is a part of a numeric metric" in m for m in messages) == 1
    assert sum("'load_ms.distribution' is a part of a numeric metric" in m for m in messages) == 1
    assert sum("not a category of Veil metric 'browser'" in m for m in messages) == 1


def test_a_steady_value_keeps_its_memoized_responses_and_spends_epsilon_once(start_aggregator, device, clock):
    aggregator = start_aggregator()
    reporter = device(aggregator)
    for day in range(5):
        clock.now = START + day * DAY
        reporter.report("load_ms", 412.7)
        reporter.report("load_ms", 9999.0)  # the period's one report was sent: limited
        assert reporter.force_flush(10)  # delivered while the aggregator still takes the day's reports
    assert reporter.counters() == Counters(accepted=10, sent=10, limited=10)
    spent = reporter.privacy_spent()
    assert spent["load_ms.mean"].lifetime_epsilon == 2.0 and spent["load_ms.distribution"].lifetime_epsilon == 2.0
    for name in ("load_ms.mean", "load_ms.distribution"):  # five reports, one response sent five times
        rows = reported(aggregator, name)
        assert set(rows.tolist()) <= {0, 5} and rows.sum() > 0, rows


def test_a_year_of_daily_numbers_spends_one_response_per_point_or_bucket_visited(start_aggregator, device, clock):
    """docs/sdk.md, "Numeric metrics": a year of daily reports of a value drifting over the whole
    range spends, per part, epsilon once per distinct point (bucket) the device reported, so at most
    levels x epsilon_mean + buckets x epsilon_distribution in all; memoization off, one per period."""
    aggregator = start_aggregator()
    memo_on = device(aggregator)
    memo_off = device(aggregator, memoize={"load_ms": False})
    mean, distribution = parts(memo_on)
    rng = random.Random(5)
    value, points, buckets = 5000.0, set(), set()
    alpha = memo_on._memo.alpha(mean.name, mean.fingerprint)
    for day in range(365):
        clock.now = START + day * DAY
        value = min(10000.0, max(0.0, value + rng.gauss(0, 150)))
        for reporter in (memo_on, memo_off):
            reporter.report("load_ms", value)
        points.add(numeric(mean).category(value, alpha))
        buckets.add(numeric(distribution).category(value, 0.0))
    # (What the year's reports spent is the device's ledger, whether or not they are delivered.)
    on, off = memo_on.privacy_spent(), memo_off.privacy_spent()
    assert on["load_ms.mean"].lifetime_epsilon == pytest.approx(len(points) * mean.mechanism.epsilon)
    assert on["load_ms.distribution"].lifetime_epsilon == pytest.approx(len(buckets) * distribution.mechanism.epsilon)
    assert len(points) <= mean.k and len(buckets) <= distribution.k and len(points) + len(buckets) < 365
    for spec in (mean, distribution):
        assert off[spec.name].lifetime_epsilon == pytest.approx(365 * spec.mechanism.epsilon)


def test_a_number_made_before_the_specs_waits_as_made(start_aggregator, clock, tmp_path):
    from veil_testing.processes import free_port

    port = free_port()
    reporter = Reporter(f"127.0.0.1:{port}", clock=clock, elapsed_clock=clock, **FAST)
    try:
        reporter.report("load_ms", 412.7)  # offline, first start: held as made
        reporter.report("load_ms", -2.5)
        reporter.report("browser", 2.5)  # a number for what turns out to be a metric of categories
        assert reporter.counters() == Counters(queued=3)
        made = clock.now
        clock.now += DAY  # the specs arrive a day later: the reports keep their period
        aggregators = InProcessAggregators()
        try:
            aggregator = aggregators.start(
                sections={"metrics": [LOAD_MS, BROWSER]}, clock=clock, min_n=1, http="", grpc=f"127.0.0.1:{port}"
            )
            assert reporter.wait_for_specs(10)
            assert reporter.force_flush(10) is False  # the number for categories was dropped
            assert reporter.counters() == Counters(accepted=2, sent=2, dropped=1, limited=2, clipped=1)
            spent = reporter.privacy_spent()
            assert spent["load_ms.mean"].reports == 0  # the period it was made in, not today's
            assert aggregator.live.current("load_ms.mean", "total")[0].n == 1
            assert made // DAY != clock.now // DAY
        finally:
            aggregators.stop_all()
    finally:
        reporter.shutdown(0)


def test_the_numeric_vectors_through_the_sdks_functions(tmp_path):
    """numeric_alphas.json: the SDK's memo store, over a queue directory holding the vector's
    device secret, gives its alpha; numeric_values.json: report()'s number check, then the part's
    clip and category, give each vector's category (docs/protocol.md section 9)."""
    alphas = json.loads((VECTORS / "numeric_alphas.json").read_text(encoding="utf-8"))["vectors"]
    for i, vector in enumerate(alphas):
        directory = tmp_path / str(i)
        directory.mkdir(mode=0o700)
        (directory / MemoStore.SECRET_FILE).write_bytes(bytes.fromhex(vector["secret"]))
        alpha = MemoStore(directory, LogOnce()).alpha(vector["metric"], vector["fingerprint"])
        assert alpha == vector["alpha"] and alpha * 2**53 == vector["alpha_53"]
    values = json.loads((VECTORS / "numeric_values.json").read_text(encoding="utf-8"))["vectors"]
    assert {v["numeric"]["part"] for v in values} == {"mean", "distribution"}
    for vector in values:
        part = NumericSpec(**{**vector["numeric"], "boundaries": tuple(vector["numeric"]["boundaries"])})
        inside, clipped = part.clip(_number(vector["value"]))
        assert (inside, clipped) == (vector["clipped_value"], vector["clipped"])
        assert part.category(inside, vector["alpha"] if part.part == MEAN else 0.0) == vector["category"], vector


POPULATION_PERIODS = 5
SEEDS = (1, 2, 3, 4, 5)


def population_mean(seed: int, devices: int) -> tuple[float, object, int]:
    """Devices (simulated, seeded) each report a slowly drifting number once a day for
    POPULATION_PERIODS days to an in-process aggregator: (the true mean of the values reported,
    the served mean of the total window, its reports_per_device)."""
    clock = SimulatedTime(START)
    rng = random.Random(seed)
    aggregators = InProcessAggregators()
    table = {**{k: v for k, v in LOAD_MS.items() if k != "buckets"}, "estimate": ["mean"], "epsilon": 2.0}
    try:
        aggregator = aggregators.start(sections={"metrics": [table]}, clock=clock, min_n=1, http="")
        uplink = Reporter(
            f"127.0.0.1:{aggregator.grpc_port}",
            clock=clock,
            elapsed_clock=clock,
            random_source=SeededRandomSource(seed * 1_000_003 + 7),  # not the values' stream
            max_queue_size=4 * devices,
            max_batch_size=1024,
            **FAST,
        )
        try:
            assert uplink.wait_for_specs(10)
            population = [uplink] + [uplink.simulated_device() for _ in range(devices - 1)]
            # A skewed law of load times (median about 700 ms), each device drifting by about 2% a day.
            values = [min(9000.0, rng.lognormvariate(6.5, 0.6)) for _ in population]
            reported = []
            for day in range(POPULATION_PERIODS):
                clock.now = START + day * DAY
                for d, reporter in enumerate(population):
                    values[d] = min(9000.0, values[d] * math.exp(rng.gauss(0.0, 0.02)))
                    reporter.report("load_ms", values[d])
                    reported.append(values[d])
                assert uplink.force_flush(60), uplink.counters()
            assert uplink.counters().sent == devices * POPULATION_PERIODS
            spec = uplink.metrics["load_ms.mean"]
        finally:
            uplink.shutdown(5)
        (window,) = aggregator.live.current("load_ms.mean", "total")
        assert window.estimate is not None and window.n == devices * POPULATION_PERIODS
        return float(np.mean(reported)), mean_estimate(spec, window.estimate), window.estimate.reports_per_device
    finally:
        aggregators.stop_all()


@pytest.mark.slow
def test_a_population_reporting_drifting_numbers_gets_an_honest_interval_for_the_mean():
    """2,000 devices, five daily reports each of a number that drifts slowly, memoized: a device
    whose value stays on its point resends its response, so its reports are not independent; the
    served interval allows for it (reports_per_device, the design effect's bound) and covers the
    true mean in most seeds, without being wider than that bound makes it."""
    covered = 0
    for seed in SEEDS:
        truth, mean, reports_per_device = population_mean(seed, 2000)
        assert reports_per_device == POPULATION_PERIODS
        covered += mean.lower <= truth <= mean.upper
        assert abs(mean.estimate - truth) < 5 * mean.stderr, (seed, truth, mean)
    assert covered >= len(SEEDS) - 1, covered
