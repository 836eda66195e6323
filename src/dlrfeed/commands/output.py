"""How the operator commands print: aligned plain-text tables for people, JSON for programs,
CSV for the spreadsheet operators reconcile in."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import Any

_MAX_CELL = 60


def cell(value: Any) -> str:
    """One value as table text: None as '-', long values cut with an ellipsis."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = " ".join(str(value).split())
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned table with a header line; '(none)' when there are no rows."""
    if not rows:
        return "  (none)"
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in texts)) for i, h in enumerate(headers)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in texts]
    return "\n".join(line.rstrip() for line in lines)


def print_json(document: Any) -> None:
    """Stable JSON: sorted keys, one document, newline-terminated."""
    print(json.dumps(document, sort_keys=True, ensure_ascii=False, default=str))


# A spreadsheet runs a cell that starts with one of these as a formula; receipt fields are
# hostile input (the network writes them), so such text is kept as text with a leading quote.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """One value as CSV text: None empty, JSON for objects, formula-looking text quoted."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def print_csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """RFC 4180 CSV on stdout: a header line, then one line per row (CRLF, quoted as needed)."""
    writer = csv.writer(sys.stdout, lineterminator="\r\n")
    writer.writerow(headers)
    writer.writerows([csv_cell(v) for v in row] for row in rows)
