"""Veil's wheel, built from a source tree as pip builds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["build_wheel"]


def build_wheel(source: Path, out_dir: Path) -> Path:
    """The one veil wheel pip builds from `source` into `out_dir` (no dependencies, the build
    backend already installed: no network)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out_dir),
            str(source),
        ],
        check=True,
    )
    (path,) = out_dir.glob("veil-*.whl")
    return path
