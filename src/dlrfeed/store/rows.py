"""Rows to domain values and back: the planner's state from a status row, a stored reception
as the planner's delivery, and the JSON and array parameters of the set-based statements of
`sql/ingest.sql`, `sql/submissions.sql` and `sql/recompute.sql` (see `queries`), and the
printable form of the labels an unstorable receipt is kept under (C8).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from dlrfeed.domain.parse import PARSER_VERSION, LogicalEvent, fingerprint
from dlrfeed.domain.rules import (
    Basis,
    Delivery,
    MessageState,
    PlannedException,
    explain,
    is_final,
)
from dlrfeed.domain.status import STAT_TO_STATUS, Status
from dlrfeed.store import queries

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    # asyncpg's classes are generic only in its stubs.
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]

_MISSING = "\x00missing"  # a dict.get default that no storable value equals (no NUL)


def state_from_row(row: asyncpg.Record) -> MessageState:
    """The planner's state of a message from its status row (and, with no row, the counters of
    its earlier events that the rules never applied)."""
    if row["status"] is None:
        return MessageState(None, row["orphan_repeats"], row["orphan_conflicts"])
    basis = Basis(
        row["supporting_event_id"],
        row["supporting_reception_id"] or 0,
        row["basis_level"],
        Status(row["status"]),
        row["basis_stat"],
        row["basis_err"],
        row["basis_done_at"],
    )
    return MessageState(
        basis,
        row["repeats"],
        row["conflicts"],
        row["progress_events"],
        row["deadline_superseded"],
        frozenset(row["status_flags"]),
    )


dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""JSON text, compact and not ASCII-escaped: the JSON parameters of the statements."""


def column_arrays(rows: Sequence[Sequence[Any]], count: int) -> list[list[Any]]:
    """The first `count` columns of `rows` as arrays: a set-based statement's parameters."""
    return [[row[column] for row in rows] for column in range(count)]


def reception_ids_in_blocks(blocks: list[int], count: int) -> Iterator[int]:
    """The ids of a batch's `count` receptions in batch order, numbered inside the id blocks
    queries.INSERT_EVENTS_READ_STATUSES drew (RECEPTION_ID_BLOCK consecutive ids from each)."""
    size = queries.RECEPTION_ID_BLOCK
    return itertools.islice(
        itertools.chain.from_iterable(range(f, f + size) for f in blocks), count
    )


def status_json(statuses: Mapping[str, MessageState], refs: Mapping[str, int]) -> str:
    """The :statuses rows of the upsert_statuses fragment (sql/ingest.sql) for the states
    that have a basis; `refs`, each message's row id."""
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
                key,
                basis.status,  # StrEnum: JSON-encoded as its value
                is_final(s),
                explain(s),
                basis.event_id,
                s.repeats,
                s.conflicts,
                s.progress_events,
                s.deadline_superseded,
                basis.reception_id or None,  # 0: its reception retired (P21)
                basis.level,
                basis.stat,
                basis.err,
                done,
                " ".join(sorted(s.flags)) if s.flags else "",
                refs.get(key),
            ]
        )
    return dumps(rows)


def planned_exceptions(
    exceptions: Iterable[PlannedException],
    message_id: str,
    event_id: int,
    position: int | None,
) -> Iterator[tuple[str, str, str, int | None, int | None]]:
    """The planner's exceptions of one delivery as rows (kind, message id, details, event id,
    batch position or reception id)."""
    for planned in exceptions:
        yield planned.kind, message_id, json.dumps(planned.details), event_id, position


def printable(value: str) -> str:
    """A form of any Python string that text and jsonb accept (C8 evidence labels)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def first_events(events: list[LogicalEvent]) -> tuple[list[LogicalEvent], str]:
    """P14: the first delivery of each key in the batch, in arrival order, and their insert rows.

    Returns (those events, the JSON parameter of queries.INSERT_EVENTS_READ_STATUSES).
    Arrival order, not key order: event ids then follow the order the batch's receipts arrived
    in (the locks serialise the events of one id, so key order buys no deadlock safety here).
    """
    first_of_key: dict[tuple[str, int], int] = {}
    for position, event in enumerate(events):
        first_of_key.setdefault((event.message_id, event.level), position)
    firsts = [events[p] for p in first_of_key.values()]
    done_at: dict[str | None, str | None] = {None: None}  # many receipts share a done date
    rows = []
    for e in firsts:
        done_iso = done_at.get(e.done_date_raw, _MISSING)
        if done_iso is _MISSING:
            done_iso = done_at[e.done_date_raw] = (
                None if e.done_at is None else e.done_at.isoformat()
            )
        rows.append(
            [
                e.message_id,
                None if e.correlation_id == e.message_id else e.correlation_id,
                e.level,
                e.stat,
                e.status,  # StrEnum: JSON-encoded as its value
                e.err,
                e.done_date_raw,
                done_iso,
                e.fingerprint,
                " ".join(e.flags),
                int(e.received_at * 1_000_000),
            ]
        )
    return firsts, dumps(rows)


Content: TypeAlias = tuple[str, tuple[str, ...]]
"""What tells whether a delivery's parsed content is its event's: its fingerprint and flags.
Within one process (one parser, one set of options) equal fingerprints mean equal raw stat, err
and done date, hence equal stored stat, err, done_date_raw and done_at; the flags also say
what the rest of the receipt needed (a cut, an escape, an odd submit date)."""


def event_contents(
    firsts: Iterable[LogicalEvent],
    inserted: Mapping[tuple[str, int], int],
    stored: Iterable[asyncpg.Record],
) -> dict[int, Content | None]:
    """Each event's first content, by event id, as the batch's deliveries are compared with it
    (a reception of that content leaves it to its event): the events inserted now were written
    from their first delivery here; an event stored before counts only if its row holds exactly
    what this process writes for the batch's first delivery of it (another parser version or
    other options may have written it otherwise: None, and its deliveries keep their own
    content)."""
    contents: dict[int, Content | None] = {}
    first_of: dict[tuple[str, int], LogicalEvent] = {}
    for e in firsts:
        event_id = inserted.get((e.message_id, e.level))
        if event_id is None:
            first_of[(e.message_id, e.level)] = e
        else:
            contents[event_id] = (e.fingerprint, e.flags)
    for r in stored:
        e = first_of[(r["message_id"], r["level"])]
        same = r["parser_version"] == PARSER_VERSION and (
            r["stat"],
            r["err"],
            r["done_date_raw"],
            r["done_at"],
            r["fingerprint"],
            tuple(r["flags"]),
        ) == (e.stat, e.err, e.done_date_raw, e.done_at, e.fingerprint, e.flags)
        # An aware datetime equals another of any zone at the same instant (a DST-ambiguous
        # one compares unequal across zones: the row then keeps its own, never wrongly none).
        contents[r["id"]] = (r["fingerprint"], tuple(r["flags"])) if same else None
    return contents


def replayed(row: asyncpg.Record) -> tuple[Delivery, int, int]:
    """A stored reception as the planner's delivery, with its event id and its reception id
    (late correlation, recompute; 0 for a first delivery rebuilt from its event, P21)."""
    stat = row["stat"]
    err = row["err"]
    done_raw = row["done_date_raw"]
    # A reception an older schema stored may have no fingerprint: derived from the stored
    # values, which equal the raw ones unless a field had to be cut or NUL-escaped.
    content = row["fingerprint"] or fingerprint(stat, err, done_raw)
    delivery = Delivery(
        row["message_id"],
        row["correlation_id"],
        row["level"],
        STAT_TO_STATUS.get(stat, Status.UNRECOGNIZED),
        stat,
        err,
        row["done_at"],
        row["received_at"].timestamp(),
        content,
        tuple(row["flags"]),
    )
    return delivery, row["event_id"], row["id"] or 0
