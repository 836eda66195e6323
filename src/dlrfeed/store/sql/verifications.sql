-- Independent verification (C6; dlrfeed.store.verification and the reports): recorded by the
-- sender, correlated with its message by (login, message_id) when read, never an input of a
-- computed status (P2).

-- name: insert_verifications
-- Idempotent: the same (login, message_id, kind, verified_at) again is left as it was. Counts
-- the new ones, and of those the ones whose message is not recorded (yet): they wait, and
-- count from the moment it is.
WITH new AS (
    INSERT INTO dlr.verifications (login, message_id, kind, verified_at, source)
    SELECT u.login, u.message_id, u.kind, u.verified_at, u.source
    FROM unnest(:logins::text[], :message_ids::text[], :kinds::text[],
                :verified_at::timestamptz[], :sources::text[])
         AS u(login, message_id, kind, verified_at, source)
    ORDER BY u.login, u.message_id, u.kind, u.verified_at
    ON CONFLICT ON CONSTRAINT verifications_key DO NOTHING
    RETURNING login, message_id
)
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM dlr.messages AS m
           WHERE m.login = new.login AND m.message_id = new.message_id)) AS waiting
FROM new

-- name: verification_rows
-- `show`: the verifications of one message id under each login, oldest first.
SELECT login, kind, verified_at, source, recorded_at
FROM dlr.verifications
WHERE login = ANY(:logins::text[]) AND message_id = :message_id
ORDER BY login, verified_at, kind
