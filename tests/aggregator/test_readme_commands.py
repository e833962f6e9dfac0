"""Every `veil ...` command the README's tour shows works against `veil demo` (what `make demo`
runs): the commands are read from the README itself, so an edit that breaks one fails here.

The load generators (`veil simulate`) take most of the time and run in the slow suite; the rest
run in the default one."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from veil_testing.running import estimates

README = Path(__file__).resolve().parents[2] / "README.md"
# Commands that start an aggregator rather than talk to one: the demo is one of them.
_SERVERS = {"demo", "serve"}


def tour_commands() -> list[tuple[list[str], list[str]]]:
    """(argv after `veil`, the output lines the README shows after it) of each command in a
    code block (indented or fenced) of the README's "A short tour" section."""
    tour = README.read_text(encoding="utf-8").split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    found: list[tuple[list[str], list[str]]] = []
    fenced = False
    output: list[str] | None = None  # the shown output of the last `$ veil` command, while its block lasts
    for line in tour.splitlines():
        if line.lstrip().startswith("```"):
            fenced, output = not fenced, None
            continue
        code = line.strip()
        if not (fenced or line.startswith("    ")):
            output = output if not code else None  # a paragraph ends the block
            continue
        prompt = code.startswith("$ ")
        command = code.removeprefix("$ ").removeprefix(".venv/bin/")
        if command.startswith("veil "):
            argv = shlex.split(command, comments=True)[1:]
            output = [] if prompt else None
            if argv[0] not in _SERVERS:
                found.append((argv, output if output is not None else []))
        elif output is not None and code:
            output.append(line[4:].rstrip())
    return found


COMMANDS = tour_commands()
FAST = [(argv, output) for argv, output in COMMANDS if argv[0] != "simulate"]
SLOW = [(argv, output) for argv, output in COMMANDS if argv[0] == "simulate"]


def test_the_tour_commands_are_found():
    subcommands = {argv[0] for argv, _ in COMMANDS}
    assert {"specs", "simulate", "estimates", "health", "privacy"} <= subcommands, COMMANDS
    assert ["estimates", "browser", "--window", "1d", "--last", "7d", "--merged"] in [a for a, _ in COMMANDS]
    assert any(output for _, output in COMMANDS)  # veil privacy's table


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """`veil demo` on free ports, once its screen shows every metric's estimates; its gRPC address."""
    process = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "demo", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:  # drained to the end, so the demo never blocks on its output
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "gRPC 127.0.0.1:" in line:
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert listening.wait(120), "".join(lines)  # bounds on start-up, not measurements
        address = re.search(r"gRPC (127\.0\.0\.1:\d+)", "".join(lines)).group(1)
        deadline = time.monotonic() + 120
        while any(w.withheld for w in estimates(address, window="total").estimates):
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        yield address
    finally:
        process.send_signal(signal.SIGTERM)  # the demo stops cleanly
        process.wait(30)
        reader.join(5)


def run(argv: list[str], output: list[str], address: str) -> None:
    # The demo is on a free port: each command is given it (the README: "Each takes --address").
    extra = [] if argv[0] == "privacy" else ["--address", address]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "veil.cli", *argv, *extra], capture_output=True, text=True, timeout=300
    )
    shown = f"veil {shlex.join(argv)} ({time.monotonic() - started:.1f} s): {done.stdout}{done.stderr}"
    assert done.returncode == 0 and done.stdout.strip(), shown
    got = iter(done.stdout.splitlines())
    assert all(any(line == g.rstrip() for g in got) for line in output), shown  # the README's lines, in order


@pytest.mark.parametrize(("argv", "output"), FAST, ids=[shlex.join(a) for a, _ in FAST])
def test_readme_command_works_against_the_demo(demo, argv, output):
    run(argv, output, demo)


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "output"), SLOW, ids=[shlex.join(a) for a, _ in SLOW])
def test_readme_load_generator_works_against_the_demo(demo, argv, output):
    run(argv, output, demo)
