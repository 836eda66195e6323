-- `dlrfeed recompute` (Store.recompute): stored statuses computed again under the current
-- rules, chunk by chunk, under the same message locks as the ingest.

-- name: stale_statuses
-- The next statuses after (:after_login, :after_message_id) in key order, those of another
-- rules version unless :every (every one); :chunk at most. Walked along the messages' key, with
-- one probe of the status per message (LATERAL ... OFFSET 0): an ORDER BY ... LIMIT on the
-- view would sort every status for each chunk.
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
-- How many statuses a recompute examines (its progress' total): those of another version than
-- :rules_version (the rules and the options they read, P22) unless :every.
SELECT count(*) FROM dlr.message_status
WHERE :every OR rules_version <> :rules_version

-- name: statuses_before_recompute
-- The statuses of one login's messages as they are before the recompute, read after their
-- message rows are locked: every status write holds its message row's lock (the ingest, late
-- correlation, the recompute), so none changes under us.
-- LATERAL ... OFFSET 0: one probe of the view per message, whatever the statistics say.
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
-- rows [message_id, old status, old is_final, old reason, old supporting event, old rules
-- version, new status, new is_final, new reason, new supporting event, why]), in its own
-- statement before write_recompute: the change log's trigger names a withdrawn status's why
-- and rules from it, and a statement's data-modifying parts run in no set order.
INSERT INTO dlr.status_recomputations (
    login, message_id, old_status, old_is_final, old_reason, old_supporting_event_id,
    old_rules_version, new_status, new_is_final, new_reason, new_supporting_event_id,
    new_rules_version, why)
SELECT :login, a.r->>0, a.r->>1, (a.r->>2)::boolean, a.r->>3, (a.r->>4)::bigint, a.r->>5,
       a.r->>6, (a.r->>7)::boolean, a.r->>8, (a.r->>9)::bigint, :rules_version, a.r->>10
FROM jsonb_array_elements(:audit::jsonb) AS a(r)

-- name: write_recompute
-- The statuses computed again (:statuses) and those with no applicable receipt under the
-- current rules removed (:gone), after record_recompute_audit.
WITH
-- include: upsert_statuses
gone AS (
    DELETE FROM dlr.statuses AS s
    USING dlr.messages AS m
    WHERE m.login = :login AND m.message_id = ANY(:gone::text[]) AND s.message_ref = m.id
)
SELECT 1

-- name: mark_statuses_current
-- Statuses of another version that the current rules compute the same: only their version is
-- written (their updated_at and everything else stay; no change is written, P23).
WITH current_rows AS (
    UPDATE dlr.statuses AS s SET rules_version = :rules_version
    FROM dlr.messages AS m
    WHERE m.login = :login AND m.message_id = ANY(:message_ids::text[]) AND s.message_ref = m.id
    RETURNING 1
)
SELECT count(*) FROM current_rows

-- name: write_event_contents
-- P22: the events whose totals the current rules count otherwise (an option switched): the
-- deliveries accepted (first included), the conflicting ones, the contents accepted after the
-- first, the results accepted after the first and the contents that conflicted, as the live
-- path writes them (event_counters in sql/ingest.sql), in whichever table keeps each. None
-- accepted: NULL, not an empty array.
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
-- The conflict exceptions of the events recomputed (one probe of the event_id index each),
-- locked: opened and resolved by write_conflicts as the current rules plan them (P22).
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
-- P22: the conflicts the current rules plan that no exception holds yet, opened, and those
-- that other rules resolved as none (:reopened_ids), open again; the open ones they no longer
-- plan, resolved with :resolution. A content whose first conflicting delivery left with its
-- day still has that delivery's open exception: the one open conflict of a content (P14)
-- stays that one.
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
