"""Headless Chromium for browser tests, driven over the DevTools protocol on a pipe.

    binary = ensure_chromium()              # finds it; installs Debian's `chromium` if root
    with Browser(binary, tmp_path) as browser:
        page = browser.open("http://127.0.0.1:8080/")
        page.wait_for("document.querySelectorAll('.bar').length > 0", timeout=10)
        page.evaluate("document.title")
        page.screenshot(tmp_path / "page.png", width=1280)

The protocol travels over `--remote-debugging-pipe` (JSON messages ended by NUL on file
descriptors 3 and 4), so no port is opened and no websocket client is needed: standard library
only. Every call has a bounded wait; Browser.close() ends Chromium and everything it started
(its own process group).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["FLAGS", "INSTALL_COMMAND", "Browser", "BrowserError", "Page", "ensure_chromium", "find_chromium"]

# The flags every launch uses, plus a fresh --user-data-dir (and --remote-debugging-pipe).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)

CANDIDATES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")
INSTALL_COMMAND = "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium"
_INSTALL_TIMEOUT = 900.0  # seconds for apt-get update + install together
_MISSING = (
    "Chromium is not installed (looked for /usr/bin/chromium, then {names} on PATH; set CHROMIUM=/path "
    "to use another). `make test` installs it; by hand: sudo sh -c '{install}'"
)


class BrowserError(RuntimeError):
    """Chromium failed to start, answered a command with an error, or a wait ran out."""


def find_chromium() -> str | None:
    """$CHROMIUM if set, else /usr/bin/chromium, else the first of CANDIDATES on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def ensure_chromium() -> str:
    """The Chromium binary; when it is missing and we are root on a Debian-like system, install
    Debian's `chromium` package first (bounded time). Raises BrowserError saying how to install it."""
    found = find_chromium()
    if found:
        return found
    missing = _MISSING.format(names=", ".join(CANDIDATES), install=INSTALL_COMMAND)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BrowserError(missing)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + _INSTALL_TIMEOUT
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=120", "chromium"],
    ):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            raise BrowserError(f"{' '.join(command)} took over {_INSTALL_TIMEOUT:.0f} s. {missing}") from None
        if done.returncode != 0:
            raise BrowserError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}\n{missing}")
    found = find_chromium()
    if not found:
        raise BrowserError(missing)
    return found


class Browser:
    """One headless Chromium with a fresh profile, spoken to over the DevTools pipe."""

    def __init__(self, binary: str, directory: Path | None = None, *, start_timeout: float = 30.0) -> None:
        self._own_dir = directory is None
        self.dir = Path(directory if directory is not None else tempfile.mkdtemp(prefix="veil-chromium-"))
        self.profile = Path(tempfile.mkdtemp(prefix="profile-", dir=self.dir))
        self.log = self.dir / "chromium.log"
        self._ids = iter(range(1, 1 << 62))
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []  # every event (message without an id), in arrival order
        self._lock = threading.Condition()
        self._closed = False
        args = [binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]
        # Chromium reads commands on fd 3 and writes replies on fd 4: the shell moves our pipes there.
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null', "sh", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, name="chromium-pipe", daemon=True)
        self._reader.start()
        try:
            self.version = self.call("Browser.getVersion", timeout=start_timeout)["product"]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        while chunk := self.process.stdout.read1(1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                with self._lock:
                    if "id" in message:
                        self._replies[message["id"]] = message
                        self._lock.notify_all()
                    else:
                        self.events.append(message)
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def call(
        self, method: str, params: dict | None = None, *, session: str | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Send one command and wait (at most `timeout` s) for its result."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\0")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise BrowserError(f"Chromium has exited; see {self.log}:\n{self._log_tail()}") from None
        deadline = time.monotonic() + timeout
        with self._lock:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if self._closed:
                    raise BrowserError(f"Chromium closed the pipe during {method}; see {self.log}:\n{self._log_tail()}")
                if left <= 0:
                    raise BrowserError(f"{method}: no answer from Chromium within {timeout} s")
                self._lock.wait(left)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str, *, width: int = 1280, height: int = 900) -> Page:
        """A new tab showing `url`, with a viewport of width x height CSS pixels."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.resize(width, height)
        page.call("Runtime.enable")  # exceptions and console messages, for Page.errors()
        page.call("Log.enable")  # network failures, CSP violations
        page.call("Page.navigate", {"url": url})
        return page

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self, timeout: float = 5.0) -> None:
        """Ask Chromium to quit, then end its process group (only what this Browser started)."""
        if self.process.poll() is None:
            try:
                self.call("Browser.close", timeout=timeout)
            except BrowserError:
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # helpers (zygote, renderers) left behind
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(timeout)
        for stream in (self.process.stdin, self.process.stdout):
            if stream:
                try:
                    stream.close()
                except OSError:
                    pass
        self._reader.join(timeout)
        shutil.rmtree(self.profile, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class Page:
    """One tab: evaluate JavaScript, wait for a condition, take a screenshot."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def call(self, method: str, params: dict | None = None, *, timeout: float = 10.0) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session, timeout=timeout)

    def resize(self, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def evaluate(self, expression: str, *, timeout: float = 10.0) -> Any:
        """The value of a JavaScript expression (JSON-serializable; promises are awaited)."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, timeout=timeout
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} threw: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 10.0, interval: float = 0.1) -> Any:
        """Evaluate `expression` until it is truthy (returned) or `timeout` s pass (BrowserError)."""
        deadline = time.monotonic() + timeout
        value = None
        while True:
            try:
                value = self.evaluate(expression, timeout=max(1.0, deadline - time.monotonic()))
            except BrowserError as err:  # e.g. the page is navigating; keep trying until the deadline
                value = err
            if value and not isinstance(value, BrowserError):
                return value
            if time.monotonic() >= deadline:
                raise BrowserError(f"waited {timeout} s for {expression!r}; last value {value!r}")
            time.sleep(interval)

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries (failed requests, CSP
        violations) of this tab so far."""
        found = []
        with self.browser._lock:
            events = [e for e in self.browser.events if e.get("sessionId") == self.session]
        for event in events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                found.append(f"{entry.get('text', '')} {entry.get('url', '')}".strip())
        return found

    def screenshot(self, path: Path, *, width: int = 1280) -> Path:
        """A PNG of the whole page (its full height) at `width` CSS pixels."""
        self.call("Emulation.setScrollbarsHidden", {"hidden": True})  # else they take 15 px of the width
        self.resize(width, 600)
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        self.resize(width, max(height, 200))
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, timeout=30)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
