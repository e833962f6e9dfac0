"""The arrow points one way: cli -> aggregator -> client -> mechanism -> (standard library), the
client and the aggregator -> wire; release stands alone beside them, and veil_testing (the
tests' helpers) above them. Within each package no two modules import each other, and no
package imports another's private modules or names. Read from the sources' import statements,
so a violation fails here before it fails an SDK-only install."""

from __future__ import annotations

import ast
import sys
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
    "veil.wire": ROOT / "proto/veil/wire",
    "veil_testing": ROOT / "testing/src/veil_testing",
}
# Which of Veil's packages each may import.
ALLOWED = {
    "veil.mechanism": set(),
    "veil.client": {"veil.mechanism", "veil.wire"},
    "veil.aggregator": {"veil.mechanism", "veil.client", "veil.wire"},
    "veil.release": set(),
    "veil.cli": {"veil.mechanism", "veil.client", "veil.wire", "veil.aggregator", "veil.release"},
    "veil.wire": set(),
    "veil_testing": {"veil.mechanism", "veil.client", "veil.wire", "veil.aggregator"},
}
# `python -m veil.aggregator` is `veil serve`: a launcher, which nothing imports.
LAUNCHERS = {ROOT / "aggregator/src/veil/aggregator/__main__.py"}
# Import cycles known and left for now, each named: the test fails on any other cycle, on one of
# these grown by another module, and on one of these gone (then its line goes too).
KNOWN_CYCLES: set[frozenset[str]] = set()
# Private modules or names one package imports from another, known and left for now, each named
# by the importing file and the module: the test fails on any other, and on one of these gone.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()


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


def top_package(module: str) -> str:
    """The package of PACKAGES (or any veil.x) a dotted module name is in; "" for none."""
    if module.startswith("veil."):
        return ".".join(module.split(".")[:2])
    return next((package for package in PACKAGES if module == package or module.startswith(f"{package}.")), "")


def veil_imports(path: Path, here: str) -> set[str]:
    """The veil packages (veil.x) a module of package ``here`` imports."""
    return {".".join(module.split(".")[:2]) for module, _ in imports(path, here) if module.startswith("veil.")}


def private_imports(path: Path, here: str) -> set[tuple[str, str]]:
    """(module, what of it is private) for each import by a module of package ``here`` (or of
    its subpackage ``here``) of another package's private module (a dotted part "_x") or
    private name."""
    found = set()
    for module, names in imports(path, here):
        top = top_package(module)
        if not top or top == top_package(here):
            continue
        parts = module[len(top) :].split(".")
        private = [part for part in parts if part.startswith("_") and not part.startswith("__")]
        private += [name for name in names if name.startswith("_")]
        if private:
            found.add((module, ", ".join(private)))
    return found


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


def cycles(graph: dict[str, set[str]]) -> list[tuple[frozenset[str], list[str]]]:
    """The import cycles of a module graph: each set of modules that import one another
    (a strongly connected component of more than one), with one cycle through it to show."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in index:
                connect(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = []
            while not members or members[-1] != name:
                members.append(stack.pop())
            if len(members) > 1:
                found.append((frozenset(members), shown_cycle(graph, name, set(members))))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return found


def shown_cycle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A path from start back to start within members (which all reach one another)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        name = queue.pop(0)
        for target in sorted(graph[name] & members):
            if target == start:
                return [*paths[name], start]
            if target not in paths:
                paths[target] = [*paths[name], target]
                queue.append(target)
    raise AssertionError("unreachable: the members of a component reach one another")


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_two_modules_of_a_package_import_each_other(package):
    found = cycles(module_graph(package))
    for members, shown in found:
        assert members in KNOWN_CYCLES, f"import cycle: {' -> '.join(shown)}"
    known_here = {known for known in KNOWN_CYCLES if all(top_package(m) == package for m in known)}
    gone = known_here - {members for members, _ in found}
    assert not gone, f"known cycles no longer there (remove them from KNOWN_CYCLES): {sorted(map(sorted, gone))}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_imports_another_packages_private_modules_or_names(package):
    found = set()
    for path in sorted(PACKAGES[package].rglob("*.py")):
        for module, private in private_imports(path, package_of(package, path)):
            where = str(path.relative_to(ROOT))
            found.add((where, module))
            assert (where, module) in KNOWN_PRIVATE_IMPORTS, f"{where} imports {private} of {module}"
    known_here = {known for known in KNOWN_PRIVATE_IMPORTS if (ROOT / known[0]).is_relative_to(PACKAGES[package])}
    gone = known_here - found
    assert not gone, f"known private imports no longer there (remove them from KNOWN_PRIVATE_IMPORTS): {sorted(gone)}"


# The aggregator's parts both listeners share, and the HTTP listener's own: grpcio stays in the
# gRPC adapters (service, _interceptor) and the daemon that wires them.
GRPC_FREE = ("ingest", "_access", "_budget", "_calls", "_http_collector", "http")


@pytest.mark.parametrize("module", GRPC_FREE)
def test_the_access_policy_the_ingest_core_and_http_import_no_grpcio(module):
    path = PACKAGES["veil.aggregator"] / f"{module}.py"
    found = {name for name, _ in imports(path, "veil.aggregator") if name.partition(".")[0] == "grpc"}
    assert not found, f"veil.aggregator.{module} imports {sorted(found)}"


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(monkeypatch, tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    monkeypatch.setitem(PACKAGES, "veil.toy", tmp_path)
    assert module_graph("veil.toy") == {"veil.toy.a": {"veil.toy.b"}, "veil.toy.b": {"veil.toy.a"}}
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_two_modules_of_a_package_import_each_other("veil.toy")


def test_a_known_cycle_passes_and_a_new_or_grown_one_fails(monkeypatch, tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "c.py").write_text("from .d import x\n")
    (tmp_path / "d.py").write_text("from .c import x\n")
    monkeypatch.setitem(PACKAGES, "veil.toy", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "KNOWN_CYCLES", {frozenset({"veil.toy.a", "veil.toy.b"})})
    with pytest.raises(AssertionError, match=r"import cycle: veil\.toy\.c -> veil\.toy\.d -> veil\.toy\.c"):
        test_no_two_modules_of_a_package_import_each_other("veil.toy")
    (tmp_path / "d.py").write_text("x = 1\n")
    test_no_two_modules_of_a_package_import_each_other("veil.toy")
    (tmp_path / "b.py").write_text("from .c import x\n")
    (tmp_path / "c.py").write_text("from .a import x\n")  # a -> b -> c -> a: the known cycle grown
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_two_modules_of_a_package_import_each_other("veil.toy")
    (tmp_path / "c.py").write_text("x = 1\n")  # no cycle left: the known one is stale
    with pytest.raises(AssertionError, match="no longer there"):
        test_no_two_modules_of_a_package_import_each_other("veil.toy")


def test_the_private_import_check_sees_private_modules_and_names_of_other_packages(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from veil.client._config import is_loopback\nimport veil.aggregator.store._redis\n"
        "from veil.aggregator.store import _private, RedisStore\nfrom veil.mechanism import MetricSpec\n"
        "from veil.cli._serve import run\nfrom ._own import x\n"
        "def f():\n    from veil_testing.running import _helper\n"
    )
    assert private_imports(module, "veil.cli") == {
        ("veil.client._config", "_config"),
        ("veil.aggregator.store._redis", "_redis"),
        ("veil.aggregator.store", "_private"),
        ("veil_testing.running", "_helper"),
    }


def test_the_check_reads_imports_as_written(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import veil.aggregator.store\nfrom veil.client import Reporter\nfrom . import x\n"
        "def f():\n    from veil.release import release_pram\n"
    )
    assert veil_imports(module, "veil.toy") == {"veil.aggregator", "veil.client", "veil.release", "veil.toy"}
