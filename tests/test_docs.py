"""The repository's documents stay readable from a clone: every reference they make resolves.

- No tracked file points outside the repository, to the folder the project was first designed
  in (its design and mathematics now live in docs/design.md and docs/math.md).
- Every relative link of the Markdown documents names a file that exists, and a heading that
  exists in it (GitHub's anchors).
- Every code reference written `package.module:name` (or `:Class.method`) imports and resolves,
  so a formula's "computed by" cannot silently outlive the function.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "deploy" / "README.md"]
)
# Spelled in parts, so that this file does not mention what it forbids.
OUTSIDE = ("../" + "shared/", "MATH" + ".md", "DESIGN" + ".md")

_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_CODE_REF = re.compile(r"`(veil(?:\.\w+)+):([A-Za-z_][\w.]*)`")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _prose(path: Path) -> str:
    """The document without fenced code blocks (shell sessions and code, not links)."""
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens, -1, -2, ...
    for repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_no_tracked_file_refers_outside_the_repository():
    found = []
    for path in _tracked_files():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        found += [f"{path.relative_to(ROOT)}: {word}" for word in OUTSIDE if word in text]
    assert not found, (
        "references to documents outside the repository (use docs/design.md or docs/math.md):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in _LINK.findall(_prose(doc)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_references_resolve(doc):
    broken = []
    for module, name in sorted(set(_CODE_REF.findall(doc.read_text(encoding="utf-8")))):
        try:
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as err:
            broken.append(f"{module}:{name}: {err}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_checks_see_what_they_check():
    # A link and a reference of each kind, so that a regex gone blind fails here, not silently.
    math = (ROOT / "docs" / "math.md").read_text(encoding="utf-8")
    assert "erratum" in math.lower() and "(t-1) gamma + k - t" in math
    assert len(_CODE_REF.findall(math)) > 50
    assert len(_LINK.findall(_prose(ROOT / "docs" / "design.md"))) > 10
    assert "3-mechanisms-thresholds-and-reports" in _anchors(ROOT / "docs" / "protocol.md")
    assert "reporting-from-an-app-veilclient" in _anchors(ROOT / "README.md")
