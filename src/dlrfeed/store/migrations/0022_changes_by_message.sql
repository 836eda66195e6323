-- A status change names its message by the message row's id, not by its login and gateway id
-- again (docs/scaling.md, "Where the bytes go").
--
-- Each change of dlr.statuses (migration 0020) repeated its message's login and gateway id
-- (~42 bytes of a ~143-byte row; a store keeps ~0.8 change per reception), read from the
-- message row it already names by the status's key. From now on:
-- - A change written by dlr.statuses' trigger holds message_ref (dlr.messages.id) and no login
--   or message id. A withdrawal keeps its login and message id: the trigger finds the latest
--   withdrawal of a message by them (dlr.latest_withdrawal, the days' partial index of
--   withdrawals), and a withdrawn message may be forgotten while its withdrawal is kept.
--   Changes of dlr.earlier_statuses, and every change stored before, keep theirs.
-- - dlr.status_changes, the view every reader reads (`dlrfeed changes`, the follower, the
--   webhook relay, archives), shows the same columns: the login and message id from the
--   message row, by its primary key, where the change names it so.
-- - The forgetting pass waits while the change log holds a change older than its cutoff (a day
--   kept for a consumer that has not read it): a message forgotten then would leave such a
--   change without its login and message id.
-- Locks: ACCESS EXCLUSIVE on dlr.status_change_rows and its days, to the commit (a column
-- added with no default, two NOT NULLs dropped, a NOT VALID check, a view and a function
-- replaced: catalog changes, held for milliseconds whatever the log's size). The ingest's
-- status writes wait meanwhile.

SET LOCAL lock_timeout = '5s';

ALTER TABLE dlr.status_change_rows
    ADD COLUMN message_ref bigint,
    ALTER COLUMN login DROP NOT NULL,
    ALTER COLUMN message_id DROP NOT NULL;
ALTER TABLE dlr.status_change_rows
    ADD CONSTRAINT status_change_rows_message_check
    CHECK (message_ref IS NOT NULL OR (login IS NOT NULL AND message_id IS NOT NULL)) NOT VALID;
COMMENT ON COLUMN dlr.status_change_rows.message_ref IS
    'the message (dlr.messages.id) of a change written since migration 0022, whose login and'
    ' message_id are then NULL: dlr.status_changes shows them from the message row';

-- The same columns in the same order as 0018's view.
CREATE OR REPLACE VIEW dlr.status_changes AS
SELECT c.position, c.changed_at,
       coalesce(c.login, m.login) AS login,
       coalesce(c.message_id, m.message_id) AS message_id,
       c.status, c.is_final,
       dlr.reason_text(c.reason, c.reason_id) AS reason,
       c.supporting_event_id, c.rules_version, c.previous_status, c.previous_is_final,
       dlr.reason_text(c.previous_reason, c.previous_reason_id) AS previous_reason
FROM dlr.status_change_rows AS c
-- The message row by its primary key, only for the changes that name it so (and never when a
-- query reads neither column: the join is then removed).
LEFT JOIN dlr.messages AS m ON c.login IS NULL AND m.id = c.message_ref;

-- Restated from 0020: an insert or an update of a status writes its change under the message
-- row's id; the message row is still read, by its primary key, for the latest withdrawal of
-- the message (by its login and gateway id). A withdrawal is written as before.
CREATE OR REPLACE FUNCTION dlr.record_statuses_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written_at timestamptz := clock_timestamp();
    recent timestamptz := now() - interval '1 hour';
    horizon timestamptz := written_at + interval '1 hour';
    written bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr.check_reason_ids(ARRAY(
            SELECT DISTINCT n.reason_id FROM new_rows AS n WHERE n.reason_id IS NOT NULL));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, message_ref, status, is_final, reason, reason_id,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.message_ref, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = n.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
            ON true;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM dlr.check_reason_ids(ARRAY(
            SELECT DISTINCT n.reason_id FROM new_rows AS n WHERE n.reason_id IS NOT NULL));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, message_ref, status, is_final, reason, reason_id,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.message_ref, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version, o.status, o.is_final,
               CASE WHEN ro.id IS NULL THEN o.reason END, coalesce(o.reason_id, ro.id)
        FROM new_rows AS n
        JOIN old_rows AS o USING (message_ref)
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = n.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
            ON true
        WHERE (n.status, n.is_final) IS DISTINCT FROM (o.status, o.is_final)
           OR CASE WHEN n.reason_id IS NOT NULL AND o.reason_id IS NOT NULL
                   THEN n.reason_id <> o.reason_id
                   ELSE dlr.reason_text(n.reason, n.reason_id)
                        IS DISTINCT FROM dlr.reason_text(o.reason, o.reason_id) END;
    ELSE
        -- DELETE: the status withdrawn (0012). The recompute's audit row of this transaction
        -- (same now()) names why and under which rules.
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, o.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, m.login, m.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, CASE WHEN ro.id IS NULL THEN o.reason END,
               coalesce(o.reason_id, ro.id)
        FROM old_rows AS o
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = o.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
            ON true
        LEFT JOIN LATERAL (
            SELECT r.why, r.new_rules_version FROM dlr.status_recomputations AS r
            WHERE r.login = m.login AND r.message_id = m.message_id AND r.new_status IS NULL
                  AND r.recomputed_at = now()
            ORDER BY r.id DESC LIMIT 1
        ) AS a ON true
        ORDER BY m.login, m.message_id;
    END IF;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written > 0 THEN
        -- Wakes followers at commit (one notification per transaction: equal ones fold). The
        -- log is the truth; a follower that misses this finds the rows on its next poll.
        PERFORM pg_notify('dlr_status_changes', '');
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION dlr.record_statuses_changes() FROM PUBLIC;
