"""`veil privacy`: stable JSON, a readable table, one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from veil.cli import main
from veil.mechanism import MECHANISMS, spec_for, worst_mean_variance


def run_json(capsys, *args: str) -> dict:
    assert main(["privacy", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("k, epsilon", [(2, 0.5), (10, 1.0), (1024, 4.0)])
def test_json_has_the_stable_keys_and_the_right_numbers(capsys, k, epsilon):
    report = run_json(capsys, "--k", str(k), "--epsilon", str(epsilon))
    assert report["k"] == k and report["epsilon"] == epsilon
    names = [m["name"] for m in report["mechanisms"]]
    assert names == [m for m in MECHANISMS if m != "warner" or k == 2]
    for row in report["mechanisms"]:
        assert {"name", "q", "outputs", "parity", "risk_uniform", "risk_worst"} <= set(row)
        spec = spec_for(row["name"], k, epsilon)
        assert row["q"] == spec.q and row["outputs"] == spec.outputs
        assert row["parity"] <= math.exp(epsilon)
        if spec.admissible:
            assert row["parity_equals_gamma"] is True
        assert row["risk_uniform"] == pytest.approx(spec.risk_uniform())
        assert row["risk_worst"] >= row["risk_uniform"] * (1 - 1e-12)
        gamma = math.exp(epsilon)
        assert row["posterior_upper"]["0.1"] == pytest.approx(gamma * 0.1 / (1 + (gamma - 1) * 0.1))
    # The minimax design has the lowest worst-case risk of all (003 ch. 6).
    # (At k = 2 admissible RAPPOR is Warner's design too: equal, to rounding.)
    subset = report["mechanisms"][0]
    assert subset["risk_worst"] <= min(m["risk_worst"] for m in report["mechanisms"]) * (1 + 1e-12)


def test_one_mechanism_and_the_table(capsys):
    report = run_json(capsys, "--k", "16", "--epsilon", "1", "--mechanism", "krr")
    assert [m["name"] for m in report["mechanisms"]] == ["krr"] and report["mechanisms"][0]["q"] == 1
    assert main(["privacy", "--k", "16", "--epsilon", "1"]) == 0
    table = capsys.readouterr().out
    assert "rappor (not admissible)" in table and "=gamma" in table and "Lowest worst-case risk: subset" in table


@pytest.mark.parametrize("epsilon, share", [(2.0, 0.5), (4.0, 0.25), (8.0, 0.75)])
def test_a_numeric_metric_s_parts_are_the_config_s_and_its_lifetime_cost_their_sum(capsys, epsilon, share):
    from veil.aggregator.config import parse_config

    buckets = [100, 250, 500, 1000, 2500, 5000]
    args = ["--range", "0,10000", "--buckets", ",".join(map(str, buckets)), "--epsilon", str(epsilon)]
    report = run_json(capsys, *args, "--mean-share", str(share))
    declared = parse_config(
        {
            "metrics": [
                {
                    "name": "load_ms",
                    "type": "numeric",
                    "range": [0, 10000],
                    "buckets": buckets,
                    "epsilon": epsilon,
                    "mean_share": share,
                }
            ]
        }
    ).metrics
    assert [p["part"] for p in report["parts"]] == ["mean", "distribution"]
    for row, metric in zip(report["parts"], declared):
        assert row["epsilon"] == pytest.approx(metric.spec.mechanism.epsilon)
        assert row["k"] == metric.spec.k and row["labels"] == list(metric.spec.labels)
        assert row["mechanism"] == metric.spec.mechanism.name
    mean, dist = report["parts"]
    assert mean["levels"] == declared[0].spec.numeric.levels and dist["boundaries"] == buckets
    assert mean["mean_worst_n_variance"] == pytest.approx(
        worst_mean_variance(mean["epsilon"], mean["levels"]) * 10000**2
    )
    assert report["steady_epsilon"] == pytest.approx(epsilon)
    assert report["worst_lifetime_epsilon"] == pytest.approx(mean["k"] * mean["epsilon"] + 7 * dist["epsilon"])
    assert main(["privacy", *args]) == 0
    table = capsys.readouterr().out
    assert "7 buckets: [0, 100) [100, 250)" in table and "memoized" in table and "lifetime_budget caps it" in table


@pytest.mark.parametrize(
    "args, message",
    [
        (["--epsilon", "1"], "--k: the number of categories is needed (or --range for a numeric metric)."),
        (["--range", "5", "--epsilon", "1"], "--range: expected LOW,HIGH, got '5'."),
        (["--range", "10,0", "--epsilon", "1"], "needs a range [low, high] with low < high"),
        (["--range", "0,1", "--buckets", "x", "--epsilon", "1"], "--buckets: expected numbers separated by commas"),
        (["--range", "0,1", "--estimate", "distribution", "--epsilon", "1"], "--buckets: the distribution needs"),
        (["--range", "0,9", "--buckets", "2", "--mean-share", "1", "--epsilon", "1"], "--mean-share: expected a"),
        (["--k", "1", "--epsilon", "1"], "k must be a whole number of categories of at least 2"),
        (["--k", "4", "--epsilon", "0"], "epsilon must be a number from 0.0001 to 20, not 0.0."),
        (["--k", "4", "--epsilon", "1e-9"], "epsilon must be a number from 0.0001 to 20, not 1e-09."),
        (["--k", "4", "--epsilon", "20.5"], "epsilon must be a number from 0.0001 to 20, not 20.5."),
        (["--k", "4", "--epsilon", "1", "--mechanism", "warner"], "Warner's design is for two categories"),
    ],
)
def test_errors_are_one_line_and_exit_2(args, message):
    out = subprocess.run([sys.executable, "-m", "veil.cli", "privacy", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("veil privacy: ") and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "veil.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "privacy" in out.stdout and "demo" in out.stdout
