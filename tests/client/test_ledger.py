"""Device-level guarantees in the SDK: the reporting period's bound and the privacy ledger.

Each test serves its own metric specs from the loopback collector (whose specs answers say the
time ``server_time`` holds: 0, as a revision-1 aggregator, unless a test sets it) and drives the
Reporter's periods with an injected clock.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import random
import stat
import subprocess
import threading
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path

import loopback_collector
import pytest
from loopback_collector import CollectorServer

from veil.client import ConfigError, Counters, PrivacySpent, Reporter
from veil.client._clock import ALLOWANCE, bounded_clock
from veil.client._ledger import Ledger, units
from veil.client._log import LogOnce
from veil.mechanism import MechanismError, MetricSpec

LABELS = ["chrome", "safari", "edge", "firefox"]
DAY = 86400
YEAR = 365 * DAY
# Budget cases both SDKs run (client/js/test/ledger.test.ts): made by budget_cases() below.
BUDGET_VECTORS = Path(__file__).parents[2] / "proto/veil/wire/v1/vectors/ledger_budgets.json"


class Clock:
    def __init__(self, now: float = 1_000 * DAY + 3600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def next_period(self, spec: MetricSpec) -> None:
        self.now += spec.period


class ServerTime:
    now = 0  # the aggregator's Unix time its specs answers say (0: not said, as revision 1)


@pytest.fixture
def server_time() -> ServerTime:
    return ServerTime()


@pytest.fixture
def collector(state, server_time, monkeypatch):
    """The loopback collector, its specs answers saying ``server_time.now``."""

    class Timed(loopback_collector.Servicer):
        def GetMetricSpecs(self, request, context):
            answer = super().GetMetricSpecs(request, context)
            answer.server_time_unix = server_time.now
            return answer

    monkeypatch.setattr(loopback_collector, "Servicer", Timed)
    server = CollectorServer(state)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def serve(state):
    def serve(*specs: MetricSpec) -> None:
        with state.lock:
            state.specs[:] = specs

    return serve


def test_a_default_reporter_sends_one_report_per_day_however_often_the_app_reports(serve, ready_reporter, state):
    # The field failure: 5,000 report() calls of one user with the defaults gave an estimate of
    # 2.002 for a true 0.25. With a period of one day, one report leaves the device.
    spec = MetricSpec.create("browser", LABELS)
    assert (spec.period, spec.reports_per_period) == (DAY, 1)
    serve(spec)
    reporter = ready_reporter()
    for _ in range(5_000):
        reporter.report("browser", "safari")
    assert reporter.force_flush(10)
    assert state.total("browser") == 1
    assert reporter.counters() == Counters(accepted=1, sent=1, limited=4_999)


def test_the_first_reports_of_a_period_are_sent_and_the_next_period_allows_more(serve, ready_reporter, state):
    spec = MetricSpec.create("browser", LABELS, reports_per_period=3, period=3600)
    serve(spec)
    clock = Clock()
    reporter = ready_reporter(clock=clock)
    for value in ["edge", "edge", "safari", "chrome", "firefox"]:
        reporter.report("browser", value)
    clock.next_period(spec)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    assert state.total("browser") == 4
    assert reporter.counters().limited == 2
    # The memo resent edge's response: epsilon was spent on edge, safari (period 1), nothing new after.
    spent = reporter.privacy_spent()["browser"]
    assert spent.reports == 1 and spent.period_epsilon == 0.0 and spent.lifetime_epsilon == 2.0


def test_privacy_spent_shows_the_period_and_the_budgets(serve, ready_reporter):
    spec = MetricSpec.create("browser", LABELS, epsilon=0.5, period=3600, reports_per_period=2, lifetime_budget=4.0)
    serve(spec)
    clock = Clock(7200.0 * 1000 + 10)
    reporter = ready_reporter(clock=clock)
    reporter.report("browser", "edge")
    assert reporter.privacy_spent() == {
        "browser": PrivacySpent(
            metric="browser",
            period_start=7200 * 1000,
            period_end=7200 * 1000 + 3600,
            reports=1,
            reports_per_period=2,
            period_epsilon=0.5,
            period_budget=1.0,
            lifetime_epsilon=0.5,
            lifetime_budget=4.0,
        )
    }


def test_a_report_past_the_lifetime_budget_is_dropped_and_counted_and_memoized_ones_still_go(
    serve, ready_reporter, state
):
    spec = MetricSpec.create("browser", LABELS, epsilon=1.0, lifetime_budget=2.0)
    serve(spec)
    clock = Clock()
    reporter = ready_reporter(clock=clock)
    for value in ["edge", "safari", "chrome", "edge"]:  # one per day: two new responses fit the budget
        reporter.report("browser", value)
        clock.next_period(spec)
    assert reporter.force_flush(10)
    assert state.total("browser") == 3  # edge, safari, and edge's memoized response again
    assert reporter.counters().over_budget == 1
    assert reporter.privacy_spent()["browser"].lifetime_epsilon == 2.0


@pytest.mark.parametrize(
    ("epsilon", "reports_per_period", "period_budget", "counters"),
    [
        (1.0, 10, 3.0, Counters(accepted=3, sent=3, over_budget=7)),
        # The default period budget is 6 * 0.15 = 0.8999999999999999 in floating point: still six reports.
        (0.15, 6, None, Counters(accepted=6, sent=6, limited=4)),
    ],
)
def test_without_memoization_every_report_spends_and_the_period_budget_caps_it(
    serve, ready_reporter, state, epsilon, reports_per_period, period_budget, counters
):
    spec = MetricSpec.create(
        "browser", LABELS, epsilon=epsilon, reports_per_period=reports_per_period, period_budget=period_budget
    )
    serve(spec)
    reporter = ready_reporter(memoize=False, clock=Clock())
    for _ in range(10):
        reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    assert state.total("browser") == counters.sent
    assert reporter.counters() == counters
    spent = reporter.privacy_spent()["browser"]
    assert spent.period_epsilon == spent.period_budget == counters.sent * units(epsilon) / 1e9


def test_the_app_can_lower_the_budgets_but_not_raise_them(serve, ready_reporter, state):
    spec = MetricSpec.create("browser", LABELS, epsilon=1.0, reports_per_period=10, lifetime_budget=2.0)
    other = MetricSpec.create("os", ["linux", "mac"], epsilon=1.0, reports_per_period=10)
    serve(spec, other)
    reporter = ready_reporter(memoize=False, clock=Clock(), lifetime_budget={"browser": 100.0, "os": 1.0})
    for _ in range(5):
        reporter.report("browser", "edge")
        reporter.report("os", "mac")
    assert reporter.force_flush(10)
    assert state.total("browser") == 2 and state.total("os") == 1
    spent = reporter.privacy_spent()
    assert spent["browser"].lifetime_budget == 2.0 and spent["os"].lifetime_budget == 1.0
    assert spent["os"].period_budget == 10.0
    lowered = ready_reporter(memoize=False, clock=Clock(), period_budget=0.5)
    lowered.report("os", "mac")  # a fresh response costs 1.0 > 0.5
    assert lowered.counters() == Counters(over_budget=1)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True, {"browser": 0}])
def test_an_app_budget_must_be_an_epsilon(make_reporter, bad):
    with pytest.raises(ConfigError, match="period_budget"):
        make_reporter(period_budget=bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("period", 0),
        ("period", 367 * DAY),
        ("period", 1.5),
        ("reports_per_period", 0),
        ("period_budget", 0.5),
        ("lifetime_budget", math.nan),
    ],
)
def test_a_spec_refuses_bounds_that_allow_nothing(field, value):
    with pytest.raises(MechanismError, match=field.replace("_", " ") if "budget" in field else "period"):
        MetricSpec.create("browser", LABELS, epsilon=1.0, **{field: value})


def test_period_and_reports_per_period_are_in_the_fingerprint_and_budgets_are_not():
    base = MetricSpec.create("browser", LABELS)
    assert MetricSpec.create("browser", LABELS, period=3600).fingerprint != base.fingerprint
    assert MetricSpec.create("browser", LABELS, reports_per_period=2).fingerprint != base.fingerprint
    assert MetricSpec.create("browser", LABELS, period_budget=5.0, lifetime_budget=9.0).fingerprint == base.fingerprint


def test_the_ledger_survives_a_restart_and_is_owner_only(serve, ready_reporter, state, tmp_path):
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    first = ready_reporter(queue_dir=tmp_path, clock=clock)
    first.report("browser", "edge")
    assert first.force_flush(10) and first.shutdown(5)
    path = tmp_path / "ledger.log"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text().splitlines()[-1]) == {
        "metric": "browser",
        "period": int(clock.now // DAY),
        "reports": 1,
        "period_epsilon": 1.0,
        "lifetime_epsilon": 1.0,
    }
    # Same device, same day: the period's report was sent already.
    second = ready_reporter(queue_dir=tmp_path, clock=clock)
    second.report("browser", "safari")
    assert second.counters() == Counters(limited=1)
    clock.next_period(spec)
    second.report("browser", "safari")
    assert second.force_flush(10)
    assert state.total("browser") == 2
    assert second.privacy_spent()["browser"].lifetime_epsilon == 2.0


def test_a_torn_ledger_line_is_cut_off(serve, ready_reporter, tmp_path):
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    first = ready_reporter(queue_dir=tmp_path, clock=clock)
    first.report("browser", "edge")
    assert first.shutdown(5)
    path = tmp_path / "ledger.log"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"metric":"browser","per')
    clock.next_period(spec)
    second = ready_reporter(queue_dir=tmp_path, clock=clock)
    second.report("browser", "safari")
    assert second.privacy_spent()["browser"].lifetime_epsilon == 2.0
    assert path.read_bytes().startswith(whole) and b'"per\n' not in path.read_bytes()


def test_reporters_sharing_a_queue_directory_are_one_device(serve, ready_reporter, state, tmp_path):
    spec = MetricSpec.create("browser", LABELS, reports_per_period=5)
    serve(spec)
    clock = Clock()
    reporters = [ready_reporter(queue_dir=tmp_path, clock=clock) for _ in range(3)]
    start = threading.Barrier(len(reporters))

    def hammer(reporter: Reporter) -> None:
        start.wait()
        for value in LABELS * 10:
            reporter.report("browser", value)

    threads = [threading.Thread(target=hammer, args=(r,)) for r in reporters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for reporter in reporters:
        assert reporter.force_flush(10)
    assert state.total("browser") == 5
    assert sum(r.counters().limited for r in reporters) == 3 * 40 - 5
    # Each admitted report spent epsilon at most (a response another Reporter drew a moment ago may
    # be charged again: the ledger errs on the side of privacy), and all three read one ledger.
    spent = [r.privacy_spent()["browser"] for r in reporters]
    assert len({(s.reports, s.lifetime_epsilon) for s in spent}) == 1
    assert spent[0].reports == 5 and 1.0 <= spent[0].lifetime_epsilon <= 5.0


def test_a_memoized_repeat_spends_nothing_new_after_a_restart(serve, ready_reporter, tmp_path):
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    first = ready_reporter(queue_dir=tmp_path, clock=clock)
    first.report("browser", "edge")
    assert first.shutdown(5)
    for _ in range(3):
        clock.next_period(spec)
        again = ready_reporter(queue_dir=tmp_path, clock=clock)
        again.report("browser", "edge")
        assert again.shutdown(5)
    assert again.privacy_spent()["browser"].lifetime_epsilon == 1.0


# --- clocks that move -------------------------------------------------------------------------


@pytest.mark.parametrize("memoize", [False, True])
def test_a_clock_moved_back_and_forth_never_reopens_a_period(serve, ready_reporter, state, memoize):
    # The field failure: a clock stepping one day back and forth gave 41 fresh responses of one
    # value in two periods (41 epsilon against 2), or 9 memoized reports where 2 are allowed.
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    reporter = ready_reporter(clock=clock, memoize=memoize)
    for step in range(40):
        clock.now = 1_000 * DAY + 3600.0 + (step % 2) * DAY
        reporter.report("browser", "edge")
        assert reporter.privacy_spent()["browser"].lifetime_epsilon <= 2.0
    assert reporter.force_flush(10)
    assert state.total("browser") == 2
    assert reporter.counters() == Counters(accepted=2, sent=2, limited=38)
    clock.now = 1_000 * DAY + 3600.0  # behind: the spending shown is the latest period's
    assert reporter.privacy_spent()["browser"].period_start == 1_001 * DAY


@pytest.mark.parametrize("memoize", [False, True])
def test_the_mark_holds_across_restarts_and_a_clock_years_ahead(serve, ready_reporter, state, tmp_path, memoize):
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    start = clock.now
    sent = 0
    # (days from the start, values reported) per Reporter, each a restart on the same queue_dir;
    # the aggregator says no time (revision 1), so nothing bounds the clock but the mark.
    for days, values, admitted in [
        (0, ["edge"], 1),
        (1, ["edge", "safari"], 1),
        (0, ["edge", "safari"], 0),  # set back: that period is closed
        (3650, ["safari"], 1),  # ten years ahead
        (0, ["edge"], 0),  # set back again: nothing reopens
        (2, ["safari", "edge"], 0),
    ]:
        clock.now = start + days * DAY
        reporter = ready_reporter(queue_dir=tmp_path, clock=clock, memoize=memoize)
        for value in values:
            reporter.report("browser", value)
        spent = reporter.privacy_spent()["browser"]
        assert reporter.counters().accepted == admitted
        assert spent.reports <= spec.reports_per_period and spent.period_epsilon <= spent.period_budget
        assert reporter.shutdown(5) == (admitted > 0 or reporter.counters().limited > 0)
        sent += reporter.counters().sent
    assert sent == state.total("browser") == 3
    assert spent.lifetime_epsilon <= 3.0 and spent.period_start == (int(start // DAY) + 3650) * DAY


def test_a_clock_ahead_is_bounded_by_the_aggregators(serve, ready_reporter, state, server_time, tmp_path):
    spec = MetricSpec.create("browser", LABELS)
    serve(spec)
    clock = Clock()
    start = clock.now
    server_time.now = int(start)  # the aggregator's clock: the device's before it jumps
    first = ready_reporter(queue_dir=tmp_path, clock=clock)
    first.report("browser", "edge")
    clock.now = start + 10 * YEAR
    first.report("browser", "safari")  # the same period still: the aggregator's time bounds it
    assert first.privacy_spent()["browser"].period_start == int(start // DAY) * DAY
    assert first.force_flush(10) and first.shutdown(5)
    assert first.counters() == Counters(accepted=1, sent=1, limited=1)
    # A restart ten years ahead whose specs come from the network (their copy is gone): bounded
    # again once they arrive; then the clock set back finds its period reported.
    (tmp_path / "specs.pb").unlink()
    second = ready_reporter(queue_dir=tmp_path, clock=clock)
    second.report("browser", "safari")
    clock.now = start
    second.report("browser", "safari")
    assert second.counters() == Counters(limited=2)
    assert state.total("browser") == 1


def test_the_bounded_clock():
    wall: list[float] = [5_000.0]
    server: list[float | None] = [None]
    clock = bounded_clock(lambda: wall[0], lambda: server[0])
    assert clock() == 5_000.0  # the aggregator's time unknown: the device's clock
    server[0] = 1_010.0
    assert clock() == 1_010.0 + ALLOWANCE
    wall[0] = 900.0  # behind the aggregator: left as it is
    assert clock() == 900.0


# --- budgets ----------------------------------------------------------------------------------


def _decimal(rng: random.Random, low: int, high: int) -> Decimal:
    """A decimal of nano-epsilon in [low, high] units, with 1 to 9 decimals."""
    places = rng.randint(1, 9)
    step = 10 ** (9 - places)
    return Decimal(rng.randint(max(1, low // step), high // step) * step) / 10**9


def budget_cases(n: int = 600, seed: int = 25) -> list[dict[str, object]]:
    """Epsilons and budgets as an operator writes them (decimals), and how many reports of one
    period each admits by exact decimal arithmetic: nine decimals at most, where the ledger's
    nano-epsilon units are exact. Budgets land on, just below and just above a multiple."""
    rng = random.Random(seed)
    cases: list[dict[str, object]] = []
    for _ in range(n):
        epsilon = _decimal(rng, 100_000, 20 * 10**9)
        reports = rng.choice([1, 2, 3, 6, 7, 10, 24, 100, rng.randint(1, 1_000)])
        fits = rng.randint(1, reports)
        budget = epsilon * fits + rng.choice([0, 0, Decimal("1e-9"), Decimal("-1e-9"), _decimal(rng, 1, 10**8)])
        period_budget = None if rng.random() < 0.3 or budget < epsilon else budget
        limit = reports if period_budget is None else (period_budget / epsilon).to_integral_value(ROUND_FLOOR)
        cases.append(
            {
                "epsilon": float(epsilon),
                "reports_per_period": reports,
                "period_budget": None if period_budget is None else float(period_budget),
                "admitted": int(min(reports, limit)),
            }
        )
    cases.append({"epsilon": 0.15, "reports_per_period": 6, "period_budget": 6 * 0.15, "admitted": 6})
    return cases


def test_the_shared_budget_vectors_are_what_budget_cases_makes():
    # One vector a line: python -c 'from test_ledger import *; write_budget_vectors()' in tests/client
    assert BUDGET_VECTORS.read_text() == budget_vectors_text()


def budget_vectors_text() -> str:
    lines = ",\n".join(f"  {json.dumps(case)}" for case in budget_cases())
    return f'{{"version": "v1", "vectors": [\n{lines}\n]}}\n'


def write_budget_vectors() -> None:
    BUDGET_VECTORS.write_text(budget_vectors_text())


def test_budgets_are_compared_exactly_by_the_shared_rule():
    # A brute-force search over (epsilon, budget) pairs, the shared vectors and 20,000 more: the old
    # float comparison with a relative slack admitted a report past a budget written to the
    # nano-epsilon.
    cases = json.loads(BUDGET_VECTORS.read_text())["vectors"] + budget_cases(20_000, seed=2)
    for number, case in enumerate(cases):
        spec = MetricSpec.create(
            "m", ["a", "b"], "krr", epsilon=case["epsilon"], reports_per_period=case["reports_per_period"]
        )
        ledger = Ledger(None, LogOnce())
        outcomes = [
            ledger.admit(spec, 7, spec.mechanism.epsilon, case["period_budget"], math.inf)
            for _ in range(min(case["reports_per_period"], case["admitted"] + 2))
        ]
        assert outcomes.count(None) == case["admitted"], (number, case)
    # Lifetime budgets by the same rule, over periods.
    spec = MetricSpec.create("m", ["a", "b"], "krr", epsilon=0.1, lifetime_budget=0.3)
    ledger = Ledger(None, LogOnce())
    assert [ledger.admit(spec, period, 0.1, None, 0.3) for period in range(4)] == [None, None, None, "budget"]


def test_units_survive_the_ledger_files_decimal_epsilon():
    rng = random.Random(7)
    for n in [0, 1, 900_000_000, 2**51 - 1] + [rng.randrange(2**51) for _ in range(100_000)]:
        assert units(n / 1e9) == n


# --- the estimand when budgets bind ------------------------------------------------------------


def test_a_value_the_budget_cannot_pay_for_takes_the_periods_slot(serve, ready_reporter, state, tmp_path):
    spec = MetricSpec.create("browser", LABELS, epsilon=1.0, lifetime_budget=1.0)
    serve(spec)
    clock = Clock()
    first = ready_reporter(queue_dir=tmp_path, clock=clock)
    first.report("browser", "edge")
    clock.next_period(spec)
    # The period's first value needs a new response the budget cannot pay: the period sends
    # nothing, not the memoized edge reported after it (which would make it report a second value).
    first.report("browser", "safari")
    first.report("browser", "edge")
    assert first.force_flush(10) and first.shutdown(5)
    assert first.counters() == Counters(accepted=1, sent=1, over_budget=1, limited=1)
    second = ready_reporter(queue_dir=tmp_path, clock=clock)  # and a restart does not reopen it
    second.report("browser", "edge")
    assert second.counters() == Counters(limited=1)
    clock.next_period(spec)
    second.report("browser", "edge")  # a new period whose first value is memoized: sent
    assert second.force_flush(10)
    assert state.total("browser") == 2


# --- a ledger that cannot be written -----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 64 KiB tmpfs (needs root, as the test machines run), so that the disk fills for real."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(disk)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs (not root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 512)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


def test_a_full_disk_refuses_reports_as_ledger_unavailable(serve, ready_reporter, state, small_disk, caplog):
    spec = MetricSpec.create("browser", LABELS, epsilon=0.25, reports_per_period=10_000)
    serve(spec)
    reporter = ready_reporter(queue_dir=small_disk, clock=Clock(), memoize=False)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    filler = _fill(small_disk)
    # The ledger's last page still takes a few lines; then every report is refused.
    for _ in range(200):
        reporter.report("browser", "edge")
        if reporter.counters().ledger_unavailable:
            break
    admitted = reporter.counters().accepted
    for _ in range(5):
        reporter.report("browser", "edge")
    counters = reporter.counters()
    assert (counters.ledger_unavailable, counters.over_budget, counters.accepted) == (6, 0, admitted)
    spent = reporter.privacy_spent()["browser"]  # what was recorded, not the refused reports
    assert spent.reports == admitted and spent.period_epsilon == spent.lifetime_epsilon == admitted * 0.25
    assert reporter.force_flush(10) is False
    assert any("ledger cannot be written" in r.getMessage() for r in caplog.records)
    assert not any("budget" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    filler.unlink()  # room again: admitted again
    reporter.report("browser", "edge")
    assert reporter.force_flush(10) is True
    assert reporter.counters().accepted == admitted + 1 == state.total("browser")
    assert reporter.shutdown(5) is False  # reports were refused for the ledger in its lifetime
