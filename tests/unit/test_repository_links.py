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
