"""The repository's documents stay readable from a clone: every reference they make resolves.

- No tracked file points outside the repository, to the folder the project was first designed
  in (its design and mathematics now live in docs/design.md and docs/math.md).
- Every relative link of the Markdown documents names a file that exists, and a heading that
  exists in it (GitHub's anchors).
- Every code reference written `package.module:name` (or `:Class.method`) imports and resolves,
  so a formula's "computed by" cannot silently outlive the function.
- The README stays a front door: short, with the measured tables in the documents their
  benchmarks rewrite (bench/README.md, docs/estimates.md), never in it; the documents by reader
  have real headings (no bold run-in ones) and a table of contents, and name no issue numbers.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "bench" / "PROFILES.md",
        ROOT / "deploy" / "README.md",
        ROOT / "CHANGELOG.md",
    ]
)
README = ROOT / "README.md"
# The documents written by reader, out of the README: held to the rules of a front door's rooms.
BY_READER = [ROOT / "docs" / "sdk.md", ROOT / "docs" / "operating.md", ROOT / "docs" / "estimates.md"]
FRONT_DOOR_LINES = 250
# The blocks the benchmarks rewrite (begin markers), and the one document each lives in.
GENERATED = {
    "<!-- bench/report.py --markdown: begin -->": ROOT / "bench" / "README.md",
    "<!-- bench/coverage_grid.py: begin -->": ROOT / "docs" / "estimates.md",
    "<!-- bench/bench_total_width.py: begin -->": ROOT / "docs" / "estimates.md",
}
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
    assert "reporting-from-an-app" in _anchors(README)
    assert "report-never-breaks-the-app" in _anchors(ROOT / "docs" / "sdk.md")  # backticks and () dropped


def _without_generated(text: str) -> str:
    """The text without the blocks benchmarks write (their tables are rendered, not written)."""
    return re.sub(r"<!-- (bench/\S+)[^>]*: begin -->.*?<!-- \1[^>]*: end -->", "", text, flags=re.S)


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= FRONT_DOOR_LINES, f"README.md has {len(lines)} lines; move detail to docs/ by reader"
    linked = set(_LINK.findall(_prose(README)))
    for doc in [*BY_READER, ROOT / "bench" / "README.md", ROOT / "docs" / "protocol.md"]:
        assert any(t.split("#")[0] == str(doc.relative_to(ROOT)) for t in linked), f"README.md links no {doc.name}"


@pytest.mark.parametrize("marker", sorted(GENERATED))
def test_each_generated_block_lives_in_its_one_document(marker):
    holders = [doc for doc in DOCS if marker in doc.read_text(encoding="utf-8")]
    assert holders == [GENERATED[marker]], f"{marker}: in {[str(d.relative_to(ROOT)) for d in holders]}"


@pytest.mark.parametrize(
    "doc", [README, *BY_READER, ROOT / "bench" / "README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_documents_by_reader_have_real_headings_and_no_issue_numbers(doc):
    text = _without_generated(_prose(doc))
    run_in = [line for line in text.splitlines() if re.match(r"\*\*[^*]+\*\*", line)]
    assert not run_in, f"{doc.relative_to(ROOT)}: bold run-in headings (use ## or ###):\n" + "\n".join(run_in)
    issues = re.findall(r"\bissues?\s+(?:#\s*)?\d+|\(issue\b[^)]*\)", text, flags=re.I)
    assert not issues, f"{doc.relative_to(ROOT)}: names issues {issues}"


@pytest.mark.parametrize("doc", [*BY_READER, ROOT / "bench" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_long_documents_open_with_a_table_of_contents_of_their_sections(doc):
    text = _without_generated(_prose(doc))
    assert "\n## Contents\n" in text, f"{doc.relative_to(ROOT)} has no ## Contents"
    contents = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = {target.removeprefix("#") for target in _LINK.findall(contents)}
    sections = {a for a in _anchors(doc) if a != "contents"}
    top = {
        re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^## (.*?)\s*$", text, flags=re.M)
        if h != "Contents"
    }
    assert top <= listed <= sections, f"{doc.relative_to(ROOT)}: contents {sorted(listed)}, sections {sorted(top)}"
