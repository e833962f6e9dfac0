"""`veil estimates` of a strings metric: the WindowEstimate message as the aggregator encodes it
(a verification round computed from real reports, veil_testing.planted_strings) read back into
the JSON of /v1/estimates, and printed as the table and CSV show it."""

from __future__ import annotations

import csv
import io
import json

import pytest
from veil_testing.planted_strings import verified, withheld

from veil.aggregator.estimates_wire import encode_window
from veil.cli._estimates import print_csv, print_table, strings_lines, to_json
from veil.wire.v1 import veil_pb2


def as_read(e) -> dict:
    """What the CLI makes of the window's bytes, as it gets them over gRPC."""
    return to_json(veil_pb2.WindowEstimate.FromString(encode_window(e)))


@pytest.fixture(scope="module")
def found():
    return verified()


@pytest.mark.parametrize("make", [verified, withheld])
def test_the_cli_s_json_is_the_http_json(make):
    e = make()
    assert as_read(e) == e.to_json()
    assert json.dumps(as_read(e)) == json.dumps(e.to_json())  # the same keys in the same order


def test_the_table_lists_the_values_with_percent_intervals_and_the_floor(found, capsys):
    print_table([as_read(found)], projection=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "crash_signature / 1d  (hashed, epsilon = 4)  n = 4,000  " + (
        "provisional (reports made in this bucket may still arrive)"
    )
    assert lines[1] == "  estimates the share of devices by their value of crash_signature in the 1-day period"
    assert lines[2].split() == ["value", "estimate", "stderr", "95%", "interval"]
    assert found.strings is not None
    rows = lines[3 : 3 + len(found.strings.values)]
    for line, v in zip(rows, found.strings.values):
        numbers = f"{100 * v.estimate:.2f}% {100 * v.stderr:.2f}% [{100 * v.lower:.2f}%, {100 * v.upper:.2f}%]"
        assert line.split() == [*v.text.split(), *numbers.split()], line
    floor = f"{100 * found.strings.floor:.2f}%"
    assert lines[3 + len(rows)] == (
        f"  4 of 6 candidates found above the floor, {floor}, from 4,000 reports; a value below {floor} cannot be found"
    )
    assert not any("category" in line for line in lines)


def test_nothing_found_still_says_what_could_not_be(found):
    assert found.strings is not None
    nothing = {**as_read(found)["strings"], "values": []}
    (line,) = strings_lines(nothing)
    assert line.startswith("0 of 6 candidates found above the floor, ") and "cannot be found" in line


def test_a_value_s_text_stays_on_its_line_and_in_its_column():
    value = {"text": "line\nbreak\tand a rather long tail past the column", "estimate": 0.5, "stderr": 0.01}
    rows = strings_lines({"values": [{**value, "lower": 0.48, "upper": 0.52}], "floor": 0.01, "candidates": 1, "n": 9})
    assert rows[1].startswith("line\\nbreak\\tand a rather long\u2026 ") and len(rows) == 3


def test_a_withheld_round_prints_its_reason(capsys):
    print_table([as_read(withheld())], projection=False)
    out = capsys.readouterr().out
    assert "withheld: 12 reports so far; estimates are shown from 100" in out and "floor" not in out


def test_csv_has_a_row_per_found_value(found, capsys):
    print_csv([as_read(found)])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert found.strings is not None
    assert [r["label"] for r in rows] == [v.text for v in found.strings.values]
    for r, v in zip(rows, found.strings.values):
        assert r["metric"] == "crash_signature" and r["estimate"] == repr(v.estimate) and r["upper"] == repr(v.upper)
