"""Strings metrics through the real SDK (issue 28, docs/protocol.md section 10):
`reporter.report("crash_signature", "SIGBUS")` reports the string's code in the one round its
device secret assigns it, randomizing the code's prefix under that round's served spec; the
round, the memo key and the specs' protos follow the shared vectors; a value whose round is not
served waits, as made, and is dropped when its period ends first; a steady value keeps its report
as the round's parents change; values of the wrong kind are dropped and counted.

The end-to-end tests run against the loopback collector (tests/client/loopback_collector.py: a
real gRPC or HTTP server with its own decoder, which counts each hashed report for the candidates
it holds); against the aggregator itself they belong with its strings rounds."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from loopback_collector import CollectorState
from veil_testing.clock import SimulatedTime

from veil.client import PrivacySpent, Reporter, UnknownCategoryError, spec_from_proto, spec_to_proto
from veil.client._log import LogOnce
from veil.client._memo import MemoStore, device_round
from veil.mechanism import (
    CODE_BYTES,
    ROUNDS,
    MechanismError,
    MetricSpec,
    SeededRandomSource,
    StringsRound,
    buckets_for,
    epsilon_to_gamma,
    string_code,
)
from veil.wire.v1 import veil_pb2

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto" / "veil" / "wire" / "v1" / "vectors"
DAY = 86400
START = 1_800_000_000 // DAY * DAY + 3600  # a simulated day, an hour in
METRIC = "crash_signature"
EPSILON = 4.0
BUCKETS = buckets_for(epsilon_to_gamma(EPSILON))


def _load(name: str) -> list[dict]:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))["vectors"]


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


# --- the rules, against the shared vectors ------------------------------------------------------


def test_the_devices_round_is_the_vectors():
    for v in _load("strings_rounds.json"):
        memo = MemoStore(None, LogOnce(), bytes.fromhex(v["secret"]))
        assert memo.round(v["metric"]) == v["round"], v


def test_the_strings_memo_key_is_the_vectors():
    for v in _load("strings_memo_keys.json"):
        memo = MemoStore(None, LogOnce(), bytes.fromhex(v["secret"]))
        assert memo.strings_key(v["spec"]["name"], v["design"], bytes.fromhex(v["prefix"])).hex() == v["key"]


def _round_specs() -> list[MetricSpec]:
    rounds = []
    for v in _load("fingerprints.json"):
        s = v["spec"]
        if "strings" in s:
            t = s["strings"]
            strings = StringsRound(t["metric"], t["round"], t["buckets"], tuple(bytes.fromhex(p) for p in t["parents"]))
            rounds.append(
                MetricSpec.strings_round(
                    strings, s["epsilon"], period=s["period"], reports_per_period=s["reports_per_period"]
                )
            )
    assert {spec.strings.round for spec in rounds if spec.strings} >= {0, 3, ROUNDS - 1}
    return rounds


def test_a_rounds_spec_travels_as_the_aggregator_serves_it():
    for spec in _round_specs():
        message = spec_to_proto(spec)
        # HASHED, no labels (the candidates follow from the parents), the round in `strings`.
        assert message.mechanism == veil_pb2.HASHED and not message.labels and message.q == 0
        assert message.strings.metric == spec.strings.metric and message.strings.rounds == ROUNDS
        assert spec_from_proto(veil_pb2.MetricSpec.FromString(message.SerializeToString())) == spec


@pytest.mark.parametrize(
    "tamper",
    [
        lambda m: m.strings.parents.append(b"\x01" * len(m.strings.parents[0])),  # not the fingerprint's
        lambda m: m.labels.append("x"),  # a round lists no labels
        lambda m: setattr(m, "mechanism", veil_pb2.KRR),  # a round is hashed
        lambda m: setattr(m.strings, "buckets", 3),  # not a power of two
        lambda m: m.ClearField("strings"),  # HASHED alone is no mechanism a spec may name
        lambda m: setattr(m.strings, "rounds", 9),  # a revision-4 round (8-byte codes)
        lambda m: setattr(m.strings, "rounds", ROUNDS + 1),
    ],
)
def test_a_round_the_device_cannot_reproduce_is_refused(tamper: Callable[[veil_pb2.MetricSpec], None]):
    spec = _round_specs()[1]
    message = spec_to_proto(spec)
    tamper(message)
    with pytest.raises(MechanismError):
        spec_from_proto(message)


# --- the SDK, end to end ------------------------------------------------------------------------


def _other_revision(round_: int, parents: tuple[bytes, ...], rounds: int) -> MetricSpec:
    """A round as an aggregator of another wire revision serves it: ``rounds`` rounds (a
    revision-4 one: 9, its codes 8 bytes), under the fingerprint of its own canonical form."""
    strings = StringsRound(METRIC, round_, BUCKETS, parents)
    object.__setattr__(strings, "rounds", rounds)  # what StringsRound refuses to make
    return MetricSpec.strings_round(strings, EPSILON)


@pytest.mark.parametrize("rounds", [9, ROUNDS - 1, ROUNDS + 1])
def test_rounds_of_another_revision_are_refused_and_the_other_metrics_reported(
    state: CollectorState,
    make_reporter,
    clock: SimulatedTime,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    rounds: int,
):
    """A strings round whose count of rounds is not this SDK's (an aggregator of another wire
    revision) is refused as any spec the device cannot reproduce: its strings are dropped and
    counted, nothing is raised into the app, and the other metrics are reported."""
    state.specs = [
        _other_revision(0, (b"",), rounds),
        _other_revision(1, (b"S", b"N"), rounds),
        MetricSpec.create("browser", ["chrome", "safari"], "krr", 1.0),
    ]
    ours = MetricSpec.strings_round(StringsRound(METRIC, 1, BUCKETS, (b"S", b"N")), EPSILON)
    assert state.specs[1].fingerprint != ours.fingerprint  # the count of rounds is in the canonical form
    reporter = _device(make_reporter, clock, _device_dir(tmp_path, 1))
    assert set(reporter.metrics) == {"browser"}
    reporter.report(METRIC, "SIGBUS")
    reporter.report(METRIC, b"SIGBUS")
    reporter.report("browser", "chrome")
    assert reporter.force_flush(10) is False  # the drops since the start
    counters = reporter.counters()
    assert (counters.dropped, counters.queued, counters.sent) == (2, 0, 1)
    assert state.total("browser") == 1 and state.total() == 1
    assert f"{METRIC}.r1" in caplog.text and "Refusing" in caplog.text


def _secret_of_round(metric: str, wanted: int) -> bytes:
    """A device secret whose round of ``metric`` is ``wanted``."""
    return next(
        secret
        for secret in (hashlib.sha256(b"strings test %d" % i).digest() for i in range(1000))
        if device_round(secret, metric) == wanted
    )


def _device_dir(tmp_path: Path, round_: int, name: str = "device") -> Path:
    """A queue directory whose device secret answers round ``round_`` of METRIC."""
    directory = tmp_path / name
    directory.mkdir(mode=0o700)
    key = directory / MemoStore.SECRET_FILE
    key.write_bytes(_secret_of_round(METRIC, round_))
    os.chmod(key, 0o600)
    return directory


def _round(round_: int, parents: tuple[bytes, ...], **rule: object) -> MetricSpec:
    return MetricSpec.strings_round(StringsRound(METRIC, round_, BUCKETS, parents), EPSILON, **rule)


def _rounds(*served: int, parents: dict[int, tuple[bytes, ...]] | None = None) -> list[MetricSpec]:
    """Rounds of METRIC: each round r's parents the r-byte prefixes of the codes of SIGBUS (itself) and
    SIGABRT! (hashed), or given."""
    codes = (string_code("SIGBUS"), string_code("SIGABRT!"))
    chosen = parents or {}
    return [
        _round(r, chosen.get(r, tuple({c[: CODE_BYTES if r == ROUNDS - 1 else r] for c in codes}) if r else (b"",)))
        for r in served
    ]


@pytest.fixture
def clock(state: CollectorState) -> SimulatedTime:
    clock = SimulatedTime(START)
    state.clock = clock  # the aggregator's clock is the devices'
    return clock


def _device(make_reporter: Callable[..., Reporter], clock: SimulatedTime, directory: Path, **settings: object):
    reporter = make_reporter(queue_dir=directory, clock=clock, elapsed_clock=clock, **settings)
    assert reporter.wait_for_specs(10)
    return reporter


def test_a_string_is_reported_in_the_devices_round(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    state.specs = _rounds(*range(ROUNDS))
    for round_ in (0, 3, ROUNDS - 1):
        reporter = _device(
            make_reporter, clock, _device_dir(tmp_path, round_, f"d{round_}"), random_source=SeededRandomSource(round_)
        )
        reporter.report(METRIC, "SIGBUS" if round_ != 3 else b"SIGBUS")
        assert reporter.force_flush(10)
        spec = state.by_name(f"{METRIC}.r{round_}")
        assert spec.strings is not None
        # The report is the prefix's, randomized from the device's source, and nothing else leaves.
        expected = spec.mechanism.randomize_prefix(
            spec.strings.prefix_of(string_code("SIGBUS")), SeededRandomSource(round_)
        )
        assert state.distinct(spec.name) == {expected: 1}
        assert state.total(spec.name) == 1 and reporter.counters().sent == 1
        assert reporter.privacy_spent()[spec.name].lifetime_epsilon == EPSILON
    assert state.total() == 3


def test_a_string_waits_for_its_round_as_made(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    state.specs = _rounds(0)  # round 5 has no parents yet
    reporter = _device(make_reporter, clock, _device_dir(tmp_path, 5), spec_ttl_ms=20)
    made = clock.now
    reporter.report(METRIC, "SIGBUS")
    assert reporter.force_flush(5)  # nothing to deliver yet: the value waits, not lost
    assert reporter.counters().queued == 1 and state.total() == 0
    clock.now += 600  # later in the same period the round is served
    with state.lock:
        state.specs = _rounds(0, 5)
    assert state.wait_for(lambda: state.total() == 1) and reporter.force_flush(10)
    batch = next(iter(state.made.values()))
    assert batch == made // DAY * DAY, "reported in the slot it was made in"
    counters = reporter.counters()
    assert counters.sent == 1 and counters.queued == 0 and counters.dropped == 0


def test_a_string_whose_period_ends_before_its_round_is_dropped(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    state.specs = _rounds(0)
    reporter = _device(make_reporter, clock, _device_dir(tmp_path, 5), spec_ttl_ms=20)
    reporter.report(METRIC, "SIGBUS")
    assert reporter.counters().queued == 1
    clock.now += DAY  # the next period: a round of it would not count a value made in this one
    with state.lock:
        state.specs = _rounds(0, 5)
    fetched = state.spec_calls
    assert state.wait_for(lambda: state.spec_calls > fetched + 1)  # the round was served meanwhile
    counters = reporter.counters()
    assert counters.dropped == 1 and counters.queued == 0 and counters.accepted == 0 and state.total() == 0
    assert "waited for its round until its period was over" in caplog.text


def test_a_steady_value_keeps_its_report_as_the_parents_change(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    """The memo key is the round's design, not its fingerprint: the same report period after
    period, epsilon spent once; other values, and memoize=False, draw afresh. Each day a new
    Reporter starts from the queue directory, whose specs (yesterday's rounds) are not used: the
    value waits for the day's answer."""
    directory = _device_dir(tmp_path, 2)
    name = f"{METRIC}.r2"

    def report_a_day(value: str, parents: tuple[bytes, ...], **settings: object) -> PrivacySpent:
        with state.lock:
            state.specs = _rounds(0, 2, parents={2: parents})
            batches = len(state.counted)
        reporter = _device(make_reporter, clock, directory, **settings)
        reporter.report(METRIC, value)
        assert state.wait_for(lambda: len(state.counted) == batches + 1) and reporter.force_flush(10)
        spent = reporter.privacy_spent()[name]
        assert spent.reports == 1 and reporter.counters().sent == 1
        reporter.shutdown()
        clock.now += DAY
        return spent

    sent = []
    for parents in ((b"SI",), (b"SI", b"NU"), (b"AB", b"SI", b"ZZ")):
        assert report_a_day("SIGBUS", parents).lifetime_epsilon == EPSILON
        sent.append(state.distinct(name))
    assert len({report for counter in sent for report in counter}) == 1, "one report, three fingerprints"
    assert report_a_day("NULL", (b"SI",)).lifetime_epsilon == 2 * EPSILON  # another prefix: a fresh response
    # The metric's name covers its rounds. (New rounds every day: the loopback collector's HTTP 304
    # would say the real time, not the simulated one.)
    assert report_a_day("SIGBUS", (b"NU",), memoize={METRIC: False}).lifetime_epsilon == 3 * EPSILON


def test_values_of_the_wrong_kind_are_dropped_and_counted(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    state.specs = [*_rounds(0), MetricSpec.create("browser", ["chrome", "safari"], "krr", 1.0)]
    reporter = _device(make_reporter, clock, _device_dir(tmp_path, 0))
    reporter.report(METRIC, 3)  # an index
    reporter.report(METRIC, 2.5)  # a number
    reporter.report(f"{METRIC}.r0", "SIGBUS")  # a round by its own name
    reporter.report("browser", b"chrome")  # bytes for a metric of categories
    with pytest.raises(UnknownCategoryError):
        reporter.report(METRIC, None)  # type: ignore[arg-type]  # misuse whatever the specs say
    assert reporter.counters().dropped == 4 and reporter.counters().accepted == 0
    reporter.report(METRIC, bytearray(b"SIGBUS"))
    assert reporter.force_flush(10) is False  # the drops since the start
    assert state.total(f"{METRIC}.r0") == 1


def test_a_round_batch_refused_as_stale_is_counted_failed(
    state: CollectorState, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    """The round it answered is over (its parents changed): FAILED_PRECONDITION, as any stale spec."""
    state.specs = _rounds(0, 1)
    reporter = _device(make_reporter, clock, _device_dir(tmp_path, 1), schedule_delay_ms=60_000)
    reporter.report(METRIC, "SIGBUS")
    calls = state.spec_calls
    with state.lock:
        state.specs = _rounds(0, 1, parents={1: (b"X",)})
    assert reporter.force_flush(10) is False
    counters = reporter.counters()
    assert counters.failed == 1 and counters.sent == 0
    assert state.wait_for(lambda: state.spec_calls > calls), "the specs are fetched again"


def test_a_string_made_before_the_specs_is_reported_in_its_round(
    state: CollectorState, collector, make_reporter, clock: SimulatedTime, tmp_path: Path
):
    state.specs = _rounds(0, 4)
    collector.stop()  # a first start offline
    reporter = make_reporter(queue_dir=_device_dir(tmp_path, 4), clock=clock, elapsed_clock=clock)
    reporter.report(METRIC, "SIGBUS")
    assert reporter.counters().queued == 1 and not reporter.metrics
    collector.start()
    assert reporter.wait_for_specs(10) and state.wait_for(lambda: state.total(f"{METRIC}.r4") == 1)
