"""promtool's lint of Prometheus exposition text (the /metrics tests)."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["promtool_lint"]


def promtool_lint(text: str) -> str:
    """promtool check metrics of the exposition text: its complaints ("" when clean)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make promtool` installs Debian's prometheus package"
    done = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return (done.stdout + done.stderr).decode() + ("" if done.returncode == 0 else f" (exit {done.returncode})")
