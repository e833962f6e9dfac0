"""`veil demo` (the README's main command) runs the whole system, its estimates hold, its screen
fits an 80x24 terminal and, on Redis, it leaves nothing behind."""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from veil_testing.waiting import wait_until

from veil.cli._demo import CRASHES, DEMO_METRICS, HEIGHT, LOAD_MS, WIDTH, frame
from veil.mechanism import ROUNDS, code_text, string_code
from veil.wire.v1 import veil_pb2

pytestmark = pytest.mark.starts_first  # a minute or more: demo runs

DEMO = [sys.executable, "-m", "veil.cli", "demo", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]
TITLE = re.compile(r"\d\d:\d\d:\d\d  Veil demo: dashboard (http://127\.0\.0\.1:\d+/)  gRPC 127\.0\.0\.1:\d+$")


def demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def frames(stdout: str) -> list[list[str]]:
    """The screens of a non-interactive run (each starts with its title line), the final line left out."""
    found: list[list[str]] = []
    for line in stdout.splitlines():
        if TITLE.match(line):
            found.append([])
        if found and not line.startswith("final: "):
            found[-1].append(line)
    return found


def reports_of_every_metric(screen: list[str]) -> int:
    """The fewest reports (n) any counted metric of a demo screen has (0 while one has none)."""
    text = "\n".join(screen)
    found = [re.search(rf"^{name}: .*n = ([\d,]+)", text, re.M) for name in ("browser", "country", "crash_screen")]
    found.append(re.search(r"^load_ms: numeric, .*n = ([\d,]+)", text, re.M))
    return min(int(m.group(1).replace(",", "")) if m else 0 for m in found)


def test_demo_runs_non_interactively_until_stopped_with_estimates_in_their_intervals(tmp_path):
    # The 20,000 devices report once per 10 s period each (about 2,000 reports a second): every
    # metric has 20,000 reports after about 10 s on a quiet machine, later on a loaded one. So
    # the demo runs until a screen shows them (a bounded wait on that, not a fixed duration) and
    # is then stopped with SIGTERM, as a closed terminal stops it.
    with open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(
            [*DEMO, "--interval", "1", "--seed", "3"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # A screen is whole once the next one has begun: all but the last.
        assert wait_until(lambda: any(reports_of_every_metric(s) >= 20_000 for s in frames("".join(lines))[:-1]), 120)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        reader.join(10)
    assert process.returncode == 0, (tmp_path / "stderr").read_text()
    stdout = "".join(lines)
    assert re.search(r"Dashboard: http://127\.0\.0\.1:\d+/", stdout)
    directory = re.search(r"aggregator on SQLite \((.+)/veil\.db, removed at exit\)", stdout).group(1)
    assert not Path(directory).exists()  # the temporary data directory is gone
    dashboard = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+/)", stdout).group(1)
    screens = frames(stdout)
    # Every screen fits an 80x24 terminal and starts with where the dashboard and gRPC are.
    assert len(screens) >= 5 and {TITLE.match(s[0]).group(1) for s in screens} == {dashboard}
    assert all(len(s) <= HEIGHT and max(map(len, s)) <= WIDTH for s in screens), screens
    last = "\n".join(screens[-1])
    assert reports_of_every_metric(screens[-1]) >= 20_000, last  # the total window only grows
    # The largest categories' intervals are a few points wide (about 7 at n = 20,000 in two
    # periods), not the 500 devices' +-15. A pooled window widens its interval by the square
    # root of the periods it pools (docs/estimates.md), and a loaded machine spreads the 20,000
    # reports over more of them.
    pooled = re.search(r"pooled over the (\d+) periods", last)
    widest = 10 * math.sqrt(max(int(pooled.group(1)) if pooled else 1, 2) / 2)
    categorical = last.split("\nload_ms: ")[0]  # the numeric metric's rows are in ms
    rows = re.findall(r"^  \S+ +[\d.]+ +[\d.-]+   \[ *([\d.-]+), *([\d.-]+)\]", categorical, re.M)
    assert len(rows) == 6 and all(float(upper) - float(lower) < widest for lower, upper in rows), last
    # The strings metric: ROUNDS (7) 10-second periods before its first values, so seldom within
    # this run; a run slowed past them by a loaded machine shows what the verification found.
    head = r"^crash_signature: strings, epsilon = 8"
    no_values = rf"{head}: No period has reached round {ROUNDS - 1}"
    assert re.search(rf"{no_values}|{head}, n = .*found inside", last, re.M), last
    # The numeric metric: its mean near the truth (about 600 ms), an interval far narrower than the range.
    truth, estimate, lower, upper = map(
        float, re.search(r"^  mean +(\S+) +(\S+) +\[ *(\S+), *(\S+)\]", last, re.M).groups()
    )
    assert truth == round(LOAD_MS.truth_mean) and upper - lower < 500 and abs(estimate - truth) < 250, last
    assert len(re.findall(r"^  q(?:50|90|99) ", last, re.M)) == 3
    inside, total = map(int, re.search(r"final: (\d+) of (\d+) truths", stdout).groups())
    # 130 truths of the declared and numeric metrics, and the strings values found, if any (at most
    # the 32 survivors)
    assert 130 <= total <= 130 + 32 and inside >= 0.85 * total


def estimates(estimand: str, withheld: str = "") -> dict[str, veil_pb2.WindowEstimate]:
    made = {}
    for m in DEMO_METRICS:
        window = veil_pb2.WindowEstimate(metric=m.name, n=123_456_789, estimand=estimand)
        if withheld:
            window.withheld, window.reason = True, withheld
        else:
            for label, t in zip(m.labels, m.truth):
                window.categories.add(label=label, estimate=t - 0.0123, lower=t - 0.1234, upper=t + 0.1234)
        made[m.name] = window
    for part in ("mean", "distribution"):
        window = veil_pb2.WindowEstimate(metric=f"{LOAD_MS.name}.{part}", n=123_456_789, estimand=estimand)
        if withheld:
            window.withheld, window.reason = True, withheld
        elif part == "mean":
            t = LOAD_MS.truth_mean
            window.mean.CopyFrom(veil_pb2.MeanEstimate(estimate=t + 12.3, stderr=10, lower=t - 99999, upper=t + 99999))
        else:
            for q in (0.5, 0.9, 0.99):
                t = LOAD_MS.truth_quantile(q)
                window.quantiles.add(q=q, estimate=t - 1.5, lower=LOAD_MS.low, upper=LOAD_MS.high)
        made[window.metric] = window
    window = veil_pb2.WindowEstimate(metric=CRASHES.name, n=123_456, estimand=estimand)
    if withheld:
        window.withheld, window.reason = True, withheld
    else:
        window.strings.floor, window.strings.n, window.strings.candidates = 0.004, 123_456, 32
        for text, t in CRASHES.common:
            shown = code_text(string_code(text))
            window.strings.values.add(text=shown, estimate=t + 0.001, lower=t - 0.01, upper=t + 0.01)
        window.strings.values.add(
            text="#00ff00ff00ff00", estimate=0.005, lower=0.001, upper=0.009
        )  # found, held by none
    made[window.metric] = window
    return made


def test_every_screen_fits_an_80x24_terminal_and_keeps_the_addresses_on_its_first_line():
    long = "share of devices by the value each reported first in its 10-second period, pooled " * 4
    where = ("http://127.0.0.1:65535/", "127.0.0.1:65535")
    cases = [
        frame("12:00:00", *where, 200_000, "Ctrl-C stops.", estimates(long)),
        frame("12:00:00", *where, 200_000, "Ctrl-C stops.", estimates(long, withheld="not enough reports " * 20)),
        frame("12:00:00", *where, 200_000, "", {}, "estimates unavailable: UNAVAILABLE (" + "x " * 300 + ")"),
    ]
    for lines, _, _ in cases:
        assert len(lines) <= HEIGHT and max(map(len, lines)) <= WIDTH, lines
        assert lines[0] == "12:00:00  Veil demo: dashboard http://127.0.0.1:65535/  gRPC 127.0.0.1:65535"
    lines, inside, total = cases[0]
    # every category counted, not only the rows shown; the mean, 3 quantiles; the values found
    assert (inside, total) == (135, 136)
    screen = "\n".join(lines)
    assert "load_ms: numeric, in ms, epsilon = 4 (2 + 2), n = 123,456,789 (4/4 inside)" in screen
    mean = rf"^  mean +{LOAD_MS.truth_mean:.0f} +{LOAD_MS.truth_mean + 12.3:.0f} "
    assert re.search(mean, screen, re.M) and re.search(r"^  q99 +3\d{3} ", screen, re.M), screen
    assert "crash_signature: strings, epsilon = 8, n = 123,456, floor 0.4%: 5/6 found inside" in screen
    # SIGSEGV is longer than a code (6 bytes): the aggregator knows its hash, the demo shows its text beside it.
    hashed = re.escape(code_text(string_code("SIGSEGV"))[:7])
    assert re.search(rf"^  SIGSEGV\.\. {hashed} +12\.0 +12\.1 ", screen, re.M), screen
    assert re.search(r"^  ANR +7\.0 +7\.1 ", screen, re.M), screen  # a short one as its text
    assert "every category on the dashboard" in lines[-1]
    assert "  chrome" in "\n".join(lines) and "country-004" not in "\n".join(lines)  # the largest truths only


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_an_80x24_terminal_the_screen_shows_its_addresses_and_every_metric_and_closing_it_cleans_up(tmp_path):
    server = f"veil-demo-{uuid.uuid4().hex[:8]}"  # a tmux server of this test's own
    # The demo's temporary directory (tempfile's) goes under tmp_path, to see it removed.
    command = " ".join([f"TMPDIR={tmp_path}", *DEMO, "--devices", "2000"])
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", "80", "-y", "24", command], check=True)
    try:
        screen: list[str] = []
        deadline = time.monotonic() + 60  # generous bounds on start-up and exit, not measurements
        while time.monotonic() < deadline:
            shown = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True)
            screen = shown.stdout.splitlines()
            if shown.returncode == 0 and screen and "truths inside their 95% intervals" in shown.stdout:
                break
            time.sleep(0.5)
        assert screen and TITLE.match(screen[0]), screen
        assert all(any(line.startswith(f"{m.name}: ") for line in screen) for m in DEMO_METRICS), screen
        assert [p.name for p in tmp_path.iterdir()][0].startswith("veil-demo-")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)  # the terminal closes: SIGHUP
    deadline = time.monotonic() + 60
    while any(tmp_path.iterdir()):
        assert time.monotonic() < deadline, list(tmp_path.iterdir())
        time.sleep(0.5)


def test_demo_on_redis_starts_from_nothing_and_leaves_no_key_behind_nor_touches_another(redis_server):
    import redis

    raw = redis.Redis.from_url(redis_server.url)
    # Another app's key, and another aggregator's counts of a metric named as the demo's.
    raw.set("someone:else", "1")
    raw.hset("veil:{browser}:c:fp:total:0", mapping={"n:1": 5, "v:1:0": 5})
    before = {key: raw.dump(key) for key in raw.scan_iter()}
    for _ in range(2):  # the second run starts from no counts, as the first did
        # One period for the whole run (a day: each device calls report() every second or so).
        out = demo(
            "--redis", redis_server.url, "--duration", "3", "--devices", "2000", "--period", "1d", "--calls", "86400"
        )
        assert out.returncode == 0, out.stderr
        assert re.search(r"aggregator on Redis \(keys veil:\{demo-[0-9a-f]{8}:\.\.\.\}, removed at exit\)", out.stdout)
        last = "\n".join(frames(out.stdout)[-1])
        n = int(re.search(r"^browser: .*n = ([\d,]+)", last, re.M).group(1).replace(",", ""))
        assert 0 < n <= 2_000, last  # counted in Redis, one report per device, none from the run before
        assert {key: raw.dump(key) for key in raw.scan_iter()} == before


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
