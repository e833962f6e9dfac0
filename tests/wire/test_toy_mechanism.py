"""A new mechanism needs its own module and one registration, nothing else.

The toy below is a design of its own (not a subclass of any of Veil's): every report holds
exactly two categories, the true one kept with probability 2 gamma / (2 gamma + k - 2). It is
registered once, with veil.mechanism.register, and must then flow through everything that
handles reports: the config, the SDK's spec messages and encoder, the aggregator's message-size
limit, decoder, counts, estimates and batch simulator, and the CLI's view of estimates. Any of
those that still kept its own list of mechanisms would refuse it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

import grpc
import numpy as np
import pytest

from veil.mechanism import (
    BITMAPS,
    INDEX_SETS,
    MECHANISMS,
    LinearEstimator,
    MechanismError,
    MechanismSpec,
    MetricSpec,
    SeededRandomSource,
    SystemRandomSource,
    WeightLaw,
    encoding,
    register,
)
from veil.mechanism._random import bernoulli, choose
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

TOY = "toy-pairs"
TOY_PROTO = 99  # a value the wire enum does not name: proto3 enums are open
_ONE64 = 1 << 64
_MAX_BATCH = 2000
_SYSTEM = SystemRandomSource()


@dataclass(frozen=True)
class PairSpec(MechanismSpec):
    """Reports of exactly two categories: the true one and another with probability p, two
    others otherwise, chosen uniformly; the ratio p (k-2) / (2 (1-p)) is gamma."""

    name: ClassVar[str] = TOY
    admissible: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k < 3:
            raise MechanismError(f"The pair design needs at least 3 categories, not {self.k}.")

    @property
    def q(self) -> int:
        return 2

    @cached_property
    def keep_threshold(self) -> int:
        g = Fraction(self.gamma)
        return math.floor(_ONE64 * 2 * g / (2 * g + self.k - 2))

    @property
    def outputs(self) -> int:
        return math.comb(self.k, 2)

    @property
    def parity(self) -> float:
        t = self.keep_threshold
        return float(Fraction(t * (self.k - 2), (_ONE64 - t) * 2))

    def randomize(self, value: int, source=_SYSTEM) -> tuple[int, ...]:
        value = self.check_value(value)
        keep = bernoulli(source, self.keep_threshold)
        report = [i + (i >= value) for i in choose(source, self.k - 1, 1 if keep else 2)]
        return tuple(sorted(report + [value] if keep else report))

    def probability(self, report: tuple[int, ...], value: int) -> Fraction:
        if len(report) != 2 or report[0] == report[1]:
            return Fraction(0)
        keep = Fraction(self.keep_threshold, _ONE64)
        return keep / (self.k - 1) if value in report else (1 - keep) / math.comb(self.k - 1, 2)

    def output_space(self) -> Iterator[tuple[int, ...]]:
        return itertools.combinations(range(self.k), 2)

    def _build_weight_law(self) -> WeightLaw:
        p = 2 * self.gamma / (2 * self.gamma + self.k - 2)
        return WeightLaw((2,), (1.0,), (p,), ((p + 2 * (1 - p)) / (self.k - 1),))

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        # Category j is in a report with probability b + (a - b) pi_j, a = p, b the law's other:
        # pi_j = (V_j / n - b) / (a - b).
        law = self._build_weight_law()
        a, b = law.one_true[0], law.one_other[0]
        return {"minimax": LinearEstimator("minimax", (2,), (1 / (a - b),), (-b / (a - b),))}


@pytest.fixture
def toy():
    """The toy, registered for one test (the registry is restored after it)."""
    from veil.mechanism import _wire

    before = dict(_wire._SHAPES)
    shape = register(PairSpec, proto=TOY_PROTO, sampler="q-subset")
    yield shape
    _wire._SHAPES.clear()
    _wire._SHAPES.update(before)


def metric(k: int, name: str = "pairs", epsilon: float = 1.0) -> MetricSpec:
    return MetricSpec.create(name, [f"c{j}" for j in range(k)], TOY, epsilon, reports_per_period=10**6)


def test_the_toy_is_a_valid_design(toy):
    """Its estimator is unbiased, exactly in expectation, and its parity is at most gamma."""
    spec = metric(5).mechanism
    (alpha,), (beta,) = spec.estimator.alpha, spec.estimator.beta
    for truth in range(spec.k):
        reports = list(spec.output_space())
        assert sum(spec.probability(r, truth) for r in reports) == 1
        for j in range(spec.k):
            member = float(sum(spec.probability(r, truth) for r in reports if j in r))
            assert alpha * member + beta == pytest.approx(float(j == truth), abs=1e-9)
    assert spec.parity <= spec.gamma


def test_one_registration_names_it_everywhere(toy):
    from veil.aggregator.config import parse_config
    from veil.client._specs import spec_from_proto, spec_to_proto

    assert MECHANISMS[TOY] is toy and toy.name == TOY
    spec = metric(6)
    message = spec_to_proto(spec)
    assert message.mechanism == TOY_PROTO and message.q == 2
    assert spec_from_proto(veil_pb2.MetricSpec.FromString(message.SerializeToString())) == spec
    config = parse_config(_config(spec))
    assert config.metrics[0].spec == spec
    with pytest.raises(MechanismError, match="already registered"):
        register(PairSpec, proto=TOY_PROTO + 1)

    class Other(PairSpec):
        name = "toy-other"

    with pytest.raises(MechanismError, match="already registered"):
        register(Other, proto=1)  # subset's
    with pytest.raises(MechanismError, match="batch sampler"):
        register(Other, proto=TOY_PROTO + 1, sampler="olh")
    assert "toy-other" not in MECHANISMS


@pytest.mark.parametrize("k, sent", [(5, BITMAPS), (100, INDEX_SETS)])
def test_it_is_encoded_decoded_counted_and_estimated(toy, k, sent):
    from veil.aggregator.decode import decode_upload, parse_upload, reports_held
    from veil.aggregator.estimate import estimate
    from veil.aggregator.simulate import count_reports
    from veil.client._encoding import encode_batch

    spec = metric(k)
    source = SeededRandomSource(3)
    values = [random.Random(4).randrange(k) for _ in range(500)]
    reports = [spec.mechanism.randomize(v, source) for v in values]
    request = parse_upload(encode_batch(spec, reports, bytes(16)))
    assert request.WhichOneof("reports") == sent == encoding(spec.mechanism)
    assert reports_held(request, spec) == len(reports)

    counts = decode_upload(request, spec, max_reports=1000)
    by_hand = np.zeros(k, np.int64)
    for report in reports:
        by_hand[list(report)] += 1
    assert counts.weights == (2,) and counts.total == len(reports) and counts.totals.tolist() == by_hand.tolist()
    again = count_reports(spec.mechanism, np.array(reports, np.uint32))
    assert again.n.tolist() == counts.n.tolist() and again.v.tolist() == counts.v.tolist()

    result = estimate(spec.mechanism, counts)
    alpha, beta = spec.mechanism.estimator.alpha[0], spec.mechanism.estimator.beta[0]
    assert result.estimate == pytest.approx(alpha * by_hand / len(reports) + beta, rel=1e-12)
    assert (result.stderr > 0).all()


def test_the_batch_sampler_it_names_draws_it(toy):
    """simulate_counts draws the toy with the q-subset kernels, and the estimates find the truth."""
    from veil.aggregator.estimate import estimate
    from veil.aggregator.simulate import FastKeystream, simulate_counts

    spec = metric(8).mechanism
    truth = np.array([0.4, 0.2, 0.1, 0.1, 0.08, 0.06, 0.04, 0.02])
    values = np.random.default_rng(5).choice(spec.k, size=50_000, p=truth)
    counts = simulate_counts(spec, values, keystream=FastKeystream(6))
    assert counts.total == values.size and (counts.totals == 0).sum() == 0
    result = estimate(spec, counts)
    assert np.all(np.abs(result.estimate - truth) < 5 * result.stderr)


def test_sdk_reports_of_it_become_estimates_over_grpc(toy):
    """The real SDK fetches its spec, randomizes, encodes and uploads; the aggregator accepts a
    full batch in the toy's widest encoding, counts every report and serves its estimates."""
    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import Aggregator
    from veil.cli._estimates import to_json
    from veil.client import Reporter
    from veil.client._encoding import encode_batch

    spec = metric(100)
    aggregator = Aggregator(parse_config(_config(spec)))
    aggregator.start()
    try:
        endpoint = f"127.0.0.1:{aggregator.grpc_port}"
        n = 300
        with Reporter(endpoint, tls=False, memoize=False, random_source=SeededRandomSource(7)) as reporter:
            assert reporter.wait_for_specs(10)
            assert reporter.metrics["pairs"] == spec
            for i in range(n):
                reporter.report("pairs", f"c{i % 7}")
            assert reporter.force_flush(60), reporter.counters()
            assert reporter.counters().sent == n

        # The SDK sends index sets (8 bytes a report); bitmaps (13 bytes) are the widest, and
        # a full batch of them must not be refused unread by the message-size limit.
        channel = grpc.insecure_channel(endpoint)
        source = SeededRandomSource(8)
        reports = [spec.mechanism.randomize(i % 100, source) for i in range(_MAX_BATCH)]
        widest = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, bytes(range(16))))
        widest.bitmaps.bits = b"".join(sum(1 << j for j in r).to_bytes(13, "little") for r in reports)
        assert widest.WhichOneof("reports") == BITMAPS
        veil_pb2_grpc.CollectorStub(channel).Upload(widest, timeout=10)

        response = veil_pb2_grpc.EstimatesStub(channel).Get(
            veil_pb2.EstimatesRequest(metric="pairs", window="total"), timeout=10
        )
        (window,) = response.estimates
        assert window.n == n + _MAX_BATCH and window.mechanism == TOY_PROTO and not window.withheld
        shown = to_json(window)
        assert shown["mechanism"] == TOY and shown["n"] == n + _MAX_BATCH
        assert all(math.isfinite(c["estimate"]) for c in shown["categories"])
    finally:
        aggregator.stop(grace=0)


def _config(spec: MetricSpec) -> dict:
    return {
        "server": {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "min_n": 100, "max_batch": _MAX_BATCH},
        "store": {"url": "memory"},
        "metrics": [
            {
                "name": spec.name,
                "labels": list(spec.labels),
                "mechanism": TOY,
                "epsilon": spec.mechanism.epsilon,
                "reports_per_period": spec.reports_per_period,
            }
        ],
    }
