"""`veil serve` with server.processes = 2 on a real redis-server: a supervisor and two worker
processes sharing the gRPC port; exact counts, /metrics summed over both, restarts, shutdown."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest
from veil_testing.config_toml import config_toml
from veil_testing.processes import free_port
from veil_testing.running import config_dict, estimates, finish_reporters, make_upload
from veil_testing.waiting import wait_until

from veil.client import Reporter
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2_grpc

pytestmark = pytest.mark.starts_first  # a minute or more: supervisors and workers started and killed

CHANNELS = 16  # connections; SO_REUSEPORT puts all on one of two workers with chance 2**-15
UPLOADS_EACH = 25
REPORTS = 10


def workers(serve) -> dict[int, int]:
    """Worker index -> pid of its latest start, from the supervisor's log."""
    return {line["worker"]: line["pid"] for line in serve.log_lines() if line["msg"] == "worker started"}


def started(serve, count: int) -> bool:
    return sum(line["msg"] == "aggregator started" for line in serve.log_lines()) >= count


def start_two(serve_process, redis_url: str):
    http_port = free_port()
    serve = serve_process(redis_url, server={"processes": 2, "http": f"127.0.0.1:{http_port}"}).start()  # both workers
    return serve, http_port


def metric_sum(http_port: int, name: str, **labels: str) -> float:
    """The sum of a /metrics series' samples with these labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def connections(pid: int, port: int) -> int:
    """Established TCP connections process `pid` holds on its local `port` (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                found += state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def metrics_dir(pid: int) -> str:
    """The worker's PROMETHEUS_MULTIPROC_DIR, from its environment."""
    with open(f"/proc/{pid}/environ") as environ:
        return dict(e.split("=", 1) for e in environ.read().split("\0") if "=" in e)["PROMETHEUS_MULTIPROC_DIR"]


def test_two_workers_share_the_port_count_exactly_and_stop_together(redis_server, serve_process):
    serve, http_port = start_two(serve_process, redis_server.url)
    pids = workers(serve)
    assert sorted(pids) == [0, 1]
    shared = metrics_dir(pids[1])
    assert os.path.isdir(shared) and metrics_dir(pids[0]) == shared

    # A local subchannel pool per channel: a connection each, rather than one shared by all.
    channels = [
        grpc.insecure_channel(serve.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(CHANNELS)
    ]
    try:

        def send(channel: grpc.Channel, seed: int) -> None:
            stub = veil_pb2_grpc.CollectorStub(channel)
            for i in range(UPLOADS_EACH):
                assert stub.Upload(make_upload("os", REPORTS, seed=seed * 1000 + i), timeout=30).accepted

        threads = [threading.Thread(target=send, args=(c, s)) for s, c in enumerate(channels)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = {index: connections(pid, serve.grpc_port) for index, pid in pids.items()}
        # Both workers took calls. At least a connection per channel: a channel that reconnected
        # on a loaded machine may leave its first connection for the server to notice and close.
        assert sum(held.values()) >= CHANNELS and all(held.values()), held
    finally:
        for channel in channels:
            channel.close()

    sent = CHANNELS * UPLOADS_EACH
    (total,) = estimates(serve.endpoint, "os", "total").estimates
    assert total.n == sent * REPORTS
    # Worker 0 alone serves HTTP, and its /metrics counts the calls of both workers.
    assert metric_sum(http_port, "veil_uploads_total", metric="os", outcome="accepted") == sent
    assert metric_sum(http_port, "veil_reports_counted_total", metric="os") == sent * REPORTS
    assert metric_sum(http_port, "veil_window_reports", metric="os", window="total") == sent * REPORTS

    assert serve.signal(signal.SIGTERM) == 0
    assert not any(alive(pid) for pid in pids.values())
    assert not os.path.exists(shared)
    lines = serve.log_lines()
    assert {line.get("worker") for line in lines if line["msg"] == "aggregator stopped"} == {0, 1}
    assert lines[-1]["msg"] == "supervisor stopped"


def test_a_killed_worker_is_restarted_and_nothing_is_lost(make_redis_server, serve_process):
    serve, http_port = start_two(serve_process, make_redis_server().url)
    first = workers(serve)
    shared = metrics_dir(first[0])
    reporters = [
        Reporter(
            serve.endpoint,
            tls=False,
            memoize=False,
            random_source=SeededRandomSource(seed),
            max_queue_size=4001,
            max_batch_size=100,
            schedule_delay_ms=20,
            export_timeout_ms=1000,
            retry_initial_backoff_ms=20,
            retry_max_backoff_ms=200,
        )
        for seed in range(4)
    ]

    def load(reporter: Reporter, seed: int) -> None:
        assert reporter.wait_for_specs(30)
        rng = random.Random(seed)
        for i in range(4000):
            reporter.report("os", rng.randrange(6))
            if i % 100 == 99:
                time.sleep(0.05)  # about 2 s of steady load at least, across the kills

    threads = [threading.Thread(target=load, args=(r, s)) for s, r in enumerate(reporters)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    os.kill(first[1], signal.SIGKILL)
    assert wait_until(lambda: workers(serve).get(1, first[1]) != first[1], 15), serve.log.read_text()
    assert wait_until(lambda: started(serve, 3), 30)  # the new worker 1 serves: one is always up
    os.kill(first[0], signal.SIGKILL)  # the HTTP one too
    counters = finish_reporters(threads, reporters)
    assert sum(c.sent for c in counters) == 16000
    assert wait_until(lambda: started(serve, 4), 30)  # the restarted worker 0 serves HTTP again
    (total,) = estimates(serve.endpoint, "os", "total").estimates
    assert total.n == 16000
    exits = [line for line in serve.log_lines() if line["msg"] == "worker exited unexpectedly; restarting it"]
    assert [(e["worker"], e["pid"], e["signal"]) for e in exits] == [(1, first[1], "SIGKILL"), (0, first[0], "SIGKILL")]
    assert metric_sum(http_port, "veil_window_reports", metric="os", window="total") == 16000

    # Workers die with their supervisor, even one killed outright (they get SIGTERM and drain).
    latest = workers(serve)
    assert serve.signal(signal.SIGKILL) == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(pid) for pid in latest.values()), 15)
    shutil.rmtree(shared)  # a killed supervisor cannot remove it


def serve_once(tmp_path, data: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "veil.toml"
    path.write_text(config_toml(data))
    return subprocess.run(
        [sys.executable, "-m", "veil.aggregator", "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_configs_that_cannot_run_several_processes_fail_in_one_line(tmp_path, redis_server):
    for store in ("memory", f"sqlite://{tmp_path}/veil.db"):
        out = serve_once(tmp_path, config_dict(store, free_port()), "--processes", "2")
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("veil serve: store.url: ") and "server.processes = 2" in out.stderr
    data = config_dict("", free_port())
    del data["store"]  # the default store: SQLite in the data directory
    out = serve_once(tmp_path, data, "--processes", "2")
    assert out.returncode == 2 and out.stderr.startswith(
        "veil serve: store.url: a SQLite store is written by one process"
    ), out.stderr
    assert not (tmp_path / "veil.db").exists()

    out = serve_once(tmp_path, config_dict(redis_server.url, 0, processes=2))
    assert out.returncode == 2 and out.stderr.startswith("veil serve: server.grpc: port 0"), out.stderr

    out = serve_once(tmp_path, config_dict(redis_server.url, free_port()), "--processes", "0")
    assert out.returncode == 2 and out.stderr.startswith("veil serve: server.processes: "), out.stderr

    with socket.socket() as taken:  # another server on the port: no worker may join it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        out = serve_once(tmp_path, config_dict(redis_server.url, taken.getsockname()[1]), "--processes", "2")
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"veil serve: server.grpc: cannot listen on {address}"), out.stderr
        out = serve_once(tmp_path, config_dict(redis_server.url, free_port(), http=address), "--processes", "2")
        assert out.returncode == 2 and out.stderr.startswith(f"veil serve: server.http: cannot listen on {address}")


def test_workers_failing_at_start_make_the_supervisor_give_up(redis_server, serve_process):
    serve, _ = start_two(serve_process, redis_server.url)
    pids = workers(serve)
    serve.config.unlink()  # from now on every worker started fails at once (no config file)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    assert serve.process.wait(timeout=60) == 1
    assert not any(alive(pid) for pid in workers(serve).values())
    (gave_up,) = [line for line in serve.log_lines() if line["msg"].startswith("worker keeps exiting")]
    assert gave_up["level"] == "error" and gave_up["exit_code"] == 2 and gave_up["fast_exits"] == 3


def test_each_worker_enforces_its_share_of_a_rate_limit():
    from veil_testing.running import auth_section

    from veil.aggregator._ratelimit import RateLimiter
    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import _worker_limits

    data = config_dict("redis://127.0.0.1:1/0", 50051)
    data["auth"] = auth_section(rate_limit=40000, rate_burst=80000)
    auth = parse_config(data).auth
    assert _worker_limits(auth, 1)["app-a"] == (40000, 80000, 1000, 2000)  # reports, then uploads
    halves = RateLimiter({name: limits[:2] for name, limits in _worker_limits(auth, 2).items()})
    assert _worker_limits(auth, 2)["app-a"][2:] == (500, 1000)
    assert halves.limit("app-a") == (20000, 40000) and halves.limit("app-b") == (20000, 40000)
    assert halves.take("app-a", 40000) == 0.0 and halves.take("app-a", 10) > 0  # half the burst is all it has


def test_help_documents_processes():
    out = subprocess.run(
        [sys.executable, "-m", "veil.cli", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--processes N" in out.stdout and "--worker-index" not in out.stdout


# A worker as the supervisor sees it: a process that says it serves (down --ready-fd, when
# given) and then runs until killed; it starts in milliseconds, where a real worker takes
# seconds on a loaded machine, so a kill lands within _FAST_EXIT of its start every time.
_QUICK_WORKER = """
import sys, time, os
if "--ready-fd" in sys.argv:
    fd = int(sys.argv[sys.argv.index("--ready-fd") + 1])
    os.write(fd, b"1")
    os.close(fd)
# One write per line: both workers share the log's file offset, and print() may write its
# pieces separately (unbuffered under PYTHONUNBUFFERED), which interleaved them on CI.
os.write(1, f"serving {sys.argv[sys.argv.index('--worker-index') + 1]} {os.getpid()}\\n".encode())
time.sleep(3600)
"""

_SUPERVISOR = """
import sys
from veil.aggregator.logs import configure_logging
from veil.aggregator.workers import supervise
from veil.aggregator.config import load_config
configure_logging("json", "info")
sys.exit(supervise(load_config(sys.argv[1]), [sys.executable, "-c", sys.argv[2]]))
"""


def test_a_worker_killed_while_serving_is_restarted_however_soon_and_the_others_keep_serving(tmp_path):
    # Three kills of worker 1, each within 5 s of its start but after it served: not a failure
    # to start, so the supervisor must not give up (before: it stopped worker 0 and exited 1).
    config = tmp_path / "veil.toml"
    config.write_text(config_toml(config_dict("redis://127.0.0.1:1/0", free_port(), processes=2)))
    out = tmp_path / "out.log"
    with open(out, "wb") as sink:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", _SUPERVISOR, str(config), _QUICK_WORKER], stdout=sink, stderr=subprocess.STDOUT
        )
    try:

        def serving() -> dict[str, list[int]]:
            found: dict[str, list[int]] = {}
            for line in out.read_text().splitlines():
                if line.startswith("serving "):
                    found.setdefault(line.split()[1], []).append(int(line.split()[2]))
            return found

        assert wait_until(lambda: len(serving()) == 2, 30), out.read_text()
        first = serving()["0"][0]
        for round_ in range(3):
            os.kill(serving()["1"][-1], signal.SIGKILL)
            assert wait_until(lambda round_=round_: len(serving()["1"]) == round_ + 2, 30), out.read_text()
        time.sleep(0.5)
        assert supervisor.poll() is None, out.read_text()
        assert serving()["0"] == [first] and alive(first)
        assert "worker keeps exiting" not in out.read_text()
    finally:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) in (0, 1)


def test_a_supervisor_started_right_after_its_own_sigkill_waits_for_the_draining_orphans(
    make_redis_server, serve_process
):
    redis = make_redis_server()
    serve, _ = start_two(serve_process, redis.url)
    orphans = workers(serve)
    # Uploads in flight on a frozen Redis keep the orphaned workers draining (and holding the
    # port) for their grace period of 2 s after the supervisor's death.
    channels = [grpc.insecure_channel(serve.endpoint) for _ in range(CHANNELS)]
    redis.process.send_signal(signal.SIGSTOP)
    calls = [veil_pb2_grpc.CollectorStub(c).Upload.future(make_upload("os", 5), timeout=20) for c in channels]
    time.sleep(0.5)
    try:
        assert serve.signal(signal.SIGKILL) == -signal.SIGKILL
        serve.start()  # at once: the port is still held by the orphans
    finally:
        redis.process.send_signal(signal.SIGCONT)
    assert serve.process.poll() is None, serve.log.read_text()
    assert "Address already in use" not in serve.log.read_text()
    assert wait_until(lambda: not any(alive(pid) for pid in orphans.values()), 15)
    assert wait_until(lambda: started(serve, 4), 30), serve.log.read_text()
    for call in calls:
        call.exception()  # answered one way or another; the SDK retries what was not
    for channel in channels:
        channel.close()
