"""The statements of the ingest transaction, the sending side and recompute, by name.

Their text, with the reasons each is written as it is, lives in `dlrfeed/store/sql/`
(`ingest.sql`, `submissions.sql`, `recompute.sql`, `server.sql`); each constant here is the loaded
statement, bound by parameter name (`dlrfeed.store.sql.Query`). Each statement takes whole
arrays (`unnest`, or one JSON array) so that a batch costs a handful of round trips, never one
per receipt (DESIGN "the ingest transaction").
"""

from __future__ import annotations

from typing import NamedTuple

from dlrfeed.store import copy_rows
from dlrfeed.store.sql import Query, query

LOCK_MESSAGES = query("lock_messages")
LOCK_CORRELATION_IDS = query("lock_correlation_ids")
OPEN_UNSTORABLE = query("open_unstorable")
RECORD_UNSTORABLE_REDELIVERY = query("record_unstorable_redelivery")
INSERT_MESSAGES = query("insert_messages")
RECORDED_MESSAGES = query("recorded_messages")
OPEN_SECOND_RECORDS = query("open_second_records")
LOCK_OPEN_UNCORRELATED = query("lock_open_uncorrelated")
COMMIT_WITHOUT_FLUSH_WAIT = query("commit_without_flush_wait")
STALE_STATUSES = query("stale_statuses")
STATUSES_BEFORE_RECOMPUTE = query("statuses_before_recompute")
RECORD_RECOMPUTE_AUDIT = query("record_recompute_audit")
COUNT_STALE_STATUSES = query("count_stale_statuses")
MARK_STATUSES_CURRENT = query("mark_statuses_current")
WRITE_EVENT_CONTENTS = query("write_event_contents")
CONFLICTS_OF_EVENTS = query("conflicts_of_events")
WRITE_CONFLICTS = query("write_conflicts")
PLAN_AS_PROBES = query("plan_as_probes")


class StatusWrites(NamedTuple):
    """The statements that write statuses (each includes the status upsert), as one schema
    takes them."""

    batch: Query
    late_correlation: Query
    recompute: Query


STATUS_WRITES = StatusWrites(
    query("write_batch"), query("write_late_correlation"), query("write_recompute")
)
# The status upsert of an older schema, by the first version that no longer takes it (only
# tests that migrate an old store meet one: the services refuse a schema behind the code).
_EARLIER_UPSERTS = (
    # Schema version < 19: into dlr.message_status, each reason as text.
    (19, "upsert_statuses_by_text"),
    # Schema version 19: into dlr.message_status_rows, keyed by login and gateway id.
    (20, "upsert_statuses_by_key"),
)
_NO_EARLIER = {"upsert_earlier_statuses": "no_earlier_statuses"}

# From this schema version each status is kept under its message row's id (dlr.statuses),
# behind the view dlr.message_status with those recorded before (dlr.earlier_statuses).
STATUSES_BY_MESSAGE_VERSION = 20
# Whether the store may keep statuses in dlr.earlier_statuses: it had recorded messages when it
# reached STATUSES_BY_MESSAGE_VERSION.
HAS_EARLIER_STATUSES = query("has_earlier_statuses")
STATUSES_TABLE = "statuses"
EARLIER_STATUSES_TABLE = "earlier_statuses"
# From this schema version the events of a message recorded since are kept under its row's id
# (dlr.message_events), the others in dlr.event_rows, behind the view dlr.events.
EVENTS_BY_MESSAGE_VERSION = 24


def status_writes(version: int | None, *, earlier_statuses: bool = True) -> StatusWrites:
    """The status writes of a store at schema `version` (None: a schema as new as the code);
    `earlier_statuses`: whether it may keep statuses in dlr.earlier_statuses (it had recorded
    messages when it reached STATUSES_BY_MESSAGE_VERSION)."""
    instead: dict[str, str] = {}
    earlier = [u for before, u in _EARLIER_UPSERTS if version is not None and version < before]
    if earlier:
        instead = {"upsert_statuses": earlier[0], **_NO_EARLIER}
    elif not earlier_statuses:
        instead = dict(_NO_EARLIER)
    if version is not None and version < EVENTS_BY_MESSAGE_VERSION:
        instead["count_deliveries"] = "count_deliveries_by_key"
        instead["event_contents_seen"] = "no_contents_seen"
    if not instead:
        return STATUS_WRITES
    return StatusWrites(*(query(q.name, **instead) for q in STATUS_WRITES))


class EventStatements(NamedTuple):
    """The ingest's statements that write events, as one schema takes them."""

    insert: Query
    """insert_events_read_statuses."""
    lock_existing: Query
    """lock_existing_events."""
    by_message: bool
    """Whether the events of a recorded message are kept under its row's id (not at schema
    version < 24): the writers then lock the message of each event's own id too, and pass its
    row's id."""


EVENT_STATEMENTS = EventStatements(
    query("insert_events_read_statuses"), query("lock_existing_events"), True
)
_EARLIER_EVENT_STATEMENTS = EventStatements(
    query(
        "insert_events_read_statuses",
        insert_events="insert_events_by_key",
        earlier_events="earlier_events_by_key",
    ),
    query("lock_existing_events_by_key"),
    False,
)


def event_statements(version: int | None) -> EventStatements:
    """The event statements of a store at schema `version` (None: as new as the code)."""
    if version is not None and version < EVENTS_BY_MESSAGE_VERSION:
        return _EARLIER_EVENT_STATEMENTS
    return EVENT_STATEMENTS


# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment. write_batch takes it as its :id_block_size.
RECEPTION_ID_BLOCK = 1000

# From this schema version a reception leaves its event's content to it.
LEAN_ROWS_VERSION = 16
# From this schema version a reception names its event's login, message id and level by its
# event: the table is dlr.reception_rows, behind the view dlr.receptions.
RECEPTION_KEY_FROM_EVENT_VERSION = 21
# From this schema version an event's last reception time is NULL while it is its first.
LAST_RECEPTION_ONCE_VERSION = 23
RECEPTIONS_SCHEMA = "dlr"


class ReceptionStatements(NamedTuple):
    """Where a batch's receptions go and how late correlation reads them back, as one schema
    takes them."""

    table: str
    """P6/P13: every delivery of the batch is appended to it by binary COPY, with ids from the
    blocks that insert_events_read_statuses drew; `payload` is the evidence, whole (the view
    dlr.receptions_readable shows it as JSON)."""
    with_key: bool
    """Whether each row holds its login, message id and level (dlrfeed.store.copy_rows
    encodes them): only at schema version < 21."""
    waiting: Query
    """waiting_receptions on that table."""
    waiting_ids: Query
    """ids_with_waiting_events."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The COPY's columns, in the order dlrfeed.store.copy_rows encodes them."""
        return copy_rows.COLUMNS_WITH_KEY if self.with_key else copy_rows.COLUMNS


_WAITING_RECEPTIONS = query("waiting_receptions")
# Schema version < 24: every event is in the table dlr.events.
_WAITING_BY_KEY = query("waiting_receptions", waiting_events="waiting_events_by_key")
_WAITING_IDS = query("ids_with_waiting_events")
_WAITING_IDS_BY_KEY = query(
    "ids_with_waiting_events", correlated_from_other_ids="correlated_from_other_ids_by_key"
)
RECEPTION_STATEMENTS = ReceptionStatements(
    "reception_rows",
    False,
    _WAITING_RECEPTIONS.naming(receptions="reception_rows"),
    _WAITING_IDS,
)
_RECEPTION_STATEMENTS_BY_KEY = ReceptionStatements(
    "reception_rows",
    False,
    _WAITING_BY_KEY.naming(receptions="reception_rows"),
    _WAITING_IDS_BY_KEY,
)
_EARLIER_RECEPTION_STATEMENTS = ReceptionStatements(
    "receptions", True, _WAITING_BY_KEY.naming(receptions="receptions"), _WAITING_IDS_BY_KEY
)


def reception_statements(version: int | None) -> ReceptionStatements:
    """The reception statements of a store at schema `version` (None: as new as the code)."""
    if version is not None and version < RECEPTION_KEY_FROM_EVENT_VERSION:
        return _EARLIER_RECEPTION_STATEMENTS
    if version is not None and version < EVENTS_BY_MESSAGE_VERSION:
        return _RECEPTION_STATEMENTS_BY_KEY
    return RECEPTION_STATEMENTS


class SchemaWrites(NamedTuple):
    """How the Store writes to a store at one schema version: as the code's schema, or as an
    older one's (met only by tests that migrate an old store: the services refuse a schema
    behind the code)."""

    statuses: StatusWrites
    """By reason id and message row, or as an older schema kept them (version < 20)."""
    receptions: ReceptionStatements
    """Where receptions go and are read from (dlr.receptions at schema version < 21)."""
    events: EventStatements
    """Where events go (all by key at schema version < 24)."""
    full_rows: bool = False
    """Rows written whole (schema version < 16)."""
    last_reception_written: bool = False
    """An event's last reception time written when it is its first (schema version < 23)."""

    def insert_arguments(self, own_refs: dict[str, int]) -> dict[str, object]:
        """The arguments of `events.insert` this schema takes besides the batch's: the row id
        of each message named by an event's own id (`own_refs`), or, at schema version < 24,
        how rows are written."""
        if self.events.by_message:
            return {"own_ids": list(own_refs), "own_refs": list(own_refs.values())}
        return {"full_rows": self.full_rows, "last_reception_written": self.last_reception_written}

    def lock_arguments(self, refs: list[int | None]) -> dict[str, object]:
        """The arguments of `events.lock_existing` this schema takes besides the keys': the row
        id of the message named by each key's own id (None: not found); none at version < 24."""
        return {"refs": refs} if self.events.by_message else {}


SCHEMA_WRITES = SchemaWrites(STATUS_WRITES, RECEPTION_STATEMENTS, EVENT_STATEMENTS)


def schema_writes(version: int | None, *, earlier_statuses: bool) -> SchemaWrites:
    """The writes of a store at schema `version` (None: as new as the code); see
    `status_writes` for `earlier_statuses`."""
    return SchemaWrites(
        status_writes(version, earlier_statuses=earlier_statuses),
        reception_statements(version),
        event_statements(version),
        full_rows=version is not None and version < LEAN_ROWS_VERSION,
        last_reception_written=version is not None and version < LAST_RECEPTION_ONCE_VERSION,
    )
