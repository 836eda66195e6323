"""The configuration reference in docs/ is generated from the parsers and must not drift."""

from __future__ import annotations

from pathlib import Path

from dlrfeed_tools.config_docs import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run `python scripts/gen_config_docs.py > "
        "docs/configuration.md` and commit it"
    )


def test_every_option_has_help_text() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `--")]
    assert rows, "no options rendered"
    assert all(not line.rstrip().endswith("|  |") for line in rows), "an option lacks help"
