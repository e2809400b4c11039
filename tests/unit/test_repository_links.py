"""Docs and code point only inside the repository: no ``../shared`` path, and every relative Markdown link resolves.

A user with a clone (or an installed package) has nothing beside the repository; the simulator's data ships in the
package, the measured facts and the design map live in ``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

SCANNED = ("README.md", "docs", "slurm_amoeba", "tests", "benchmarks", "examples", "scripts", "configs", "Makefile")
TEXT = {".md", ".py", ".yaml", ".yml", ".sh", ".in", ".conf", ".service", ".txt", ""}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def text_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = REPO / name
        candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files.extend(p for p in candidates if p.suffix in TEXT and "__pycache__" not in p.parts)
    return sorted(files)


def test_nothing_points_outside_the_repository_at_shared() -> None:
    this = Path(__file__).resolve()
    needle = "../" + "shared"
    offenders = [
        f"{p.relative_to(REPO)}:{n}"
        for p in text_files()
        if p.resolve() != this
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if needle in line
    ]
    assert not offenders, f"these lines point at {needle} (outside the repository): {offenders}"


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_every_relative_link_of_a_document_resolves(doc: str) -> None:
    path = REPO / doc
    broken = [
        target
        for target in LINK.findall(path.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (path.parent / target).exists()
    ]
    assert not broken, f"{doc} links to missing files: {broken}"


ANCHORED = re.compile(r"\]\(([^)\s]*)#([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """The anchor GitHub and mkdocs' ``toc`` give a heading: lower case, code marks and punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks)."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = HEADING.match(line)
        if heading and not fenced:
            found.add(slug(heading.group(1)))
    return found


def test_a_heading_s_anchor_is_what_github_and_mkdocs_make_of_it() -> None:
    assert slug("1. What a DDP user changes") == "1-what-a-ddp-user-changes"
    assert slug("12. Adaptive batch (opt-in)") == "12-adaptive-batch-opt-in"
    assert slug("sim-default") == "sim-default"
    assert slug("The `slurm` baseline") == "the-slurm-baseline"


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_every_anchor_a_document_links_to_exists(doc: str) -> None:
    path = REPO / doc
    missing = []
    for target, anchor in ANCHORED.findall(path.read_text()):
        if "://" in target:
            continue
        linked = (path.parent / target) if target else path
        if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
            missing.append(f"{target or doc}#{anchor}")
    assert not missing, f"{doc} links to anchors that no heading makes: {missing}"


def test_the_readme_stays_a_front_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; keep it under 150 and move detail to docs/"
    text = "\n".join(lines)
    for needed in ("make demo", "make test", "docs/runtime.md#1-what-a-ddp-user-changes", "docs/admin.md", "DESIGN.md"):
        assert needed in text, f"README.md no longer mentions {needed!r}"
