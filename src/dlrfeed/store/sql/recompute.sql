-- `dlrfeed recompute` (Store.recompute): stored statuses computed again under the current
-- rules, chunk by chunk, under the same message locks as the ingest.

-- name: stale_statuses
-- The next :chunk statuses after (:after_login, :after_message_id) of another rules version
-- (every one with :every), along the messages' key with one probe of the status per message
-- (LATERAL ... OFFSET 0): an ORDER BY ... LIMIT on the view would sort every status per chunk.
SELECT m.login, m.message_id
FROM dlr.messages AS m
CROSS JOIN LATERAL (
    SELECT s.rules_version FROM dlr.message_status AS s
    WHERE s.login = m.login AND s.message_id = m.message_id
    OFFSET 0
) AS s
WHERE (m.login, m.message_id) > (:after_login, :after_message_id)
  AND (:every OR s.rules_version <> :rules_version)
ORDER BY m.login, m.message_id
LIMIT :chunk

-- name: count_stale_statuses
-- How many statuses a recompute examines (its progress' total), as stale_statuses picks them.
SELECT count(*) FROM dlr.message_status
WHERE :every OR rules_version <> :rules_version

-- name: statuses_before_recompute
-- The statuses of one login's messages before the recompute, read under their message locks,
-- which every status writer holds. LATERAL ... OFFSET 0: one probe of the view per message.
SELECT s.message_id, s.status, s.is_final, s.reason, s.supporting_event_id, s.repeats,
       s.conflicts, s.progress_events, s.deadline_superseded, s.rules_version
FROM unnest(:message_ids::text[]) AS k(message_id)
CROSS JOIN LATERAL (
    SELECT * FROM dlr.message_status AS s
    WHERE s.login = :login AND s.message_id = k.message_id
    OFFSET 0
) AS s
ORDER BY s.message_id

-- name: record_recompute_audit
-- The audit trail of every change the recompute is about to write (:audit: a jsonb array of
-- rows, recompute._recompute_chunk), in its own statement before write_recompute: the change
-- log's trigger reads a withdrawn status's why from it, and a statement's parts run in no set
-- order.
INSERT INTO dlr.status_recomputations (
    login, message_id, old_status, old_is_final, old_reason, old_supporting_event_id,
    old_rules_version, new_status, new_is_final, new_reason, new_supporting_event_id,
    new_rules_version, why)
SELECT :login, a.r->>0, a.r->>1, (a.r->>2)::boolean, a.r->>3, (a.r->>4)::bigint, a.r->>5,
       a.r->>6, (a.r->>7)::boolean, a.r->>8, (a.r->>9)::bigint, :rules_version, a.r->>10
FROM jsonb_array_elements(:audit::jsonb) AS a(r)

-- name: write_recompute
-- The statuses computed again, and those with no applicable receipt any more removed (:gone).
WITH
-- include: upsert_statuses
gone AS (
    DELETE FROM dlr.statuses AS s
    USING dlr.messages AS m
    WHERE m.login = :login AND m.message_id = ANY(:gone::text[]) AND s.message_ref = m.id
)
SELECT 1

-- name: mark_statuses_current
-- Statuses the current rules compute the same: only their version is written (no change, P23).
WITH current_rows AS (
    UPDATE dlr.statuses AS s SET rules_version = :rules_version
    FROM dlr.messages AS m
    WHERE m.login = :login AND m.message_id = ANY(:message_ids::text[]) AND s.message_ref = m.id
    RETURNING 1
)
SELECT count(*) FROM current_rows

-- name: write_event_contents
-- P22: the events whose totals the current rules count otherwise (an option switched), as the
-- live path writes them (event_counters in sql/ingest.sql); an empty list as NULL.
WITH c AS (
    SELECT c.id, c.times_received, c.conflicts,
           nullif(string_to_array(c.updates, ' '), '{}') AS updates,
           nullif(string_to_array(c.later_results, ' '), '{}') AS later_results,
           nullif(string_to_array(c.conflicting_contents, ' '), '{}') AS conflicting_contents
    FROM unnest(:event_ids::bigint[], :times_received::int[], :conflicts::int[],
                :updates::text[], :later_results::text[], :conflicting_contents::text[])
         AS c(id, times_received, conflicts, updates, later_results, conflicting_contents)
), by_key AS (
    UPDATE dlr.event_rows AS e
    SET times_received = c.times_received, conflicting_receptions = c.conflicts,
        updates = c.updates, later_results = c.later_results,
        conflicting_contents = c.conflicting_contents
    FROM c WHERE e.id = c.id
), by_message AS (
    UPDATE dlr.message_events AS e
    SET times_received = c.times_received, conflicting_receptions = c.conflicts,
        updates = c.updates, later_results = c.later_results,
        conflicting_contents = c.conflicting_contents
    FROM c WHERE e.id = c.id
)
SELECT 1

-- name: conflicts_of_events
-- The conflict exceptions of the events recomputed, one probe of the event_id index each,
-- locked for write_conflicts (P22).
SELECT x.id, x.event_id, x.reception_id, x.resolved_at, x.resolution
FROM unnest(:event_ids::bigint[]) AS k(event_id)
CROSS JOIN LATERAL (
    SELECT x.id, x.event_id, x.reception_id, x.resolved_at, x.resolution, x.kind
    FROM dlr.exceptions AS x
    WHERE x.event_id = k.event_id
    OFFSET 0
    FOR NO KEY UPDATE
) AS x
WHERE x.kind = 'conflict'
ORDER BY x.id

-- name: write_conflicts
-- P22: the conflicts the current rules plan, opened where no exception holds them, reopened
-- where other rules resolved them as none; the open ones they do not plan, resolved. A content
-- whose first conflicting delivery left with its day keeps that delivery's open exception (P14:
-- one open conflict per content).
WITH reopened AS (
    UPDATE dlr.exceptions SET resolved_at = NULL, resolution = NULL
    WHERE id = ANY(:reopened_ids::bigint[])
    RETURNING 1
), opened AS (
    INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id, reception_id)
    SELECT 'conflict', :login, n.message_id, n.details::jsonb, n.event_id, n.reception_id
    FROM unnest(:message_ids::text[], :details::text[], :event_ids::bigint[],
                :reception_ids::bigint[]) AS n(message_id, details, event_id, reception_id)
    ON CONFLICT DO NOTHING
    RETURNING 1
), resolved AS (
    UPDATE dlr.exceptions SET resolved_at = now(), resolution = :resolution
    WHERE id = ANY(:resolved_ids::bigint[]) AND resolved_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM opened) + (SELECT count(*) FROM reopened),
       (SELECT count(*) FROM resolved)
