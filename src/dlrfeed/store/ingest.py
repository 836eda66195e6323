"""The ingest transaction (`sql/ingest.sql`): one batch of one login's receipts, in the write
transaction of the caller (`Store.ingest`, which retries, bisects and translates the driver's
errors), stored in the steps `ingest_batch` runs, each a method of `_Batch` in that order.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlrfeed.domain.parse import PARSER_VERSION, LogicalEvent
from dlrfeed.domain.rules import Basis, KeyContents, MessageState, Planner
from dlrfeed.domain.status import Outcome, Status
from dlrfeed.store import copy_rows
from dlrfeed.store.correlation import Correlated, correlate, ids_to_lock
from dlrfeed.store.rows import (
    ExceptionRow,
    column_arrays,
    dumps,
    planned_exceptions,
    status_json,
)
from dlrfeed.store.sql import query
from dlrfeed.store.transactions import overlapped

if TYPE_CHECKING:
    import asyncpg

    from dlrfeed.domain.options import IntegrationOptions
    from dlrfeed.store.rows import Connection

INSERT_EVENTS_READ_STATUSES = query("insert_events_read_statuses")
LOCK_EXISTING_EVENTS = query("lock_existing_events")
WRITE_BATCH = query("write_batch")
# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment. write_batch takes it as its :id_block_size.
RECEPTION_ID_BLOCK = 1000
# Receptions per COPY piece: the server inserts a piece while the client plans the next one.
_COPY_PIECE = 100
_MISSING = "\x00missing"  # a dict.get default that no storable value equals (no NUL)

Key = tuple[str, int]
"""A logical event's key in its login: the gateway message id and the level (P14)."""
Content = tuple[str, tuple[str, ...]]
"""A delivery's parsed content as compared with its event's: fingerprint and flags (in one
process equal fingerprints mean equal stat, err and done date; the flags say what the rest of
the receipt needed)."""


async def ingest_batch(
    conn: Connection,
    login: str,
    events: list[LogicalEvent],
    options: IntegrationOptions,
    rules_version: str,
) -> list[Outcome]:
    """Store `events`, one batch of `login`'s, in the caller's transaction: the outcome of each
    delivery, in batch order."""
    batch = _Batch(conn, login, events, options, rules_version)
    await batch.lock_messages()
    await batch.insert_events()
    await batch.lock_stored_events()
    await batch.copy_receptions()
    await batch.write_outcome()
    return batch.outcomes


@dataclass(slots=True)
class _Batch:
    """One batch through the ingest transaction: what each step learns, for the next."""

    conn: Connection
    login: str
    events: list[LogicalEvent]
    options: IntegrationOptions
    rules_version: str
    # lock_messages
    correlated: Correlated = field(default_factory=lambda: Correlated({}, {}))
    firsts: list[LogicalEvent] = field(default_factory=list)
    """P14: the first delivery of each key in the batch, in arrival order."""
    event_rows: str = ""
    """The :events of insert_events_read_statuses: a row of each of `firsts`."""
    # insert_events
    receipt_fields: list[bytes] = field(default_factory=list)
    inserted: dict[Key, int] = field(default_factory=dict)
    held: dict[str, MessageState] = field(default_factory=dict)
    id_blocks: list[int] = field(default_factory=list)
    by_message: set[int] = field(default_factory=set)
    """The events kept under their message's row (dlr.message_events), not by key."""
    # lock_stored_events
    stored: dict[Key, int] = field(default_factory=dict)
    stored_rows: list[asyncpg.Record] = field(default_factory=list)
    key_contents: dict[Key, KeyContents] = field(default_factory=dict)
    # copy_receptions and plan_piece
    planner: Planner = field(init=False)
    event_ids: list[int] = field(default_factory=list)
    """Each delivery's event, in batch order."""
    reception_ids: list[int] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    exceptions: list[ExceptionRow] = field(default_factory=list)

    async def lock_messages(self) -> None:
        """P10: correlation and the message locks first (sorted); meanwhile the client
        prepares the events insert (it depends on the receipts alone)."""
        self.correlated, (self.firsts, self.event_rows) = await overlapped(
            correlate(self.conn, self.login, ids_to_lock(self.events)),
            lambda: first_events(self.events),
        )

    async def insert_events(self) -> None:
        """P14: insert-or-detect of the batch's events, the held statuses and the batch's
        reception id blocks, in one statement, while the client encodes the receptions."""
        events, correlated = self.events, self.correlated
        found = correlated.of(sorted({e.correlation_id for e in events}))
        own_refs = correlated.of(e.message_id for e in self.firsts)
        rows, self.receipt_fields = await overlapped(
            INSERT_EVENTS_READ_STATUSES.fetch(
                self.conn,
                login=self.login,
                parser_version=PARSER_VERSION,
                rules_version=self.rules_version,
                events=self.event_rows,
                own_ids=list(own_refs),
                own_refs=list(own_refs.values()),
                correlated=list(found),
                correlated_refs=list(found.values()),
                id_blocks=-(-len(events) // RECEPTION_ID_BLOCK),  # the ceiling
            ),
            lambda: copy_rows.encode_receipt_fields(events),
        )
        for row in rows:
            part = row["part"]
            if part == "event":
                self.inserted[(row["message_id"], row["level"])] = row["id"]
                if row["by_message"]:
                    self.by_message.add(row["id"])
            elif part == "held":
                self.held[row["message_id"]] = state_from_row(row)
            else:  # "ids"
                self.id_blocks.append(row["id"])

    async def lock_stored_events(self) -> None:
        """The keys the batch repeats: their event rows locked, with what they hold (P14)."""
        existing = [e for e in self.firsts if (e.message_id, e.level) not in self.inserted]
        if not existing:
            return
        refs = self.correlated.refs
        self.stored_rows = await LOCK_EXISTING_EVENTS.fetch(
            self.conn,
            login=self.login,
            message_ids=[e.message_id for e in existing],
            levels=[e.level for e in existing],
            refs=[refs.get(e.message_id) for e in existing],
        )
        for r in self.stored_rows:
            key = (r["message_id"], r["level"])
            self.stored[key] = r["id"]
            if r["by_message"]:
                self.by_message.add(r["id"])
            self.key_contents[key] = KeyContents(
                Status(r["status"]),
                (r["fingerprint"], *r["updates"]),
                tuple(map(Status, r["later_results"])),
                tuple(r["conflicting_contents"]),
            )

    async def copy_receptions(self) -> None:
        """P6/P13: every delivery of the batch appended by binary COPY (far less work and WAL
        than INSERT ... SELECT), each piece planned (`plan_piece`) just before it is sent."""
        events, inserted, stored = self.events, self.inserted, self.stored
        self.planner = Planner(
            self.options, self.key_contents, dict(self.held), self.correlated.submitted
        )
        self.reception_ids = list(reception_ids_in_blocks(self.id_blocks, len(events)))
        self.event_ids = [
            inserted.get((e.message_id, e.level)) or stored[(e.message_id, e.level)] for e in events
        ]
        # A delivery whose parsed content is its event's leaves it to the event.
        contents = copy_rows.contents(
            events, self.event_ids, event_contents(self.firsts, inserted, self.stored_rows)
        )

        def planned(start: int) -> bytes:
            piece = slice(start, min(start + _COPY_PIECE, len(events)))
            self.plan_piece(piece)
            return copy_rows.complete(
                self.receipt_fields[piece],
                contents[piece],
                self.reception_ids[piece],
                self.outcomes[piece],
                self.event_ids[piece],
            )

        async def pipelined() -> AsyncIterator[bytes]:
            yield copy_rows.SIGNATURE
            for start in range(0, len(events), _COPY_PIECE):
                yield planned(start)
            yield copy_rows.TRAILER

        # A single piece goes as one buffer (a memoryview: asyncpg takes bytes for a path): it
        # has nothing to overlap, and asyncpg reads an async source under the statement's
        # timeout, a task for each chunk.
        source: memoryview | AsyncIterator[bytes] = (
            memoryview(copy_rows.SIGNATURE + planned(0) + copy_rows.TRAILER)
            if len(events) <= _COPY_PIECE
            else pipelined()
        )
        await self.conn.copy_to_table(
            copy_rows.TABLE,
            schema_name=copy_rows.SCHEMA,
            columns=copy_rows.COLUMNS,
            source=source,  # type: ignore[arg-type]  # any buffer, says asyncpg; not its stubs
            format="binary",
        )

    def plan_piece(self, piece: slice) -> None:
        """The planner's outcome of each delivery of `piece` and the exceptions it opens, joined
        to their reception by batch position (1-based)."""
        events, event_ids, reception_ids = self.events, self.event_ids, self.reception_ids
        decide, outcomes, exceptions = self.planner.decide, self.outcomes, self.exceptions
        for position in range(piece.start, piece.stop):
            e, event_id = events[position], event_ids[position]
            outcome, planned = decide(e, event_id, reception_ids[position])
            if planned:
                exceptions.extend(planned_exceptions(planned, e.message_id, event_id, position + 1))
            outcomes.append(outcome)

    async def write_outcome(self) -> None:
        """What the plan made besides the receptions, in one statement (write_batch)."""
        await WRITE_BATCH.execute(
            self.conn,
            login=self.login,
            rules_version=self.rules_version,
            id_blocks=self.id_blocks,
            id_block_size=RECEPTION_ID_BLOCK,
            **self.opened_exceptions(),
            statuses=self.changed_statuses(),
            **self.event_counters(),
        )

    def opened_exceptions(self) -> dict[str, list[Any]]:
        """The exceptions the planner opened, as write_batch's arrays."""
        kinds, message_ids, details, event_ids, positions = column_arrays(self.exceptions, 5)
        return {
            "exception_kinds": kinds,
            "exception_message_ids": message_ids,
            "exception_details": details,
            "exception_event_ids": event_ids,
            "exception_positions": positions,
        }

    def changed_statuses(self) -> str:
        """P7: the statuses the batch changed (the planner replaces a state it changes)."""
        held = self.held
        changed = {k: v for k, v in self.planner.messages.items() if held.get(k) is not v}
        return status_json(changed, self.correlated.refs)

    def event_counters(self) -> dict[str, list[Any]]:
        """P14: each event's counters and accepted contents, as write_batch's arrays."""
        planner = self.planner
        counted = list(planner.event_last)
        return {
            "event_ids": counted,
            "event_accepted": [planner.event_accepted.get(i, 0) for i in counted],
            "event_conflicts": [planner.event_conflicts.get(i, 0) for i in counted],
            "event_received_at": [planner.event_last[i] for i in counted],
            "event_updates": [" ".join(planner.key_updates.get(i, ())) for i in counted],
            "event_by_message": [i in self.by_message for i in counted],
            "event_results": [" ".join(planner.key_results.get(i, ())) for i in counted],
            "event_conflicting": [" ".join(planner.key_conflicting.get(i, ())) for i in counted],
        }


def first_events(events: list[LogicalEvent]) -> tuple[list[LogicalEvent], str]:
    """P14: the first delivery of each key in the batch, in arrival order (so event ids follow
    arrival; the message locks already serialise the events of one id), and their rows as the
    :events of insert_events_read_statuses: each an array of the fields `keyed` names, not an
    object or a named tuple, which the JSON encoder spells out or copies (~5 % of the ingest's
    client CPU)."""
    first_of_key: dict[Key, LogicalEvent] = {}
    for event in events:
        first_of_key.setdefault((event.message_id, event.level), event)
    firsts = list(first_of_key.values())
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
                # NULL where it is the message id (nearly always): the event's own id.
                None if e.correlation_id == e.message_id else e.correlation_id,
                e.level,
                e.stat,
                e.status,  # StrEnum: JSON-encoded as its value
                e.err,
                e.done_date_raw,
                done_iso,  # done_at
                e.fingerprint,
                " ".join(e.flags),
                # received_at in integer microseconds: a float costs the encoder a Python call.
                int(e.received_at * 1_000_000),
            ]
        )
    return firsts, dumps(rows)


def state_from_row(row: asyncpg.Record) -> MessageState:
    """The planner's state of a message from its held status (and, with no status, the
    counters of its earlier events that the rules never applied)."""
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


def reception_ids_in_blocks(blocks: list[int], count: int) -> Iterator[int]:
    """The ids of a batch's `count` receptions in batch order, numbered inside the id blocks
    insert_events_read_statuses drew (RECEPTION_ID_BLOCK consecutive ids from each)."""
    return itertools.islice(
        itertools.chain.from_iterable(range(f, f + RECEPTION_ID_BLOCK) for f in blocks), count
    )


def event_contents(
    firsts: Iterable[LogicalEvent],
    inserted: Mapping[Key, int],
    stored: Iterable[asyncpg.Record],
) -> dict[int, Content | None]:
    """Each event's first content, by event id, which a reception of that content leaves to its
    event: an event stored before counts only if its row holds exactly what this process writes
    for the batch's first delivery of it (else None: its deliveries keep their own content)."""
    contents: dict[int, Content | None] = {}
    first_of: dict[Key, LogicalEvent] = {}
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
