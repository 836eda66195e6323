"""The statements of the ingest transaction, the sending side and recompute, by name.

Their text, with the reasons each is written as it is, lives in `dlrfeed/store/sql/`
(`ingest.sql`, `submissions.sql`, `recompute.sql`, `server.sql`); each constant here is the loaded
statement, bound by parameter name (`dlrfeed.store.sql.Query`). Each statement takes whole
arrays (`unnest`, or one JSON array) so that a batch costs a handful of round trips, never one
per receipt (DESIGN "the ingest transaction").
"""

from __future__ import annotations

from typing import NamedTuple

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
WAITING_RECEPTIONS = query("waiting_receptions")
LOCK_OPEN_UNCORRELATED = query("lock_open_uncorrelated")
COMMIT_WITHOUT_FLUSH_WAIT = query("commit_without_flush_wait")
STALE_STATUSES = query("stale_statuses")
LOCK_STATUSES = query("lock_statuses")
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
# A store before migration 0019, met only by tests that migrate an old store (the services
# refuse a schema behind the code): statuses written to the table dlr.message_status, each
# reason as text.
STATUS_WRITES_BY_TEXT = StatusWrites(
    *(query(q.name, upsert_statuses="upsert_statuses_by_text") for q in STATUS_WRITES)
)
STATUS_REASONS_BY_ID_VERSION = 19
# The table the status writes write since that migration, behind the view dlr.message_status.
STATUS_ROWS_TABLE = "message_status_rows"

# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment (migration 0006). write_batch takes it as its :id_block_size.
RECEPTION_ID_BLOCK = 1000

# P6/P13: every delivery of the batch is appended to this table by binary COPY, with ids from
# the blocks that insert_events_read_statuses drew; the rows are encoded by
# dlrfeed.store.copy_rows (its COLUMNS). `payload` is the evidence, whole; the view
# dlr.receptions_readable shows it as JSON.
RECEPTIONS_TABLE = "receptions"
RECEPTIONS_SCHEMA = "dlr"
