-- `dlrfeed recompute` (Store.recompute): stored statuses computed again under the current
-- rules, chunk by chunk, under the same message locks as the ingest.

-- name: stale_statuses
-- The next statuses after (:after_login, :after_message_id) in key order, those of another
-- rules version unless :every (every one); :chunk at most. Walked along the messages' key, with
-- one probe of the view per message (LATERAL ... OFFSET 0): the view joins two tables
-- (migration 0020), and an ORDER BY ... LIMIT on it would sort every status for each chunk.
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

-- name: statuses_before_recompute
-- The statuses of one login's messages as they are before the recompute, read after their
-- message rows are locked: every status write holds its message row's lock (the ingest, late
-- correlation, the recompute), so none changes under us. Not locked themselves: the view
-- joins two tables (migration 0020), which FOR UPDATE cannot go through.
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
-- include: upsert_earlier_statuses
gone AS (
    DELETE FROM dlr.message_status AS s
    USING unnest(:gone::text[]) AS g(message_id)
    WHERE s.login = :login AND s.message_id = g.message_id
)
SELECT 1
