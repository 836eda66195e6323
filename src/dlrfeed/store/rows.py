"""Rows to domain values and back, shared by the ingest, late correlation and recompute: the
statuses and exceptions as the set-based statements take them (`upsert_statuses` in
`sql/ingest.sql`), a stored reception as the planner's delivery, and the printable form of the
labels an unstorable receipt is kept under (C8).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from dlrfeed.domain.rules import Delivery, MessageState, PlannedException, explain, is_final
from dlrfeed.domain.status import STAT_TO_STATUS, Status

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    # asyncpg's classes are generic only in its stubs.
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]


ExceptionRow: TypeAlias = tuple[str, str, str, int | None, int | None]
"""An exception to open: kind, message id, details (JSON), event id, and its reception's batch
position (the ingest) or id (late correlation)."""


dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""JSON text, compact and not ASCII-escaped: the JSON parameters of the statements."""


def column_arrays(rows: Sequence[Sequence[Any]], count: int) -> list[list[Any]]:
    """The first `count` columns of `rows` as arrays: a set-based statement's parameters."""
    return [[row[column] for row in rows] for column in range(count)]


def status_json(statuses: Mapping[str, MessageState], refs: Mapping[str, int]) -> str:
    """The :statuses of upsert_statuses (sql/ingest.sql) for the states that have a basis, in
    message id order; `refs`, each message's row id. Each row an array of the fields that
    `status_rows` names, in its order (as ingest.first_events, for the encoder's sake)."""
    rows = []
    iso: dict[int, str] = {}  # by object: a batch's statuses mostly share parsed done dates
    for key, s in sorted(statuses.items()):
        basis = s.basis
        if basis is None:
            continue
        at = basis.order_at
        if at is None:
            done = None
        else:
            done = iso.get(id(at))
            if done is None:
                done = iso[id(at)] = at.isoformat()
        rows.append(
            [
                refs.get(key),  # message_ref
                basis.status,  # StrEnum: JSON-encoded as its value
                is_final(s),
                explain(s),  # reason
                basis.event_id,  # supporting_event_id
                basis.reception_id or None,  # supporting_reception_id; 0: retired (P21)
                s.repeats,
                s.conflicts,
                s.progress_events,
                s.deadline_superseded,
                basis.level,
                basis.stat,
                basis.err,
                done,  # basis_done_at
                " ".join(sorted(s.flags)) if s.flags else "",
            ]
        )
    return dumps(rows)


def planned_exceptions(
    exceptions: Iterable[PlannedException],
    message_id: str,
    event_id: int,
    position: int | None,
) -> Iterator[ExceptionRow]:
    """The planner's exceptions of one delivery as rows (kind, message id, details, event id,
    batch position or reception id)."""
    for planned in exceptions:
        yield planned.kind, message_id, json.dumps(planned.details), event_id, position


def printable(value: str) -> str:
    """A form of any Python string that text and jsonb accept (C8 evidence labels)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def replayed(row: asyncpg.Record) -> tuple[Delivery, int, int]:
    """A stored reception as the planner's delivery, with its event id and its reception id
    (late correlation, recompute; 0 for a first delivery rebuilt from its event, P21)."""
    stat = row["stat"]
    delivery = Delivery(
        row["message_id"],
        row["correlation_id"],
        row["level"],
        STAT_TO_STATUS.get(stat, Status.UNRECOGNIZED),
        stat,
        row["err"],
        row["done_at"],
        row["received_at"].timestamp(),
        row["fingerprint"],
        tuple(row["flags"]),
    )
    return delivery, row["event_id"], row["id"] or 0
