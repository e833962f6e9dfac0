"""The arrow points one way: cli -> aggregator -> client -> mechanism -> (standard library), the
client and the aggregator -> wire; release stands alone beside them. Read from the sources'
import statements, so a violation fails here before it fails an SDK-only install."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "veil.mechanism": ROOT / "client/src/veil/mechanism",
    "veil.client": ROOT / "client/src/veil/client",
    "veil.aggregator": ROOT / "aggregator/src/veil/aggregator",
    "veil.release": ROOT / "release/src/veil/release",
    "veil.cli": ROOT / "cli/src/veil/cli",
}
# Which of Veil's packages each may import.
ALLOWED = {
    "veil.mechanism": set(),
    "veil.client": {"veil.mechanism", "veil.wire"},
    "veil.aggregator": {"veil.mechanism", "veil.client", "veil.wire"},
    "veil.release": set(),
    "veil.cli": {"veil.mechanism", "veil.client", "veil.wire", "veil.aggregator", "veil.release"},
}
# `python -m veil.aggregator` is `veil serve`: a launcher, which nothing imports.
LAUNCHERS = {ROOT / "aggregator/src/veil/aggregator/__main__.py"}


def veil_imports(path: Path) -> set[str]:
    """The veil packages (veil.x) a module imports, relative imports staying inside its own."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found |= {".".join(n.split(".")[:2]) for n in names if n.startswith("veil.")}
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_the_packages_below_it(package):
    for path in sorted(PACKAGES[package].rglob("*.py")):
        if path in LAUNCHERS:
            continue
        outside = veil_imports(path) - {package} - ALLOWED[package]
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_the_check_reads_imports_as_written(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import veil.aggregator.store\nfrom veil.client import Reporter\nfrom . import x\n"
                      "def f():\n    from veil.release import release_pram\n")
    assert veil_imports(module) == {"veil.aggregator", "veil.client", "veil.release"}
