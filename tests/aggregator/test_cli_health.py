"""`veil health`: one word on stdout, exit 0 only when SERVING (container health checks rely on it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from veil_testing.processes import free_port
from veil_testing.waiting import wait_until

from veil.cli import main


def health(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["health", *args])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


def test_a_running_aggregator_is_serving_for_the_server_and_each_veil_service(capsys, start_aggregator):
    address = f"127.0.0.1:{start_aggregator().grpc_port}"
    for service in ("", "veil.wire.v1.Collector", "veil.wire.v1.Estimates"):
        assert health(capsys, "--address", address, "--service", service) == (0, "SERVING", "")


def test_without_address_it_asks_veil_endpoint_as_every_command_does(capsys, start_aggregator, monkeypatch):
    monkeypatch.setenv("VEIL_ENDPOINT", f"127.0.0.1:{start_aggregator().grpc_port}")
    assert health(capsys) == (0, "SERVING", "")
    monkeypatch.setenv("VEIL_ENDPOINT", f"127.0.0.1:{free_port()}")
    code, out, err = health(capsys, "--timeout", "2")
    assert (code, out) == (1, "UNREACHABLE") and err.startswith(f"veil health: {os.environ['VEIL_ENDPOINT']}: ")


def test_a_service_the_aggregator_does_not_have_is_service_unknown(capsys, start_aggregator):
    address = f"127.0.0.1:{start_aggregator().grpc_port}"
    code, out, err = health(capsys, "--address", address, "--service", "no.such.Service")
    assert (code, out) == (1, "SERVICE_UNKNOWN") and "'no.such.Service'" in err


def test_an_aggregator_whose_store_is_down_is_not_serving(capsys, start_aggregator, redis_server):
    address = f"127.0.0.1:{start_aggregator(redis_server.url).grpc_port}"
    assert health(capsys, "--address", address)[:2] == (0, "SERVING")
    redis_server.kill()
    # The aggregator pings its store every second; give it a few.
    assert wait_until(lambda: health(capsys, "--address", address)[:2] == (1, "NOT_SERVING"))


def test_an_aggregator_that_starts_without_its_store_is_not_serving(capsys, start_aggregator):
    address = f"127.0.0.1:{start_aggregator(f'redis://127.0.0.1:{free_port()}/0').grpc_port}"
    assert health(capsys, "--address", address) == (1, "NOT_SERVING", "")


def test_a_stopped_aggregator_or_nothing_listening_is_unreachable(capsys, start_aggregator):
    aggregator = start_aggregator()
    aggregator.stop(grace=0)
    for port in (aggregator.grpc_port, free_port()):
        code, out, err = health(capsys, "--address", f"127.0.0.1:{port}", "--timeout", "2")
        assert (code, out) == (1, "UNREACHABLE") and err.startswith(f"veil health: 127.0.0.1:{port}: UNAVAILABLE")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--address", "localhost"], "--address: expected HOST:PORT"),
        (["--address", "localhost:http"], "--address: expected HOST:PORT"),
        (["--address", "127.0.0.1:0"], "--address: expected HOST:PORT"),
        (["--timeout", "0"], "--timeout: expected a number of seconds above 0"),
        (["--timeout", "nan"], "--timeout: expected a number of seconds above 0"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, args, message):
    code, out, err = health(capsys, *args)
    assert code == 2 and out == "" and err.startswith(f"veil health: {message}") and len(err.splitlines()) == 1


def test_argparse_refuses_a_timeout_that_is_not_a_number(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["health", "--timeout", "soon"])
    assert exit_.value.code == 2 and "argument --timeout: invalid float value: 'soon'" in capsys.readouterr().err


def test_the_command_line_as_a_container_runs_it(start_aggregator):
    address = f"127.0.0.1:{start_aggregator().grpc_port}"
    command = [sys.executable, "-m", "veil.cli", "health", "--address", address]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "SERVING\n", "")
