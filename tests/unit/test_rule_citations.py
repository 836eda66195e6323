"""Every rule id the repository cites resolves in its own catalogue, docs/spec/, and nothing
cites a tracker instead or a document outside the repository.

Code, tests and documents cite rules by id (`F7`, `FD3`, `P14`, `C8`); a reader with only a
clone must be able to look each one up. An id is defined where docs/spec/ gives it a heading
(`### <a id="f7"></a>F7 — ...`) or a table row (`| <a id="c8"></a>C8 | ... |`). A tracker's
number (the word issue and a number, with or without `#`) resolves nowhere in a clone: say
why, or cite the rule. The project's public surfaces are cited by section of
docs/spec/interfaces.md (`docs/spec/interfaces.md §3`), never of a contract kept elsewhere.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "docs" / "spec"
CITING_TREES = ("src", "scripts", "tests", "docs")
CITING_FILES = ("README.md",)
# Also read for tracker references: text a user reads beside the code.
PROSE_TREES = ("monitoring", "systemd")
SKIPPED_SUFFIXES = frozenset({".png", ".pyc"})

_ID = r"(?:FD|[FPC])\d{1,2}"
CITATION = re.compile(rf"(?<![A-Za-z0-9_]){_ID}(?![A-Za-z0-9_])")
# Each definition carries a short anchor, so a link can reach it: feed.md#f7, processing.md#c8.
HEADING = re.compile(rf'^#{{2,6}}\s+<a id="([a-z0-9]+)"></a>({_ID})\b')
TABLE_ROW = re.compile(rf'^\|\s*<a id="([a-z0-9]+)"></a>({_ID})\s*\|')
TRACKER_REFERENCE = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)


def defined_ids() -> Counter[str]:
    """How many times docs/spec/ defines each rule id (as a heading or a table row)."""
    counts: Counter[str] = Counter()
    for path in sorted(CATALOGUE.glob("*.md")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = HEADING.match(line) or TABLE_ROW.match(line)
            if match:
                anchor, rule = match.groups()
                assert anchor == rule.lower(), f"{path.name}: {rule} has the anchor {anchor!r}"
                counts[rule] += 1
    return counts


def citing_files(trees: tuple[str, ...] = CITING_TREES) -> list[Path]:
    """Every text file of `trees` (and README.md) whose citations must resolve."""
    files = [ROOT / name for name in CITING_FILES]
    for tree in trees:
        files.extend(
            path
            for path in sorted((ROOT / tree).rglob("*"))
            if path.is_file() and path.suffix not in SKIPPED_SUFFIXES
        )
    return files


def citations(text: str) -> set[str]:
    """The rule ids cited in one text."""
    return set(CITATION.findall(text))


def test_every_cited_rule_is_defined_in_docs_spec() -> None:
    defined = set(defined_ids())
    unresolved: dict[str, list[str]] = {}
    for path in citing_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a text file
        for rule in citations(text) - defined:
            unresolved.setdefault(rule, []).append(str(path.relative_to(ROOT)))
    assert not unresolved, f"rule ids cited but not defined in docs/spec/: {unresolved}"


def tracker_references(text: str) -> list[str]:
    """The tracker references (the word issue, `#` or not, and a number) in one text."""
    return TRACKER_REFERENCE.findall(text)


def test_no_file_cites_a_tracker_number() -> None:
    found: dict[str, list[str]] = {}
    for path in citing_files(CITING_TREES + PROSE_TREES):
        name = str(path.relative_to(ROOT))
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a text file
        if references := tracker_references(text):
            found[name] = references
    assert not found, f"tracker references instead of a reason or a rule id: {found}"


def test_the_tracker_pattern_sees_issue_numbers_and_only_those() -> None:
    # Built at run time, so this file itself holds no tracker reference.
    word = "issue"
    text = f"{word} 7, {word.title()} #12, {word}s 3 and 4, {word}#5; not {word}s, {word}d"
    assert tracker_references(text) == [
        f"{word} 7",
        f"{word.title()} #12",
        f"{word}s 3",
        f"{word}#5",
    ]
    assert tracker_references("signer.issue(login, 7)") == []


def test_each_rule_is_defined_once() -> None:
    counts = defined_ids()
    expected = (
        {f"F{n}" for n in range(1, 17)}
        | {f"FD{n}" for n in range(1, 4)}
        | {f"P{n}" for n in range(1, 25)}
        | {f"C{n}" for n in range(1, 9)}
    )
    assert set(counts) == expected
    assert [rule for rule, count in counts.items() if count > 1] == []


def test_the_citation_pattern_sees_ids_and_only_ids() -> None:
    # Built at run time, so this file itself cites no undefined id.
    undefined = "F" + "99"
    text = f"# {undefined}: see FD2, P14 and C8 (F1-F16); not UTF8, SHA256 or F7a"
    assert citations(text) == {undefined, "FD2", "P14", "C8", "F1", "F16"}
    assert undefined not in defined_ids()


# Built at run time, so this file itself does not hold the phrases it looks for.
_OUTSIDE_DOCUMENT = "CONTRACT"
OUTSIDE_CITATIONS = (f"{_OUTSIDE_DOCUMENT} §", f"{_OUTSIDE_DOCUMENT}.md")


def outside_citations(text: str) -> list[str]:
    """The citations of the contract document that lives outside the repository."""
    return [phrase for phrase in OUTSIDE_CITATIONS if phrase in text]


def test_no_file_cites_the_contract_outside_the_repository() -> None:
    # The public surfaces are described in docs/spec/interfaces.md, with the same section
    # numbers: cite `docs/spec/interfaces.md §3` (or `interfaces §3`), which a clone resolves.
    found: dict[str, list[str]] = {}
    for path in citing_files(CITING_TREES + PROSE_TREES):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a text file
        if phrases := outside_citations(text):
            found[str(path.relative_to(ROOT))] = phrases
    assert not found, f"cite docs/spec/interfaces.md instead: {found}"


def test_the_interfaces_sections_have_anchors() -> None:
    text = (CATALOGUE / "interfaces.md").read_text(encoding="utf-8")
    anchors = re.findall(r'^## <a id="(s[0-9a-z]+)"></a>§', text, re.MULTILINE)
    assert anchors == ["s1", "s2", "s3", "s4", "s4b", "s5"]
