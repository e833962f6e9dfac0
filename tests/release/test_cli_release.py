"""`veil release pram | dp-pram | mask | example`: files in, files out, one-line errors."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import subprocess
import sys

import pytest

from veil import cli

PARTITION = "sex;age=0-17,18-24,25-34,35-44,45-54,55-64,65-;race=White,Black,*"


def run_cli(*args: str) -> int:
    """`veil release ARGS`, through veil's main once `release` is registered, else the same way main runs it."""
    if "release" in cli._COMMANDS:
        return cli.main(["release", *args])
    parser = argparse.ArgumentParser(prog="veil")
    commands = parser.add_subparsers(dest="command", required=True)
    module = importlib.import_module("veil.cli._release")
    module.add_arguments(commands.add_parser("release"))
    namespace = parser.parse_args(["release", *args])
    try:
        return module.run(namespace)
    except cli.CliError as err:
        print(f"veil release: {err}", file=sys.stderr)
        return 2


@pytest.fixture(scope="module")
def population_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("release") / "population.csv"
    assert run_cli("example", "--output", str(path), "--records", "12000", "--seed", "3") == 0
    return path


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_example_then_pram_writes_the_table_and_the_report(population_csv, tmp_path, capsys):
    capsys.readouterr()
    out, report = tmp_path / "released.csv", tmp_path / "report.json"
    release = (
        "pram",
        "--input",
        str(population_csv),
        "--keys",
        "age,sex,race,marital,area",
        "--partition",
        PARTITION,
        "--xi",
        "0.395",
        "--seed",
        "11",
    )
    code = run_cli(*release, "--output", str(out), "--report", str(report))
    assert code == 0
    text = capsys.readouterr().out
    assert "Goal 3 at xi = 0.395" in text and "all within xi" in text and "tau*=1" in text
    assert "marital" in text and "sampling SD" in text and "perturbation SD" in text
    header, rows = read(out)
    header0, rows0 = read(population_csv)
    assert header == header0 and len(rows) == len(rows0) == 12_000
    assert [r[0] for r in rows] == [r[0] for r in rows0]  # sex is kept
    data = json.loads(report.read_text())
    assert data["goal"] == 3 and data["min_block_cells"] == 5 and data["guarantee"]["holds"]
    assert data["records_changed"] == sum(r != r0 for r, r0 in zip(rows, rows0))
    assert "not recorded" in data["seed"]
    # The same seed replays the release.
    again = tmp_path / "again.csv"
    run_cli(*release, "--output", str(again), "--quiet")
    assert again.read_text() == out.read_text()


def test_dp_pram_and_mask(population_csv, tmp_path, capsys):
    capsys.readouterr()
    out, report = tmp_path / "dp.csv", tmp_path / "dp.json"
    assert (
        run_cli(
            "dp-pram",
            "--input",
            str(population_csv),
            "--columns",
            "marital",
            "--epsilon",
            "1",
            "--domain",
            "marital=married,widowed,divorced,separated,never married",
            "--seed",
            "2",
            "--output",
            str(out),
            "--report",
            str(report),
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "parity" in text and "MLE" in text
    data = json.loads(report.read_text())["columns"]["marital"]
    assert data["categories"][0] == "married" and data["parity"] <= data["e_epsilon"]
    masked = tmp_path / "masked.csv"
    assert (
        run_cli(
            "mask",
            "--input",
            str(population_csv),
            "--columns",
            "smoker,insured",
            "--p",
            "smoker=0.15,insured=0.2",
            "--seed",
            "2",
            "--output",
            str(masked),
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "smoker" in text and "estimate" in text and "smoker,insured" in text
    header, rows = read(masked)
    assert {r[header.index("smoker")] for r in rows} <= {"0", "1"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["pram", "--keys", "agee,sex", "--xi", "0.4"], "key column 'agee' is not in the table"),
        (
            ["pram", "--keys", "age,race", "--partition", "race=White,Black,Purple", "--xi", "0.4"],
            "'Purple' is not a value of column 'race'",
        ),
        (
            ["pram", "--keys", "age,race", "--partition", "age=0-17,18-64", "--xi", "0.4"],
            "value '65' of column 'age' is in no group",
        ),
        (["pram", "--keys", "age,race", "--xi", "0.3"], "xi must be strictly between 1/3 and 1"),
        (
            ["pram", "--keys", "sex,race,marital", "--partition", "sex;race;marital", "--theta", "0.95"],
            "fewer than the 20 a block needs",
        ),
        (
            ["dp-pram", "--columns", "marital", "--epsilon", "1", "--domain", "marital=married,widowed"],
            "column 'marital' holds the value 'never married', which is not in its domain",
        ),
        (["mask", "--columns", "race", "--p", "0.2"], "column 'race', record 1: value 'White' is not 0 or 1"),
        (["mask", "--columns", "smoker", "--p", "abc"], "--p: 'abc' is not a number"),
        (
            ["pram", "--keys", "age,sex", "--xi", "0.4", "--show", "smoker"],
            "--show: column 'smoker' is not post-randomized",
        ),
    ],
)
def test_errors_are_one_line_naming_the_column_and_value(population_csv, tmp_path, capsys, args, message):
    capsys.readouterr()
    code = run_cli(*args, "--input", str(population_csv), "--output", str(tmp_path / "x.csv"))
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("veil release: ")


def test_a_missing_input_file_is_one_line(tmp_path, capsys):
    assert (
        run_cli(
            "mask",
            "--input",
            str(tmp_path / "none.csv"),
            "--columns",
            "a",
            "--p",
            "0.2",
            "--output",
            str(tmp_path / "x.csv"),
        )
        == 2
    )
    assert "cannot read" in capsys.readouterr().err


def test_help_documents_the_partition_syntax(capsys):
    with pytest.raises(SystemExit):
        run_cli("pram", "--help")
    text = capsys.readouterr().out
    assert "age=0-17,18-24,25-44,45-64,65-" in text and "race=White,Black,*" in text and "example:" in text


def test_importing_the_cli_module_loads_no_numpy():
    code = "import sys, veil.cli._release; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_through_veils_main_once_registered(monkeypatch, population_csv, tmp_path, capsys):
    """The line the CLI needs: _COMMANDS["release"] = ("_release", ...). With it, veil's own main
    runs the subcommand and turns its errors into one line and exit status 2."""
    monkeypatch.setitem(
        cli._COMMANDS,
        "release",
        ("_release", "release a table you hold so no one can be re-identified: pram, dp-pram, mask"),
    )
    capsys.readouterr()
    assert (
        cli.main(
            [
                "release",
                "mask",
                "--input",
                str(population_csv),
                "--columns",
                "smoker",
                "--p",
                "0.2",
                "--output",
                str(tmp_path / "m.csv"),
                "--quiet",
            ]
        )
        == 0
    )
    assert (
        cli.main(
            [
                "release",
                "pram",
                "--input",
                str(population_csv),
                "--keys",
                "nope",
                "--xi",
                "0.4",
                "--output",
                str(tmp_path / "p.csv"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "veil release: key column 'nope' is not in the table (its columns: sex, age, "
        "race, marital, area, education, work, smoker, insured).\n"
    )


def test_an_output_or_report_over_the_input_is_refused_and_the_report_is_owner_only(population_csv, tmp_path, capsys):
    import os
    import stat

    original = population_csv.read_bytes()
    link = tmp_path / "link.csv"
    link.symlink_to(population_csv)
    for output, report in ((population_csv, None), (link, None), (tmp_path / "out.csv", population_csv)):
        args = [
            "dp-pram",
            "--input",
            str(population_csv),
            "--columns",
            "sex",
            "--epsilon",
            "1",
            "--seed",
            "1",
            "--output",
            str(output),
        ] + (["--report", str(report)] if report else [])
        assert run_cli(*args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("is the --input" in err), err
    assert population_csv.read_bytes() == original
    report = tmp_path / "report.json"
    report.write_text("{}")
    os.chmod(report, 0o644)  # an earlier, world-readable report is tightened as it is replaced
    assert (
        run_cli(
            "dp-pram",
            "--input",
            str(population_csv),
            "--columns",
            "sex",
            "--epsilon",
            "1",
            "--seed",
            "1",
            "--output",
            str(tmp_path / "out.csv"),
            "--report",
            str(report),
            "--quiet",
        )
        == 0
    )
    assert stat.S_IMODE(report.stat().st_mode) == 0o600 and json.loads(report.read_text())["epsilon_per_record"] == 1
