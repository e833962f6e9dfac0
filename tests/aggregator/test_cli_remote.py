"""`veil simulate`, `veil estimates` and `veil specs` against a running aggregator."""

from __future__ import annotations

import json
import urllib.request

import pytest
from veil_testing.running import SPEC_NAMES

from veil.cli import main
from veil.cli._estimates import interval_text


def run_json(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "mode, metric, reports", [("batch", "browser", 25_000), ("batch", "crash_screen", 5_000), ("sdk", "os", 3_000)]
)
def test_simulate_yields_the_expected_n(start_aggregator, capsys, mode, metric, reports):
    aggregator = start_aggregator()
    address = f"127.0.0.1:{aggregator.grpc_port}"
    # In sdk mode every device reports 10 times, all of which its metric's period allows.
    devices = ["--devices", str(reports // 10)] if mode == "sdk" else []
    summary = run_json(
        capsys,
        "simulate",
        metric,
        "--address",
        address,
        "--reports",
        str(reports),
        "--mode",
        mode,
        "--seed",
        "4",
        "--batch-size",
        "500",
        *devices,
    )
    assert summary["acknowledged"] == reports and summary["failed"] == 0
    estimates = run_json(capsys, "estimates", metric, "--address", address, "--window", "total")
    (window,) = estimates["estimates"]
    assert window["n"] == reports and not window["withheld"]
    truth = summary["truth"]
    assert all(
        c["lower"] - 3 * c["stderr"] <= truth[c["label"]] <= c["upper"] + 3 * c["stderr"] for c in window["categories"]
    )


def test_estimates_json_matches_the_http_json(start_aggregator, capsys):
    aggregator = start_aggregator(min_n=10)
    address = f"127.0.0.1:{aggregator.grpc_port}"
    for metric in SPEC_NAMES:
        run_json(capsys, "simulate", metric, "--address", address, "--reports", "2000", "--seed", "1")
    over_grpc = run_json(capsys, "estimates", "--address", address)
    over_http = json.load(urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/v1/estimates"))
    assert over_grpc["estimates"] == over_http["estimates"]
    assert over_grpc["projection"] == over_http["projection"]
    assert main(["estimates", "browser", "--address", address, "--projection"]) == 0
    table = capsys.readouterr().out
    assert "browser / total" in table and "projected*" in table and "biased" in table


def test_specs_lists_every_metric(start_aggregator, capsys):
    aggregator = start_aggregator()
    specs = run_json(capsys, "specs", "--address", f"127.0.0.1:{aggregator.grpc_port}")
    assert [s["name"] for s in specs["specs"]] == list(SPEC_NAMES)
    assert main(["specs", "--address", f"127.0.0.1:{aggregator.grpc_port}"]) == 0
    assert "rappor-admissible" in capsys.readouterr().out


def test_unreachable_aggregator_and_unknown_metric_are_one_line_errors(start_aggregator, capsys):
    assert main(["specs", "--address", "127.0.0.1:1", "--timeout", "1"]) == 2
    assert "UNAVAILABLE" in capsys.readouterr().err
    aggregator = start_aggregator()
    assert main(["simulate", "nope", "--address", f"127.0.0.1:{aggregator.grpc_port}"]) == 2
    assert "declares no metric 'nope'" in capsys.readouterr().err
    assert main(["simulate", "os", "--address", f"127.0.0.1:{aggregator.grpc_port}", "--distribution", "1,2"]) == 2
    assert "--distribution: expected 6 non-negative weights" in capsys.readouterr().err


def test_estimates_table_and_csv_show_intervals_periods_and_provisional(start_aggregator, capsys):
    aggregator = start_aggregator(min_n=10)
    address = f"127.0.0.1:{aggregator.grpc_port}"
    run_json(capsys, "simulate", "browser", "--address", address, "--reports", "2000", "--seed", "2")
    (total, hour) = run_json(capsys, "estimates", "browser", "--address", address)["estimates"]
    assert total["provisional"] and hour["provisional"] and total["periods"] == hour["periods"] == 1
    assert main(["estimates", "browser", "--address", address]) == 0
    table = capsys.readouterr().out
    assert table.count("provisional (reports made in this bucket may still arrive)") == 2
    assert "\u00b1" not in table
    for c in total["categories"]:
        assert f"[{c['lower']:>8.4f}, {c['upper']:>8.4f}]" in table
    assert main(["estimates", "browser", "--address", address, "--window", "1h", "--csv"]) == 0
    head, first, *_ = capsys.readouterr().out.splitlines()
    columns = head.split(",")
    assert columns[5:8] == ["reports_per_device", "periods", "provisional"]
    assert first.split(",")[6:8] == ["1", "True"]
    assert main(["estimates", "browser", "--address", address, "--window", "1h", "--last", "3h"]) == 0
    series = capsys.readouterr().out
    assert "* provisional (reports made in this bucket may still arrive)" in series


def test_an_interval_below_0_reads_as_no_evidence_of_presence():
    assert interval_text({"lower": -0.21, "upper": -0.1}) == "no evidence of presence"
    assert interval_text({"lower": 0.0, "upper": 0.077}) == "[  0.0000,   0.0770]"
    assert interval_text({"lower": None, "upper": None}) == "[     n/a,      n/a]"
