"""`veil demo` (in-process): rounds of simulated reports and estimates against the truth."""

from __future__ import annotations

import re

from veil.aggregator.cli import main
from veil.aggregator.cli._demo import DEMO_METRICS


def test_demo_runs_and_its_intervals_mostly_cover_the_truth(capsys):
    assert main(["demo", "--rounds", "2", "--per-round", "20000", "--interval", "0", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "round 2/2" in out and "seeded fast generator" in out
    final = out.split("round 2/2")[1]
    for metric in DEMO_METRICS:
        match = re.search(rf"{metric.name} .*n = 40,000  truth inside its 95% interval: (\d+)/(\d+)", final)
        assert match, metric.name
        inside, k = map(int, match.groups())
        assert k == len(metric.labels) and inside >= 0.8 * k


def test_demo_refuses_bad_arguments(capsys):
    assert main(["demo", "--rounds", "0"]) == 2
    assert "--rounds and --per-round must be at least 1" in capsys.readouterr().err
