"""The statements of the ingest transaction, the sending side and recompute, by name.

Their text, with the reasons each is written as it is, lives in `dlrfeed/store/sql/`
(`ingest.sql`, `submissions.sql`, `recompute.sql`, `server.sql`); each constant here is the loaded
statement, bound by parameter name (`dlrfeed.store.sql.Query`). Each statement takes whole
arrays (`unnest`, or one JSON array) so that a batch costs a handful of round trips, never one
per receipt (DESIGN "the ingest transaction").
"""

from __future__ import annotations

from dlrfeed.store.sql import query

LOCK_MESSAGES = query("lock_messages")
LOCK_CORRELATION_IDS = query("lock_correlation_ids")
INSERT_EVENTS_READ_STATUSES = query("insert_events_read_statuses")
LOCK_EXISTING_EVENTS = query("lock_existing_events")
WRITE_BATCH = query("write_batch")
OPEN_UNSTORABLE = query("open_unstorable")
RECORD_UNSTORABLE_REDELIVERY = query("record_unstorable_redelivery")
INSERT_MESSAGES = query("insert_messages")
RECORDED_MESSAGES = query("recorded_messages")
OPEN_SECOND_RECORDS = query("open_second_records")
IDS_WITH_WAITING_EVENTS = query("ids_with_waiting_events")
WAITING_RECEPTIONS = query("waiting_receptions")
LOCK_OPEN_UNCORRELATED = query("lock_open_uncorrelated")
WRITE_LATE_CORRELATION = query("write_late_correlation")
COMMIT_WITHOUT_FLUSH_WAIT = query("commit_without_flush_wait")
STALE_STATUSES = query("stale_statuses")
LOCK_STATUSES = query("lock_statuses")
WRITE_RECOMPUTE = query("write_recompute")
PLAN_WITHOUT_JIT = query("plan_without_jit")

# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment (migration 0006). write_batch takes it as its :id_block_size.
RECEPTION_ID_BLOCK = 1000

# P6/P13: every delivery of the batch is appended to this table by binary COPY, with ids from
# the blocks that insert_events_read_statuses drew; the rows are encoded by
# dlrfeed.store.copy_rows (its COLUMNS). `payload` is the evidence, whole; the view
# dlr.receptions_readable shows it as JSON.
RECEPTIONS_TABLE = "receptions"
RECEPTIONS_SCHEMA = "dlr"
