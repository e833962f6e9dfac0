"""A new user's mistakes at the `veil` command line: each one sentence on stderr and a non-zero
exit, never a traceback or a silent success."""

from __future__ import annotations

import os

import pytest
from veil_testing.running import UPLOAD_TOKEN, auth_section

from veil.cli import main

NOT_UTF8 = os.fsdecode(b"br\xffowser")  # how Python hands over argv bytes that are not UTF-8


def one_line_error(capsys, argv: list[str], code: int = 2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_metric_name_that_is_not_utf8_is_one_sentence(start_aggregator, capsys):
    address = f"127.0.0.1:{start_aggregator().grpc_port}"
    for argv in (["specs", NOT_UTF8], ["estimates", NOT_UTF8], ["simulate", NOT_UTF8]):
        err = one_line_error(capsys, [*argv, "--address", address])
        assert err == f"veil {argv[0]}: METRIC: not UTF-8 text.", err


def test_specs_of_a_metric_not_declared_fails(start_aggregator, capsys):
    address = f"127.0.0.1:{start_aggregator().grpc_port}"
    err = one_line_error(capsys, ["specs", "nosuch", "browser", "--address", address])
    assert "declares no metric 'nosuch'" in err and "browser'" not in err


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", ":50051"])
def test_an_address_that_is_not_host_and_port_is_refused(capsys, address):
    for command in ("specs", "estimates", "health"):
        err = one_line_error(capsys, [command, "--address", address])
        assert err.startswith(f"veil {command}: --address: expected HOST:PORT"), err


def test_privacy_with_a_vanishing_epsilon_is_one_sentence(capsys):
    err = one_line_error(capsys, ["privacy", "--k", "10", "--epsilon", "1e-9"])
    assert err == "veil privacy: epsilon must be a number from 0.0001 to 20, not 1e-09.", err


def test_a_config_file_that_is_not_utf8_is_one_sentence(tmp_path):
    from test_cli_serve import check  # a process of its own: `serve` sets up the process's logging

    path = tmp_path / "veil.toml"
    path.write_bytes(b'[[metrics]]\nname = "caf\xe9"\nlabels = ["a", "b"]\n')
    out = check(path)
    assert out.returncode == 2 and out.stderr == f"veil serve: {path}: not UTF-8 text, which a TOML file must be.\n"


def test_simulate_fits_its_batches_to_the_server_and_says_why_reports_failed(start_aggregator, capsys):
    # app-a may send 100 reports at once, then 1 a second: most uploads stay refused.
    aggregator = start_aggregator(max_batch=100, sections={"auth": auth_section(rate_limit=1, rate_burst=100)})
    address = f"127.0.0.1:{aggregator.grpc_port}"
    assert (
        main(
            [
                "simulate",
                "browser",
                "--address",
                address,
                "--token",
                UPLOAD_TOKEN,
                "--reports",
                "300",
                "--batch-size",
                "1000",
                "--seed",
                "1",
            ]
        )
        == 1
    )
    out, err = capsys.readouterr()
    assert "above the aggregator's max_batch; sending 100 reports per upload" in err
    assert "100 of 300 reports acknowledged (200 failed)" in out, out
    assert "failed uploads: RESOURCE_EXHAUSTED: " in out, out
