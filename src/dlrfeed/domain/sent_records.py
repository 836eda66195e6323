"""What a record of a sent message says (P5), and how a second record of the same id differs
from the first (P12): the sending application records its messages through
`Store.record_submissions`; a second record that says the same is a no-op, one that differs is
evidence of ambiguity, kept and flagged, and two records are never reduced to one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

RECORD_FIELDS = (
    "internal_id",
    "destination_raw",
    "source",
    "route",
    "submitted_at",
    "dlr_requested",
    "dlr_level",
)
"""P5: what a record of a sent message says; two records that differ in any are two records."""


def _comparable(value: object) -> object:
    # A naive time is recorded as UTC (the driver's reading of it for timestamptz).
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def record_differences(recorded: Mapping[str, Any], submitted: Mapping[str, Any]) -> list[str]:
    """P12: the fields in which a second record of a sent message id differs from the one
    recorded; none means an identical re-record (a no-op)."""
    return [
        name
        for name in RECORD_FIELDS
        if _comparable(recorded[name]) != _comparable(submitted[name])
    ]
