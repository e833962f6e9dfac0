"""A strings metric's rounds in the aggregator: declared in the config, derived period by period
from the store's counts, served and checked by ingest, found by the live estimates
(docs/protocol.md 10). In process, on the memory store and an injected clock: the rounds move
with the period, and a test drives seven periods in a second."""

from __future__ import annotations

import os
import tomllib

import numpy as np
import pytest

from veil.aggregator.config import parse_config
from veil.aggregator.errors import ConfigError
from veil.aggregator.ingest import Ingest
from veil.aggregator.instruments import Instruments
from veil.aggregator.live import LiveEstimates
from veil.aggregator.rounds import Rounds, settle_seconds
from veil.aggregator.store import MemoryStore
from veil.mechanism import REPORT_BYTES, REPORT_WORDS, ROUNDS, SeededRandomSource, round_name, string_code
from veil.wire.v1 import veil_pb2

PERIOD = 20
START = 1_000_000_000  # a multiple of PERIOD


def config(extra: str = "", server: str = "min_n = 10"):
    return parse_config(
        tomllib.loads(
            f"""
[server]
{server}
[[metrics]]
name = "crash"
type = "strings"
epsilon = 8.0
period = "{PERIOD}s"
{extra}
[[metrics]]
name = "browser"
labels = ["a", "b"]
epsilon = 1.0
"""
        )
    )


class Field:
    """An aggregator in process with a clock the test moves, and devices holding strings."""

    def __init__(self, values: list[str], seed: int = 5) -> None:
        self.now = float(START)
        self.config = config()
        self.store = MemoryStore(clock=lambda: self.now)
        self.rounds = Rounds(self.config, self.store, lambda: self.now)
        self.ingest = Ingest(self.config, self.store, Instruments(), lambda: self.now, rounds=self.rounds)
        self.live = LiveEstimates(self.config, self.store, clock=lambda: self.now, rounds=self.rounds)
        rng = np.random.default_rng(seed)
        self.codes = [string_code(v) for v in values]
        self.round_of = rng.integers(0, ROUNDS, size=len(values))
        self.source = SeededRandomSource(seed)

    def next_period(self) -> None:
        """Into the next period, past the moment its later rounds are fixed."""
        self.now = (int(self.now // PERIOD) + 1) * PERIOD + settle_seconds(PERIOD) + 1

    def report(self, made: float | None = None) -> dict[int, int]:
        """Every device answers its round if it is served; returns the reports per round."""
        specs = {s.name: s for s in self.ingest.specs().specs}
        period = int(self.now // PERIOD)
        sent = {}
        for r in range(ROUNDS):
            name = round_name("crash", r)
            if name not in specs:
                continue
            metric = self.rounds.round(self.config.strings[0], period, r)
            assert metric is not None and metric.spec.fingerprint == specs[name].fingerprint
            devices = np.flatnonzero(self.round_of == r)
            words = b"".join(
                np.array(
                    metric.spec.mechanism.randomize_prefix(metric.spec.strings.prefix_of(self.codes[i]), self.source),
                    dtype="<u4",
                ).tobytes()
                for i in devices
            )
            outcome = self.ingest.upload(self.upload(name, specs[name].fingerprint, words, made))
            assert outcome.counted, outcome.message
            sent[r] = len(devices)
        return sent

    def upload(self, name: str, fingerprint: str, words: bytes, made: float | None = None) -> veil_pb2.UploadRequest:
        made = self.now if made is None else made
        return veil_pb2.UploadRequest(
            batch_id=os.urandom(16),
            metric=name,
            spec_fingerprint=fingerprint,
            count=len(words) // REPORT_BYTES,
            hashed=veil_pb2.HashedReports(words=words),
            made_unix=int(made // PERIOD) * PERIOD,
        )


PLANTED = {"SIGBUS": 0.3, "OOM": 0.15, "ANR": 0.1, "NullPointerException at Foo.bar": 0.08}


def population(n: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    names = list(PLANTED)
    picks = rng.choice(len(names) + 1, size=n, p=[*PLANTED.values(), 1 - sum(PLANTED.values())])
    # The rest all differ, drawn from the same seed: each population, and so each test's
    # discoveries, is the same on every run (a null value passes a round's floor now and then).
    return [names[i] if i < len(names) else rng.bytes(5).hex() for i in picks]


def test_rounds_open_one_a_period_and_the_last_rounds_period_finds_the_planted_values():
    field = Field(population(6000))
    versions = set()
    for period in range(ROUNDS):
        field.next_period()
        assert sorted(field.report()) == list(range(period + 1))  # round r opens in the r-th period
        versions.add(field.ingest.specs_version)
    assert len(versions) == ROUNDS  # the specs version moves with the rounds
    (found,) = field.live.current("crash")
    assert found.strings is not None and found.metric.spec.strings.round == ROUNDS - 1
    texts = {v.text: v for v in found.strings.values}
    assert set(texts) == set(PLANTED) - {"NullPointerException at Foo.bar"} | {
        "#" + string_code("NullPointerException at Foo.bar")[1:].hex()
    }
    truth = {string_code(name): share for name, share in PLANTED.items()}
    for value in found.strings.values:
        assert value.lower <= truth[value.code] <= value.upper
        assert value.estimate > found.strings.floor


def test_what_was_found_is_kept_until_a_bucket_it_may_show_changes(monkeypatch):
    field = Field(population(2000))
    for _ in range(ROUNDS):
        field.next_period()
        field.report()
    reads: list[int] = []  # requests for counts, per store read
    read = field.store.versioned_read
    monkeypatch.setattr(
        field.store, "versioned_read", lambda keys, requests: reads.append(len(requests)) or read(keys, requests)
    )
    (found,) = field.live.current("crash")
    assert found.strings is not None and any(reads)
    reads.clear()
    # Nothing written since: the estimate kept, on the buckets' versions alone.
    assert field.live.current("crash")[0] is found and not any(reads)
    field.report()  # now's period's rounds, the verification round among them, hear from every device again
    (again,) = field.live.current("crash")
    assert again is not found and any(reads)


def test_the_later_rounds_wait_until_the_period_settles_and_a_restart_derives_the_same_rounds():
    field = Field(population(3000))
    field.next_period()
    field.report()
    field.next_period()
    field.now -= settle_seconds(PERIOD)  # into the period, but not past its settling
    assert [s.name for s in field.ingest.specs().specs if s.name.startswith("crash")] == ["crash.r0"]
    field.now += settle_seconds(PERIOD)
    served = {s.name: s.fingerprint for s in field.ingest.specs().specs if s.name.startswith("crash")}
    assert set(served) == {"crash.r0", "crash.r1"}
    again = Rounds(field.config, field.store, lambda: field.now)  # another process, or a restart
    period = int(field.now // PERIOD)
    assert again.round(field.config.strings[0], period, 1).spec.fingerprint == served["crash.r1"]


def test_a_rounds_batch_from_another_period_or_a_round_not_served_is_stale():
    field = Field(population(500))
    field.next_period()
    field.report()
    specs = {s.name: s for s in field.ingest.specs().specs}
    r0 = specs["crash.r0"]
    words = np.zeros(REPORT_WORDS, "<u4").tobytes()
    late = field.ingest.upload(field.upload("crash.r0", r0.fingerprint, words, made=field.now - PERIOD))
    assert late.status.label == "stale_spec" and "over" in late.message
    unserved = field.ingest.upload(field.upload("crash.r5", r0.fingerprint, words))
    assert unserved.status.label == "stale_spec"
    unknown = field.ingest.upload(field.upload(round_name("crash", ROUNDS), r0.fingerprint, words))
    assert unknown.status.label == "unknown_metric"


def test_a_malformed_hashed_report_refuses_the_batch_naming_it():
    field = Field(population(10))
    field.next_period()
    r0 = {s.name: s for s in field.ingest.specs().specs}["crash.r0"]
    words = np.zeros((3, REPORT_WORDS), "<u4")
    words[1, 2] = 2**31 - 1  # a coefficient not below P
    outcome = field.ingest.upload(field.upload("crash.r0", r0.fingerprint, words.tobytes()))
    assert outcome.status.label == "invalid" and "report 1" in outcome.message
    words[1, 2] = 0
    words[2, REPORT_WORDS - 1] = 1 << 12  # epsilon 8: 4096 buckets
    outcome = field.ingest.upload(field.upload("crash.r0", r0.fingerprint, words.tobytes()))
    assert outcome.status.label == "invalid" and "bucket" in outcome.message
    index_sets = veil_pb2.UploadRequest(
        batch_id=os.urandom(16),
        metric="crash.r0",
        spec_fingerprint=r0.fingerprint,
        count=1,
        index_sets=veil_pb2.IndexSets(set_size=1, indices=b"\0\0\0\0"),
        made_unix=int(field.now // PERIOD) * PERIOD,
    )
    assert field.ingest.upload(index_sets).status.label == "invalid"


def test_until_the_verification_round_has_reports_the_estimate_is_withheld_saying_when_values_come():
    field = Field(population(100))
    field.next_period()
    (withheld,) = field.live.current("crash")
    assert withheld.withheld and f"round {ROUNDS - 1}" in withheld.reason
    assert [e.metric.name for e in field.live.current()] == ["browser", "crash.r0"]
    assert [e.metric.name for e in field.live.current(window="period")] == ["crash.r0"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("reports_per_period = 2", "once per period"),
        ("survivors = 300", "at most 256"),
        ('labels = ["x"]', "labels"),
        ('windows = ["1h"]', "windows"),
        ('mechanism = "krr"', "mechanism"),
    ],
)
def test_a_strings_metric_takes_no_labels_windows_or_design_and_one_answer_a_period(extra, message):
    with pytest.raises(ConfigError, match=message):
        config(extra)


def test_a_round_name_cannot_be_declared_twice():
    with pytest.raises(ConfigError, match="declared twice"):
        parse_config(
            tomllib.loads(
                """
[[metrics]]
name = "crash.r3"
labels = ["a", "b"]
epsilon = 1.0
[[metrics]]
name = "crash"
type = "strings"
epsilon = 4.0
"""
            )
        )
