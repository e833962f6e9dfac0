"""Specs: validation, derived parameters, the minimax q, fingerprints."""

from __future__ import annotations

import math

import pytest

from veil.mechanism import (
    MECHANISMS,
    AdmissibleRapporSpec,
    KrrSpec,
    MechanismError,
    MetricSpec,
    RapporSpec,
    SubsetSpec,
    WarnerSpec,
    minimax_q,
    spec_for,
    subset_objective,
)

EPSILON_GRID = [0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0]


@pytest.mark.parametrize("epsilon", EPSILON_GRID)
def test_minimax_q_maximizes_f_with_the_tie_rule(epsilon):
    gamma = math.exp(epsilon)
    for k in range(2, 201):
        q = minimax_q(k, gamma)
        values = {x: subset_objective(k, gamma, x) for x in range(1, k)}
        best = max(values.values())
        assert 1 <= q <= k - 1
        assert values[q] >= best * (1 - 1e-12), (k, epsilon, q)
        low, high = math.floor(k / (1 + gamma)), math.ceil(k / (1 + gamma))
        assert q in (low, high)
        # Eq. 4.4: the floor wins ties (and whenever it is at least 1 and no worse).
        if low >= 1 and values.get(low, -1) >= values.get(high, math.inf):
            assert q == low


def test_q_of_each_design():
    assert SubsetSpec(1024, 1.0).q == minimax_q(1024, math.e)
    assert KrrSpec(1024, 1.0).q == 1
    assert WarnerSpec(2, 1.0).q == 1
    assert RapporSpec(16, 1.0).q is None
    # k = 2 makes the subset design Warner's (000 Thm 4.2).
    assert SubsetSpec(2, 0.5).q == 1
    assert SubsetSpec(2, 0.5).keep_threshold == WarnerSpec(2, 0.5).keep_threshold


def test_output_space_sizes():
    assert SubsetSpec(10, 1.0).outputs == math.comb(10, SubsetSpec(10, 1.0).q)
    assert KrrSpec(10, 1.0).outputs == 10
    assert WarnerSpec(2, 1.0).outputs == 2
    assert RapporSpec(10, 1.0).outputs == 1024
    assert AdmissibleRapporSpec(10, 1.0).outputs == 1022


@pytest.mark.parametrize(
    "k, epsilon",
    [
        (1, 1.0),
        (0, 1.0),
        (2.5, 1.0),
        (True, 1.0),
        ("8", 1.0),
        (8, 0.0),
        (8, -1.0),
        (8, math.nan),
        (8, math.inf),
        (8, "1"),
        (8, 51.0),
        (8, 20.5),
        (8, 1e-9),
    ],
)
def test_bad_specs_raise_one_plain_sentence(k, epsilon):
    for name in MECHANISMS:
        with pytest.raises(MechanismError) as err:
            spec_for(name, k if name != "warner" or k != 8 else 2, epsilon)
        message = str(err.value)
        assert isinstance(err.value, ValueError)
        assert message.endswith(".") and message.count(". ") == 0


def test_warner_is_binary_and_unknown_mechanisms_are_refused():
    with pytest.raises(MechanismError, match="two categories"):
        WarnerSpec(3, 1.0)
    with pytest.raises(MechanismError, match="Unknown mechanism 'oue'"):
        spec_for("oue", 4, 1.0)


@pytest.mark.parametrize("name", MECHANISMS)
def test_values_out_of_range_are_refused(name):
    spec = spec_for(name, 2 if name == "warner" else 5, 1.0)
    for bad in (-1, spec.k, 2.0, True, None, "0"):
        with pytest.raises(MechanismError, match="category index"):
            spec.randomize(bad)


def test_fingerprints_are_stable_and_tell_specs_apart():
    assert SubsetSpec(8, 1.0).fingerprint == SubsetSpec(8, 1).fingerprint
    prints = {spec_for(name, 2, eps).fingerprint for name in MECHANISMS for eps in (0.5, 1.0)}
    assert len(prints) == 2 * len(MECHANISMS)
    # Pinned: a change in the canonical form would split counts of live metrics.
    assert SubsetSpec(8, 1.0).canonical() == {"mechanism": "subset", "k": 8, "epsilon": 1.0}
    assert SubsetSpec(8, 1.0).fingerprint == "ec4ffab1f10e93f46b33564a7e13f203"


def test_metric_spec():
    metric = MetricSpec.create("browser", ["chrome", "firefox", "safari"], "krr", 2.0)
    assert metric.k == 3 and metric.mechanism == KrrSpec(3, 2.0)
    assert metric.index("safari") == 2 and metric.index(1) == 1
    with pytest.raises(MechanismError, match="'edge' is not a category of metric 'browser'"):
        metric.index("edge")
    renamed = MetricSpec.create("browser", ["chrome", "firefox", "opera"], "krr", 2.0)
    assert renamed.fingerprint != metric.fingerprint != metric.mechanism.fingerprint
    with pytest.raises(MechanismError, match="distinct"):
        MetricSpec.create("m", ["a", "a"])
    with pytest.raises(MechanismError, match="2 labels but its mechanism has k = 3"):
        MetricSpec("m", ("a", "b"), SubsetSpec(3, 1.0))
