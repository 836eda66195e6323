-- The status-change log (dlrfeed.store.changes). Readers see only positions below the horizon
-- of the oldest running transaction (the proof of why: the schema, on dlr.status_change_rows).

-- name: read_changes
-- The next :limit changes after :after that are exposed: one index range scan of the primary
-- key, (position, changed_at).
SELECT position, login, message_id, status, is_final, reason, previous_status,
       previous_is_final, previous_reason, supporting_event_id, rules_version, changed_at
FROM dlr.status_changes
WHERE position > :after
  AND position < pg_snapshot_xmin(pg_current_snapshot())::text::numeric * 1e19
ORDER BY position
LIMIT :limit

-- name: changes_held_back
-- Committed changes after :after not yet exposed (an older transaction still runs): worth a
-- quick second look rather than the full idle wait.
SELECT EXISTS (
    SELECT 1 FROM dlr.status_changes
    WHERE position > :after
      AND position >= pg_snapshot_xmin(pg_current_snapshot())::text::numeric * 1e19)

-- name: backlog
-- Everything committed after :after, exposed or not: what a consumer still has to handle.
-- Bounded so that a relay refreshing its gauges every second never scans a huge backlog: the
-- count stops at :count_cap, and the oldest is the first by position (one index probe; the
-- writing transactions' times follow their ids closely).
SELECT (SELECT count(*) FROM (SELECT 1 FROM dlr.status_changes WHERE position > :after
                              LIMIT :count_cap) AS capped) AS pending,
       (SELECT changed_at FROM dlr.status_changes WHERE position > :after
        ORDER BY position LIMIT 1) AS oldest

-- name: load_cursor
-- The last position a durable consumer handled (no row: a new consumer).
SELECT position FROM dlr.change_cursors WHERE consumer = :consumer

-- name: save_cursor
-- A cursor only moves forward: a consumer restarted with an old --after cannot rewind another
-- instance's progress by accident.
INSERT INTO dlr.change_cursors AS c (consumer, position) VALUES (:consumer, :position)
ON CONFLICT (consumer) DO UPDATE
    SET position = greatest(c.position, EXCLUDED.position), updated_at = now()

-- name: create_cursor
-- The consumer's row, created at 0 when new, so that lock_cursor always has a row to lock.
INSERT INTO dlr.change_cursors (consumer) VALUES (:consumer) ON CONFLICT (consumer) DO NOTHING

-- name: lock_cursor
-- Locks the consumer's row so that two instances of one consumer take turns: each batch is
-- handled by exactly one of them.
SELECT position FROM dlr.change_cursors WHERE consumer = :consumer FOR UPDATE

-- name: notify_probe
-- Sent from a second connection to find out whether notifications reach the follower's
-- session (not through a transaction pooler).
SELECT pg_notify(:channel, '')
