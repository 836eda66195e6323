-- `dlrfeed recompute` (Store.recompute): stored statuses computed again under the current
-- rules, chunk by chunk, under the same message locks as the ingest.

-- name: stale_statuses
-- The next status rows after (:after_login, :after_message_id) in key order, those of
-- another rules version unless :every (every row); :chunk rows at most.
SELECT login, message_id
FROM dlr.message_status
WHERE (login, message_id) > (:after_login, :after_message_id)
  AND (:every OR rules_version <> :rules_version)
ORDER BY login, message_id
LIMIT :chunk

-- name: lock_statuses
-- The status rows of one login's messages, locked after their messages (the order the ingest
-- takes), as they are before the recompute.
SELECT message_id, status, is_final, reason, supporting_event_id, repeats, conflicts,
       progress_events, deadline_superseded, rules_version
FROM dlr.message_status
WHERE login = :login AND message_id = ANY(:message_ids::text[])
ORDER BY message_id
FOR UPDATE

-- name: write_recompute
-- The statuses computed again (:statuses), those with no applicable receipt under the current
-- rules removed (:gone), and the audit trail of every change (:audit: a jsonb array of rows
-- [message_id, old status, old is_final, old reason, old supporting event, old rules version,
-- new status, new is_final, new reason, new supporting event, why]).
WITH st AS (
-- include: upsert_statuses
),
gone AS (
    DELETE FROM dlr.message_status
    WHERE login = :login AND message_id = ANY(:gone::text[])
),
audit AS (
    INSERT INTO dlr.status_recomputations (
        login, message_id, old_status, old_is_final, old_reason, old_supporting_event_id,
        old_rules_version, new_status, new_is_final, new_reason, new_supporting_event_id,
        new_rules_version, why)
    SELECT :login, a.r->>0, a.r->>1, (a.r->>2)::boolean, a.r->>3, (a.r->>4)::bigint, a.r->>5,
           a.r->>6, (a.r->>7)::boolean, a.r->>8, (a.r->>9)::bigint, :rules_version, a.r->>10
    FROM jsonb_array_elements(:audit::jsonb) AS a(r)
)
SELECT 1
