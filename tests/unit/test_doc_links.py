"""The README and the docs link only to files that exist, and the README stays short.

A user follows these links before reading any code: a link to a moved or missing page is a
dead end, so every relative link (and the anchor it names, where the target is Markdown) must
resolve inside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$", re.MULTILINE)
EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
README_MAX_LINES = 250


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page: each heading slugged, plus explicit `<a id>`s."""
    text = page.read_text(encoding="utf-8")
    anchors = set(EXPLICIT_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        plain = EXPLICIT_ANCHOR.sub("", heading).strip().lower()
        plain = re.sub(r"[^\w\- ]", "", plain)
        anchors.add(plain.replace(" ", "-"))
    return anchors


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [link for link in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def _resolves(page: Path, link: str) -> bool:
    target, _, anchor = link.partition("#")
    path = (page.parent / target).resolve() if target else page
    if not path.exists():
        return False
    return not anchor or path.suffix != ".md" or anchor.lower() in _anchors(path)


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=lambda p: str(p.name))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [link for link in _relative_links(page) if not _resolves(page, link)]
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


def test_the_readme_is_short_enough_to_read() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
