"""`veil serve` with server.processes = N > 1: a supervisor and N worker processes.

One Python process serving gRPC tops out near one core (grpcio's per-call thread handoffs hold
the GIL), so N workers, each a whole Aggregator, share the gRPC port with SO_REUSEPORT: the
kernel spreads incoming connections (not calls) over them. They count into the one shared
store, so any of them can answer for the estimates; only worker 0 runs the HTTP listener, and
its /metrics sums every worker's counters (prometheus_client multiprocess mode, in a private
PROMETHEUS_MULTIPROC_DIR the supervisor makes and removes).

The supervisor never imports gRPC: each worker is a fresh interpreter (`python -m
veil.aggregator ... --worker-index I`), so no gRPC state is ever forked. It forwards SIGTERM and
SIGINT to every worker (each drains as a lone daemon does) and exits when all have, 0 when
all stopped cleanly. It forwards SIGHUP (reload the tokens) too, which a worker ignores until
it can reload: one still starting is not killed by it, and reads the new file anyway. A worker
that dies on its own is restarted after a backoff; one that dies _MAX_FAST_EXITS times in a
row before it ever served (it tells the supervisor through a pipe once it serves) makes the
supervisor stop everything and exit 1 rather than loop: a worker killed while serving is
restarted however often, and the others keep serving. On Linux a worker gets SIGTERM when the
supervisor dies; a supervisor started again at once waits for such orphans to drain and free
the port (up to the grace period) before it says the port is taken.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from .config import ENV_STORE_URL, AggregatorConfig
from .errors import ConfigError
from .logs import say

__all__ = ["label_worker_logs", "supervise", "tell_supervisor_serving"]

log = logging.getLogger("veil.aggregator")

_FAST_EXIT = 5.0  # seconds: a worker exiting sooner after its start, before serving, did not get going
_MAX_FAST_EXITS = 3  # in a row, by one worker: something is wrong that restarting will not fix
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 10.0  # seconds before a restart, doubling with each fast exit
_KILL_AFTER = 10.0  # seconds past the grace period before a worker that does not stop is killed
_POLL = 0.1  # seconds between looks at the workers
_PR_SET_PDEATHSIG = 1


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.fast_exits = 0
        self.restart_at = 0.0
        self.ready: int | None = None  # the read end of the pipe the worker writes to once it serves
        self.serving = False

    def start(self, command: list[str], env: dict[str, str]) -> None:
        self.close_ready()
        read, write = os.pipe()
        os.set_blocking(read, False)
        try:
            self.process = subprocess.Popen(
                [*command, "--worker-index", str(self.index), "--ready-fd", str(write)],
                env=env,
                pass_fds=(write,),
                preexec_fn=_die_with(os.getpid()) if sys.platform == "linux" else None,
            )
        finally:
            os.close(write)
        self.ready, self.serving = read, False
        self.started = time.monotonic()
        log.info("worker started", extra={"worker": self.index, "pid": self.process.pid})

    def poll_ready(self) -> None:
        if self.serving or self.ready is None:
            return
        with contextlib.suppress(BlockingIOError):
            self.serving = bool(os.read(self.ready, 1))

    def close_ready(self) -> None:
        if self.ready is not None:
            os.close(self.ready)
            self.ready = None


def tell_supervisor_serving(fd: int) -> None:
    """In a worker, once it serves: one byte down the pipe the supervisor gave it."""
    try:
        os.write(fd, b"1")
        os.close(fd)
    except OSError:  # the supervisor is gone: it has no use for the news
        pass


def _die_with(parent: int) -> Callable[[], None]:
    """In the worker, before exec: SIGTERM (a graceful drain) when the supervisor dies. Called
    from the supervisor's main thread only: the signal follows the thread that forked."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the worker's own handler is in place
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _check_free(address: str, key: str, wait: float) -> None:
    """Fail in one line, as a lone daemon does, when something already listens on `address`:
    the workers' SO_REUSEPORT sockets would otherwise share a port with another server of the
    same user. (A probe without SO_REUSEPORT fails to bind next to any listener.) A port taken
    is tried again for `wait` seconds: the workers of a supervisor killed just before are
    still draining (they got SIGTERM) and free it within their grace period."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + wait
    while True:
        try:
            family, kind, proto, _, where = socket.getaddrinfo(
                host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no listener
                probe.bind(where)
            return
        except OSError as err:
            if err.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise ConfigError(f"{key}: cannot listen on {address} ({err.strerror or err}).") from None
            time.sleep(_POLL)


def _exit_status(code: int) -> dict[str, object]:
    return {"exit_code": code} if code >= 0 else {"signal": signal.Signals(-code).name}


def supervise(config: AggregatorConfig, command: list[str]) -> int:
    """Run config.processes workers, each `command --worker-index I`, until SIGTERM or SIGINT."""
    wait = config.grace_period + 1.0  # orphans of a killed supervisor drain within their grace period
    _check_free(config.grpc_address, "server.grpc", wait)
    if config.http_address and not config.http_address.endswith(":0"):
        _check_free(config.http_address, "server.http", wait)
    stop, hangup = threading.Event(), threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: hangup.set())
    metrics_dir = tempfile.mkdtemp(prefix="veil-metrics-")
    # The store URL goes by environment, not argv, so a password in it stays out of `ps`.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir, ENV_STORE_URL: config.store_url}
    workers = [_Worker(i) for i in range(config.processes)]
    try:
        for worker in workers:
            worker.start(command, env)
        say(
            f"veil: {config.processes} worker processes share gRPC {config.grpc_address}"
            + (f"; worker 0 serves HTTP on {config.http_address}" if config.http_address else "")
        )
        gave_up = _watch(workers, stop, hangup, command, env)
        clean = _stop_all(workers, config.grace_period)
        log.info("supervisor stopped", extra={"workers": config.processes})
        return 1 if gave_up or not clean else 0
    finally:
        for worker in workers:
            worker.close_ready()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _watch(
    workers: list[_Worker], stop: threading.Event, hangup: threading.Event, command: list[str], env: dict[str, str]
) -> bool:
    """Restart workers that exit until `stop` is set (False), or until one keeps failing at
    its start (True); pass SIGHUP on to every running worker whenever `hangup` is set."""
    while not stop.wait(_POLL):
        if hangup.is_set():
            hangup.clear()
            for worker in workers:
                if worker.process is not None and worker.process.poll() is None:
                    worker.process.send_signal(signal.SIGHUP)
            log.info("SIGHUP passed on to the workers: each reloads its tokens")
        now = time.monotonic()
        for worker in workers:
            if worker.process is None:
                if now >= worker.restart_at:
                    worker.start(command, env)
                continue
            worker.poll_ready()
            code = worker.process.poll()
            if code is None:
                continue
            worker.poll_ready()  # the byte may have come just before the exit
            # Killed while serving is not a failure to start: restart it, however often.
            failed_start = not worker.serving and now - worker.started < _FAST_EXIT
            worker.fast_exits = worker.fast_exits + 1 if failed_start else 0
            status = {"worker": worker.index, "pid": worker.process.pid, **_exit_status(code)}
            worker.process = None
            if worker.fast_exits >= _MAX_FAST_EXITS:
                log.error(
                    "worker keeps exiting right after its start; stopping all workers",
                    extra={**status, "fast_exits": worker.fast_exits},
                )
                return True
            delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2**worker.fast_exits)
            log.warning("worker exited unexpectedly; restarting it", extra={**status, "restart_in": delay})
            worker.restart_at = now + delay
    return False


def _stop_all(workers: list[_Worker], grace: float) -> bool:
    """SIGTERM every running worker and wait for it (killing it past the grace period plus
    _KILL_AFTER); True when all stopped cleanly."""
    running = [(w, w.process) for w in workers if w.process is not None]
    for _, process in running:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace + _KILL_AFTER
    clean = True
    for worker, process in running:
        try:
            code = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker did not stop in time; killing it", extra={"worker": worker.index})
            process.kill()
            code = process.wait()
        if code not in (0, -signal.SIGTERM):  # -SIGTERM: stopped while still importing, before serving
            clean = False
            log.warning("worker stopped uncleanly", extra={"worker": worker.index, **_exit_status(code)})
    return clean


class _WorkerLabel(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index  # a field of every JSON line
        return True


def label_worker_logs(index: int, fmt: str) -> None:
    """Mark every log line of this worker process with its index (after configure_logging)."""
    for handler in logging.getLogger("veil").handlers:
        handler.addFilter(_WorkerLabel(index))
        if fmt == "text":
            handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [worker {index}] %(message)s"))
