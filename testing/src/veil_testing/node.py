"""The TypeScript SDK's Reporter in a Node process (client/js/test/drive.ts), driven over stdin:
what the tests of the TS SDK against real servers (the aggregator, the SDK's loopback collector)
talk to."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

__all__ = ["JS", "NodeReporter"]

JS = Path(__file__).resolve().parents[3] / "client" / "js"


class NodeReporter:
    """client/js/test/drive.ts: one Reporter in a Node process, driven over stdin."""

    def __init__(self, **options: object) -> None:
        node = shutil.which("node")
        assert node, "node is missing: `make test` installs it (Debian's nodejs)"
        script = JS / "dist" / "test" / "drive.js"
        assert script.exists(), (
            "the TypeScript SDK is not built: `make test` runs npm ci and npm run build in client/js"
        )
        self.process = subprocess.Popen(
            [node, str(script), json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def send(self, **command: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def ask(self, **command: object):
        self.send(**command)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, self.close()
        return json.loads(line)

    def report(self, metric: str, value: object, n: int = 1) -> None:
        self.send(do="report", metric=metric, value=value, n=n)

    def close(self) -> str:
        """End the process (stdin closed: it exits once its work is done); its log lines."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        assert self.process.stderr is not None
        return self.process.stderr.read()
