"""`veil demo` (the README's main command) runs the whole system and its estimates hold."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_20_seconds_non_interactively_with_estimates_in_their_intervals():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "veil.cli",
            "demo",
            "--duration",
            "20",
            "--interval",
            "2",
            "--seed",
            "3",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"Dashboard: http://127\.0\.0\.1:\d+/", out.stdout)
    directory = re.search(r"aggregator on SQLite \((.+)/veil\.db, removed at exit\)", out.stdout).group(1)
    assert not Path(directory).exists()  # the temporary data directory is gone
    dashboard = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+/)", out.stdout).group(1)
    # Every redrawn screen (a terminal clears the one before) still says where the dashboard is.
    frames = re.findall(r"Veil demo: dashboard (\S+)  gRPC 127\.0\.0\.1:\d+", out.stdout)
    assert len(frames) >= 5 and set(frames) == {dashboard}, frames
    last = out.stdout.rsplit("estimates over all reports so far", 1)[1]
    for name in ("browser", "country", "crash_screen"):
        n = int(re.search(rf"{name} .*n = ([\d,]+)", last).group(1).replace(",", ""))
        assert n >= 500, (name, n)  # each of the 500 devices reported at least once
    inside, total = map(int, re.search(r"final: (\d+) of (\d+) categories", out.stdout).groups())
    assert total == 126 and inside >= 0.85 * total


def test_demo_refuses_bad_arguments(capsys):
    from veil.cli import main

    assert main(["demo", "--calls", "0"]) == 2
    assert "--calls and --interval must be above 0" in capsys.readouterr().err
    assert main(["demo", "--period", "soon"]) == 2
    assert "--period: expected a duration" in capsys.readouterr().err


def test_demo_at_an_unreachable_redis_is_one_sentence_at_once(capsys):
    from veil.cli import main

    assert (
        main(
            [
                "demo",
                "--redis",
                "redis://127.0.0.1:1/0",
                "--grpc",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                "--duration",
                "5",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("veil demo: --redis: Redis at 127.0.0.1:1 unavailable") and len(err.splitlines()) == 1, err
