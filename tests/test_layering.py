"""The arrow points one way: cli -> aggregator -> client -> mechanism -> (standard library), the
client and the aggregator -> wire; release stands alone beside them. Read from the sources'
import statements, so a violation fails here before it fails an SDK-only install."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


def imports(path: Path, here: str) -> Iterator[tuple[str, list[str]]]:
    """(module, the names imported from it) of every import statement of a module, those inside
    functions too, relative ones resolved against the module's package ``here``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = node.module if node.level == 0 else ".".join(filter(None, (base, node.module)))
            yield target or "", [alias.name for alias in node.names]


def package_of(package: str, path: Path) -> str:
    """The dotted package a module of ``package`` (a file under PACKAGES[package]) is in."""
    return ".".join((package, *path.relative_to(PACKAGES[package]).parent.parts))


def veil_imports(path: Path, here: str) -> set[str]:
    """The veil packages (veil.x) a module of package ``here`` imports."""
    return {".".join(module.split(".")[:2]) for module, _ in imports(path, here) if module.startswith("veil.")}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_the_packages_below_it(package):
    for path in sorted(PACKAGES[package].rglob("*.py")):
        if path in LAUNCHERS:
            continue
        outside = veil_imports(path, package_of(package, path)) - {package} - ALLOWED[package]
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of a package -> the modules of the same package it imports (anywhere in it,
    so a cycle hidden by an import inside a function counts), its own package left out."""
    root = PACKAGES[package]
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        here = package_of(package, path)
        found = set()
        for target, names in imports(path, here):
            found |= {f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names} if names else {target}
        graph[name] = {m for m in found if m in modules and m not in (name, here)}
    return graph


@pytest.mark.parametrize("package", ["veil.mechanism", "veil.aggregator", "veil.release", "veil.cli"])
def test_no_two_modules_of_a_package_import_each_other(package):
    graph = module_graph(package)
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            assert target not in path, f"import cycle: {' -> '.join(path[path.index(target) :] + [target])}"
            if target not in done:
                visit(target, [*path, target])
        done.add(name)

    for name in sorted(graph):
        visit(name, [name])


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(monkeypatch, tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    monkeypatch.setitem(PACKAGES, "veil.toy", tmp_path)
    assert module_graph("veil.toy") == {"veil.toy.a": {"veil.toy.b"}, "veil.toy.b": {"veil.toy.a"}}
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_two_modules_of_a_package_import_each_other("veil.toy")


def test_the_check_reads_imports_as_written(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import veil.aggregator.store\nfrom veil.client import Reporter\nfrom . import x\n"
        "def f():\n    from veil.release import release_pram\n"
    )
    assert veil_imports(module, "veil.toy") == {"veil.aggregator", "veil.client", "veil.release", "veil.toy"}
