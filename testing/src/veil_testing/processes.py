"""Processes the tests and benchmarks start: free ports, children that die with their parent,
start/cleanup as a context manager, and `veil serve` as a killable, restartable process.

    serve = ServeProcess(tmp_path, config).start()   # returns once every worker is listening
    serve.kill(); serve.start()                      # a crash and a restart, same port and log
    with RedisServer() as server: ...                # any Started: cleaned up however it ends
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from veil_testing.config_toml import config_toml

__all__ = ["ServeProcess", "Started", "free_port", "making", "tied_to_parent"]

_S = TypeVar("_S", bound="Started")


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tied_to_parent(argv: Sequence[str], signum: int = signal.SIGKILL) -> dict[str, Any]:
    """Popen's `args` and `preexec_fn` for a child that gets `signum` when the thread that
    started it exits, so none outlives a killed run. `setpriv --pdeathsig` arranges that without
    a preexec_fn where it can: a preexec_fn makes subprocess run Python's at-fork hooks in the
    child, where grpcio aborts when the parent already has live gRPC channels."""
    if sys.platform != "linux":
        return {"args": list(argv), "preexec_fn": None}
    setpriv = shutil.which("setpriv")
    if setpriv:
        return {
            "args": [setpriv, "--pdeathsig", signal.Signals(signum).name.removeprefix("SIG"), *argv],
            "preexec_fn": None,
        }

    def die_with_parent() -> None:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)

    return {"args": list(argv), "preexec_fn": die_with_parent}


class Started(abc.ABC):
    """Something started and cleaned up: as a context manager, cleaned up on exit and when its
    start fails."""

    @abc.abstractmethod
    def start(self: _S) -> _S: ...

    @abc.abstractmethod
    def cleanup(self) -> None: ...

    def __enter__(self: _S) -> _S:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def making(factory: Callable[..., _S], *, start: bool = True) -> Iterator[Callable[..., _S]]:
    """The body of a fixture that yields make(*args, **options) -> factory(...) (started unless
    start=False) and cleans up everything made once the test is over, whatever its outcome:
    `yield from making(RedisServer)`."""
    made: list[_S] = []

    def make(*args: Any, **options: Any) -> _S:
        made.append(factory(*args, **options))
        return made[-1].start() if start else made[-1]

    yield make
    for thing in made:
        thing.cleanup()


class ServeProcess(Started):
    """`python -m veil.aggregator --config FILE` (or another `command` taking --config) as a
    child: its config written to DIRECTORY/veil.toml (owner-only: tokens may be inline), its
    output appended to DIRECTORY/serve.log across restarts, which start() reads for the JSON
    "aggregator started" line of every worker (so the log level must let info through)."""

    START_TIMEOUT = 60.0

    def __init__(
        self,
        directory: Path,
        config: dict,
        *,
        command: Sequence[str] | None = None,
        log_level: str | None = None,
        parent_death_signal: int | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "veil.toml"
        self.log = directory / "serve.log"
        self.write_config(config)
        self.grpc_port = int(config["server"]["grpc"].rpartition(":")[2])  # 0 until started: the kernel's pick
        self.http_port: int | None = None
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self._argv = [
            *(command or (sys.executable, "-m", "veil.aggregator")),
            "--config",
            str(self.config),
            *(("--log-level", log_level) if log_level else ()),
        ]
        self._parent_death_signal = parent_death_signal
        self._channel = None

    def write_config(self, config: dict) -> None:
        """(Re)write the config file; the next start() reads it."""
        self._config_data = config
        self.config.write_text(config_toml(config), encoding="utf-8")
        self.config.chmod(0o600)  # tokens inline make it a secrets file

    def set_store_url(self, url: str) -> None:
        """Point the config at another store (a failover); takes effect at the next start()."""
        self.write_config({**self._config_data, "store": {**self._config_data["store"], "url": url}})

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def pids(self) -> list[int]:
        """The process and its worker processes, if any (its CPU is theirs summed)."""
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children", encoding="ascii") as children:
                return [self.pid, *map(int, children.read().split())]
        except OSError:
            return [self.pid]

    def start(self) -> ServeProcess:
        """Start and return once every worker has logged "aggregator started" (its listeners are
        up); RuntimeError with the log's tail if it exits or takes longer than START_TIMEOUT."""
        assert self.process is None or self.process.poll() is not None, "already running"
        offset = self.log.stat().st_size if self.log.exists() else 0
        workers = self._config_data["server"].get("processes", 1)
        if self._parent_death_signal is None:
            popen = {"args": self._argv}
        else:
            popen = tied_to_parent(self._argv, self._parent_death_signal)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                **popen, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        self.starts += 1
        deadline = time.monotonic() + self.START_TIMEOUT
        while True:
            started = [line for line in self.log_lines(offset) if line.get("msg") == "aggregator started"]
            if len(started) >= workers:
                self.grpc_port, self.http_port = started[-1]["grpc_port"], started[-1].get("http_port")
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"veil serve exited with {self.process.returncode}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"veil serve did not start within {self.START_TIMEOUT} s:\n{self.log_text()[-3000:]}"
                )
            time.sleep(0.02)

    def signal(self, signum: int, timeout: float = 30.0) -> int:
        """Send a signal that ends it (SIGTERM: gracefully; SIGKILL: as a crash would) and reap
        it; its exit code."""
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout=timeout)

    def terminate(self) -> int:
        """SIGTERM (graceful), and SIGKILL if it has not stopped within 30 s; the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            try:
                return self.signal(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would, and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGKILL)

    def cleanup(self) -> None:
        self.kill()
        if self._channel is not None:
            self._channel.close()

    def rss_kib(self) -> int:
        """The process's resident set size (VmRSS) in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def health(self, timeout: float = 2.0) -> str:
        """The grpc.health.v1 status of the server as a whole: SERVING, NOT_SERVING, ..."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(self.endpoint)
        response = health_pb2_grpc.HealthStub(self._channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_lines(self, offset: int = 0) -> list[dict]:
        """The JSON lines of the log from byte `offset` on."""
        if not self.log.exists():
            return []
        with open(self.log, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        lines = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by SIGKILL
        return lines
