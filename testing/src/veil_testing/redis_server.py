"""A real redis-server for tests: its own free port and temporary directory, killed on teardown.

    with RedisServer(appendonly=True, appendfsync="always") as server:
        server.url            # redis://127.0.0.1:<port>/0  (server.unix_url: over its socket)
        server.kill()         # SIGKILL, as a crash would
        server.start()        # again, same port and directory (so the same AOF)

No persistence unless asked (``--save "" --appendonly no``). DEBUG is enabled for local
clients (DEBUG SLEEP simulates a stalled server). On Linux a server gets SIGKILL when the
thread that started it exits, so start servers from the test's own thread. No redis-py, so a
conftest can import it without loading redis-py.
"""

from __future__ import annotations

import itertools
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from veil_testing.processes import Started, free_port, tied_to_parent

__all__ = ["RedisServer"]

_MISSING = "redis-server is not installed (not on PATH); `make test` installs it (Debian package redis-server)."
_READY_TIMEOUT = 10.0  # seconds for a start, AOF loading included


class RedisServer(Started):
    def __init__(
        self,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        replicaof: RedisServer | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(_MISSING)
        self.dir = Path(tempfile.mkdtemp(prefix="veil-redis-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._args = [
            "--appendonly", "yes" if appendonly else "no",
            "--appendfsync", appendfsync,
            *(["--replicaof", "127.0.0.1", str(replicaof.port)] if replicaof else []),
            *args,
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.dir / 'redis.sock'}?db=0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> RedisServer:
        """Start and wait until it answers. The first start picks a free port, and another if
        redis-server exits (someone took the port first); later starts reuse the port (and the
        directory, so the AOF)."""
        if self.running:
            raise RuntimeError(f"redis-server already runs on port {self.port}")
        reuse = bool(self.port)
        for attempt in itertools.count(1):
            if not reuse:
                self.port = free_port()
            self._launch()
            if self._wait_ready():
                return self
            self.kill()
            if reuse or attempt == 3:
                raise RuntimeError(f"redis-server exited on port {self.port}:\n{self.log()[-2000:]}")

    def stop(self) -> None:
        """Shut down cleanly (SIGTERM: Redis flushes its AOF), killing it if it hangs."""
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass  # killed below
        self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash of Redis would: what it had not yet written to its files is lost
        (what it wrote but did not fsync survives, in the OS; only a host crash loses that)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        self.process = None

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str, timeout: float = 5.0) -> bytes:
        """Send one command over a fresh connection and return the raw reply (no redis-py)."""
        request = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        return reply

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _launch(self) -> None:
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.dir / "redis.sock"),
            "--unixsocketperm", "700",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            "--save", "",
            "--daemonize", "no",
            "--enable-debug-command", "local",
            *self._args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            **tied_to_parent(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _wait_ready(self) -> bool:
        """True once it answers PING (an error like -NOAUTH counts, -LOADING does not); False if
        it exited; RuntimeError (after killing it) if it does neither in time."""
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                return False
            try:
                reply = self.command("PING", timeout=1.0)
                if reply and not reply.startswith(b"-LOADING"):
                    return True
            except OSError:
                pass
            time.sleep(0.01)
        self.kill()
        log = self.log()[-2000:]
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {_READY_TIMEOUT} s:\n{log}")
