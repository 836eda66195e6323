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
INSERT_EVENTS_READ_STATUSES = query("insert_events_read_statuses")
LOCK_EXISTING_EVENTS = query("lock_existing_events")
OPEN_UNSTORABLE = query("open_unstorable")
RECORD_UNSTORABLE_REDELIVERY = query("record_unstorable_redelivery")
INSERT_MESSAGES = query("insert_messages")
RECORDED_MESSAGES = query("recorded_messages")
OPEN_SECOND_RECORDS = query("open_second_records")
IDS_WITH_WAITING_EVENTS = query("ids_with_waiting_events")
LOCK_OPEN_UNCORRELATED = query("lock_open_uncorrelated")
COMMIT_WITHOUT_FLUSH_WAIT = query("commit_without_flush_wait")
STALE_STATUSES = query("stale_statuses")
STATUSES_BEFORE_RECOMPUTE = query("statuses_before_recompute")
RECORD_RECOMPUTE_AUDIT = query("record_recompute_audit")
PLAN_WITHOUT_JIT = query("plan_without_jit")


class StatusWrites(NamedTuple):
    """The statements that write statuses (each includes the status upsert), as one schema
    takes them."""

    batch: Query
    late_correlation: Query
    recompute: Query


STATUS_WRITES = StatusWrites(
    query("write_batch"), query("write_late_correlation"), query("write_recompute")
)
# The status upsert each older schema takes, by the first migration that changed it (only tests
# that migrate an old store meet one: the services refuse a schema behind the code).
_EARLIER_UPSERTS = (
    # Before 0019: into the table dlr.message_status, each reason as text.
    (19, "upsert_statuses_by_text"),
    # 0019: into dlr.message_status_rows, keyed by login and gateway id.
    (20, "upsert_statuses_by_key"),
)
_NO_EARLIER = {"upsert_earlier_statuses": "no_earlier_statuses"}
_EARLIER_STATUS_WRITES = {
    upsert: StatusWrites(
        *(query(q.name, upsert_statuses=upsert, **_NO_EARLIER) for q in STATUS_WRITES)
    )
    for _, upsert in _EARLIER_UPSERTS
}
# A store created at 0020 or later keeps no status in dlr.earlier_statuses.
_STATUS_WRITES_BY_MESSAGE = StatusWrites(*(query(q.name, **_NO_EARLIER) for q in STATUS_WRITES))

# Since this migration each status is kept under its message row's id (dlr.statuses), behind
# the view dlr.message_status with those recorded before it (dlr.earlier_statuses).
STATUSES_BY_MESSAGE_VERSION = 20
# Whether the store may keep statuses in dlr.earlier_statuses: messages were recorded before it
# was migrated to 0020.
HAS_EARLIER_STATUSES = query("has_earlier_statuses")
STATUSES_TABLE = "statuses"
EARLIER_STATUSES_TABLE = "earlier_statuses"


def status_writes(version: int | None, *, earlier_statuses: bool = True) -> StatusWrites:
    """The status writes of a store at schema `version` (None: a schema as new as the code);
    `earlier_statuses`: whether it may keep statuses in dlr.earlier_statuses (it was migrated
    to 0020 with messages recorded)."""
    for before, upsert in _EARLIER_UPSERTS:
        if version is not None and version < before:
            return _EARLIER_STATUS_WRITES[upsert]
    return STATUS_WRITES if earlier_statuses else _STATUS_WRITES_BY_MESSAGE


# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment (migration 0006). write_batch takes it as its :id_block_size.
RECEPTION_ID_BLOCK = 1000

# From this schema on a reception leaves its event's content to it (0016_leaner_rows).
LEAN_ROWS_VERSION = 16
# Since this migration a reception names its event's login, message id and level by its
# event: the table is dlr.reception_rows, behind the view dlr.receptions.
RECEPTION_KEY_FROM_EVENT_VERSION = 21
# From this schema on an event's last reception time is NULL while it is its first
# (0023_last_reception_once).
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
    encodes them): only before migration 0021."""
    waiting: Query
    """waiting_receptions on that table."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The COPY's columns, in the order dlrfeed.store.copy_rows encodes them."""
        return copy_rows.COLUMNS_WITH_KEY if self.with_key else copy_rows.COLUMNS


_WAITING_RECEPTIONS = query("waiting_receptions")
RECEPTION_STATEMENTS = ReceptionStatements(
    "reception_rows", False, _WAITING_RECEPTIONS.naming(receptions="reception_rows")
)
_EARLIER_RECEPTION_STATEMENTS = ReceptionStatements(
    "receptions", True, _WAITING_RECEPTIONS.naming(receptions="receptions")
)


def reception_statements(version: int | None) -> ReceptionStatements:
    """The reception statements of a store at schema `version` (None: as new as the code)."""
    if version is not None and version < RECEPTION_KEY_FROM_EVENT_VERSION:
        return _EARLIER_RECEPTION_STATEMENTS
    return RECEPTION_STATEMENTS
