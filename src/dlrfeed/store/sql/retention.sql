-- Retention by whole days (dlrfeed.store.retention, `dlrfeed maintain`). The day partitions
-- live in schema dlr_partitions; a partition's name is only known at run time, so it is
-- written {partition} and quoted as an identifier by Query.naming.

-- name: set_lock_timeout
-- DDL on a partition needs a moment of ACCESS EXCLUSIVE on its parent: wait at most
-- :lock_timeout, so the daemon's next batches queue behind us only that long. Local to the
-- transaction: through a transaction pooler a session setting would stay on a server
-- connection another client gets next.
SELECT set_config('lock_timeout', :lock_timeout, true)

-- name: create_reception_partitions
-- The partitions of dlr.receptions for every day before :through: the names of those created.
SELECT dlr.create_reception_partitions(:through) AS name

-- name: create_status_change_partitions
-- The partitions of the change log (dlr.status_change_rows) for every day before :through.
SELECT dlr.create_status_change_partitions(:through) AS name

-- name: partitions_to_drop
-- The day partitions of :parent_table whose whole day ended before :cutoff, oldest first.
SELECT partition_name, lower_bound, upper_bound
FROM dlr.day_partitions
WHERE parent_table = :parent_table AND NOT is_default AND upper_bound <= :cutoff
ORDER BY upper_bound

-- name: partitions_oldest_first
-- The partitions of :parent_table, the default partition first (its rows may be of any day),
-- then each day from the oldest (the first one may be unbounded below: lower_bound NULL).
SELECT partition_name, lower_bound
FROM dlr.day_partitions
WHERE parent_table = :parent_table
ORDER BY is_default DESC, lower_bound NULLS FIRST

-- name: table_columns
-- The columns of :table_name in order, for an archive's manifest.
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute AS a
WHERE a.attrelid = :table_name::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- name: lock_change_cursors
-- No durable consumer may start (at 0) while a day of changes is checked and dropped.
LOCK TABLE dlr.change_cursors IN SHARE MODE

-- name: unread_by
-- The consumer furthest behind that has not read every change of a partition (its cursor lies
-- below the partition's last position): dropping the day would take changes it never saw.
-- Run after lock_change_cursors, so no cursor appears meanwhile.
SELECT c.consumer, c.position
FROM dlr.change_cursors AS c
WHERE c.position < (SELECT max(position) FROM dlr_partitions.{partition})
  AND c.consumer <> ALL(:abandoned::text[])
ORDER BY c.position, c.consumer
LIMIT 1

-- name: drop_partition
-- A day of evidence or of changes goes as one DROP, never row by row (P13).
DROP TABLE dlr_partitions.{partition}

-- name: archived_receptions
-- A day of dlr.receptions as its archive holds it: the view's columns, its parsed fields
-- filled in from its event (as dlr.receptions_readable), so that an archive loaded back reads
-- as the rows did, without the events.
SELECT r.id, e.login, e.message_id, e.level,
       coalesce(r.stat, e.stat) AS stat,
       CASE WHEN r.stat IS NULL THEN e.err ELSE r.err END AS err,
       r.submit_date_raw, r.submit_at,
       CASE WHEN r.stat IS NULL THEN e.done_date_raw ELSE r.done_date_raw END AS done_date_raw,
       CASE WHEN r.stat IS NULL THEN e.done_at ELSE r.done_at END AS done_at,
       r.delivery_count, r.received_at, r.stored_at, r.payload,
       CASE WHEN r.stat IS NULL THEN coalesce(e.flags, '{}') ELSE r.flags END AS flags,
       r.outcome, r.event_id,
       CASE WHEN r.stat IS NULL THEN e.parser_version ELSE r.parser_version END
           AS parser_version,
       CASE WHEN r.stat IS NULL THEN e.fingerprint ELSE r.fingerprint END AS fingerprint,
       r.channel, r.peer
FROM dlr_partitions.{partition} AS r
LEFT JOIN dlr.events AS e ON e.id = r.event_id

-- name: archived_status_changes
-- A day of the change log as its archive holds it: dlr.status_changes' columns, so that an
-- archive loaded back needs neither the reasons nor the messages.
SELECT c.position, c.changed_at,
       coalesce(c.login, m.login) AS login,
       coalesce(c.message_id, m.message_id) AS message_id,
       c.status, c.is_final,
       dlr.reason_text(c.reason, c.reason_id) AS reason,
       c.supporting_event_id, c.rules_version, c.previous_status, c.previous_is_final,
       dlr.reason_text(c.previous_reason, c.previous_reason_id) AS previous_reason
FROM dlr_partitions.{partition} AS c
LEFT JOIN dlr.messages AS m ON c.login IS NULL AND m.id = c.message_ref

-- name: count_partition
-- The rows of a partition about to be archived.
SELECT count(*) FROM dlr_partitions.{partition}

-- name: partition_holds_rows
-- Whether a (default) partition holds any row: a day had no partition when its rows came.
SELECT EXISTS (SELECT 1 FROM dlr_partitions.{partition})

-- name: start_forgetting
-- This transaction forgets: the statuses it deletes are not withdrawals, so no change is
-- written for them (local to the transaction, as set_lock_timeout).
SELECT set_config('dlrfeed.forgetting', 'on', true)

-- name: forgetting_position
-- The dlr.messages.id up to which the forgetting pass has looked (0 before its first run).
SELECT coalesce((SELECT after_id FROM dlr.forgetting_position), 0)

-- name: save_forgetting_position
INSERT INTO dlr.forgetting_position (after_id) VALUES (:after_id)
ON CONFLICT (only_row) DO UPDATE SET after_id = excluded.after_id, updated_at = now()

-- name: messages_after
-- The next messages in the order they were recorded, with when: the pass stops at the first
-- one recorded after its cutoff. By the primary key, so a batch costs the same at any size.
SELECT id, recorded_at FROM dlr.messages
WHERE id > :after_id
ORDER BY id
LIMIT :batch

-- name: lock_messages_to_forget
-- The same row lock ingest, late correlation and recompute take before they touch a message's
-- events or status, here exclusive: a message one of them is writing right now is skipped
-- (SKIP LOCKED: it is not old anyway), and one of them that comes for a message meanwhile waits,
-- then finds it gone and keeps its receipt as uncorrelated (P12).
SELECT id FROM dlr.messages
WHERE id = ANY(:ids::bigint[])
ORDER BY id
FOR UPDATE SKIP LOCKED

-- name: forgetting_verdicts
-- For each locked message: its events (found as late correlation finds them), and whether it
-- is kept because
-- - recent: anything of it happened at or after :cutoff;
-- - investigated: an open exception refers to it or to one of its events;
-- - evidence_kept: a reception naming its key by one of its events is still stored (it would
--   lose its login and message id), or an event under its row is correlated to another id.
--   The drops took every day older than the retention, so only a day not dropped (the default
--   partition) can hold one: pruned to the days before :cutoff, one probe of each one's key;
-- - changes_kept: a change of its status may still be stored. Every change is written at or
--   before its status's updated_at or, for a withdrawn status, its withdrawal (by the days'
--   index of withdrawals), and the log holds nothing from before :changes_since.
SELECT m.id, m.login, m.message_id, e.ids AS event_ids,
       (m.recorded_at >= :cutoff OR coalesce(e.newest >= :cutoff, false)
        OR coalesce(s.updated_at >= :cutoff, false)) AS recent,
       (EXISTS (SELECT 1 FROM dlr.exceptions AS x
                WHERE x.login = m.login AND x.message_id = m.message_id
                  AND x.resolved_at IS NULL)
        OR EXISTS (SELECT 1 FROM dlr.exceptions AS x
                   WHERE x.event_id = ANY(e.ids) AND x.resolved_at IS NULL))
           AS investigated,
       (EXISTS (SELECT 1 FROM dlr.reception_rows AS r
                WHERE r.received_at < :cutoff AND r.event_id = ANY(e.ids))
        -- An event kept under the message's row but correlated to another
        -- id (receipt_ids_hex): it is that id's, and needs this row for its own id.
        OR EXISTS (SELECT 1 FROM dlr.message_events AS x
                   WHERE x.message_ref = m.id AND x.correlation_id <> m.message_id))
           AS evidence_kept,
       CASE WHEN s.updated_at IS NOT NULL THEN s.updated_at >= :changes_since
            WHEN cardinality(e.ids) = 0 THEN false
            ELSE coalesce((SELECT max(c.changed_at) FROM dlr.status_change_rows AS c
                           WHERE c.login = m.login AND c.message_id = m.message_id
                             AND c.status IS NULL) >= :changes_since, false)
       END AS changes_kept
FROM dlr.messages AS m
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(k.id), '{}') AS ids, max(k.last_received_at) AS newest
    FROM (
        -- Each table by probes of its own keys: its own under the message's row id (recording
        -- a message moves them there), the others by the partial correlation indexes.
        SELECT e.id, coalesce(e.last_received_at, e.first_received_at) AS last_received_at
        FROM dlr.message_events AS e
        WHERE e.message_ref = m.id AND e.correlation_id IS NULL
        UNION ALL
        SELECT e.id, coalesce(e.last_received_at, e.first_received_at) AS last_received_at
        FROM dlr.event_rows AS e
        WHERE e.login = m.login AND e.correlation_id = m.message_id
          AND e.correlation_id <> e.message_id
        UNION ALL
        SELECT e.id, coalesce(e.last_received_at, e.first_received_at) AS last_received_at
        FROM dlr.message_events AS e
        CROSS JOIN LATERAL (SELECT o.message_id FROM dlr.messages AS o
                            WHERE o.id = e.message_ref AND o.login = m.login OFFSET 0) AS o
        WHERE e.correlation_id = m.message_id AND e.correlation_id <> o.message_id
    ) AS k
) AS e
-- LATERAL ... OFFSET 0: one probe of the status per message, by the message row's id, never a
-- join of all its rows.
LEFT JOIN LATERAL (
    SELECT s.updated_at FROM dlr.statuses AS s WHERE s.message_ref = m.id OFFSET 0
) AS s ON true
WHERE m.id = ANY(:ids::bigint[])
ORDER BY m.id

-- name: forget_closed_exceptions
-- The resolved exceptions that point at the events about to be forgotten: their investigation
-- is over and their subject leaves.
-- Exceptions that point at no event (an `unstorable` receipt, a second record) stay.
WITH closed_gone AS (
    DELETE FROM dlr.exceptions
    WHERE event_id = ANY(:event_ids::bigint[]) AND resolved_at IS NOT NULL
    RETURNING 1
)
SELECT count(*) FROM closed_gone

-- name: forget_messages
-- Whole messages: their events, their statuses (no change written: start_forgetting), their
-- records. Returns how many of each went.
WITH events_gone AS (
    DELETE FROM dlr.event_rows WHERE id = ANY(:event_ids::bigint[]) RETURNING 1
), message_events_gone AS (
    DELETE FROM dlr.message_events WHERE id = ANY(:event_ids::bigint[]) RETURNING 1
), statuses_gone AS (
    DELETE FROM dlr.statuses WHERE message_ref = ANY(:ids::bigint[]) RETURNING 1
), messages_gone AS (
    DELETE FROM dlr.messages WHERE id = ANY(:ids::bigint[]) RETURNING 1
)
SELECT (SELECT count(*) FROM messages_gone) AS messages,
       (SELECT count(*) FROM statuses_gone) AS statuses,
       (SELECT count(*) FROM events_gone)
       + (SELECT count(*) FROM message_events_gone) AS events
