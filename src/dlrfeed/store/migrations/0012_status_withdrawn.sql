-- A status withdrawn is a change too (docs/changes.md). `dlrfeed recompute` deletes a
-- message's status row when, under the current rules, no receipt of it is applicable any more
-- (say a level-0 DELIVRD an older rules version applied). 0009's triggers fire on INSERT and
-- UPDATE only, so a consumer that saw DELIVERED was never told it is gone, and "a message's
-- last change is its current status" broke. Now a DELETE writes one change per deleted row:
-- - status NULL ("no computed status any more"), is_final false;
-- - previous_status, previous_is_final, previous_reason: the status withdrawn;
-- - reason and rules_version: from the audit row `dlrfeed recompute` writes in the same
--   statement (dlr.status_recomputations, new_status NULL: its `why` and the rules version
--   it ran under); a delete by anything else says "withdrawn: no computed status any more"
--   and keeps the deleted row's rules version;
-- - supporting_event_id: the event the withdrawn status rested on.
-- Positions are drawn exactly as for the other changes (0009, with 0011's recent-days
-- lookup), so the gap-free read rule and per-message order hold for these rows as well: the
-- deleting transaction holds the message's row lock, as every writer of a status does.

ALTER TABLE dlr.status_changes ALTER COLUMN status DROP NOT NULL;

CREATE OR REPLACE FUNCTION dlr.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written_at timestamptz := clock_timestamp();
    recent timestamptz := now() - interval '1 hour';
    written bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, coalesce(trunc(p.position / 1e19), 0)) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        LEFT JOIN LATERAL (
            SELECT max(c.position) AS position FROM dlr.status_changes AS c
            WHERE c.login = n.login AND c.message_id = n.message_id AND c.changed_at >= recent
                  AND c.changed_at < written_at + interval '1 hour'
        ) AS p ON true;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Only real changes: a rewrite that keeps status, finality and reason writes nothing.
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason)
        SELECT greatest(own_epoch, coalesce(trunc(p.position / 1e19), 0)) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason,
               n.supporting_event_id, n.rules_version, o.status, o.is_final, o.reason
        FROM new_rows AS n
        JOIN old_rows AS o USING (login, message_id)
        LEFT JOIN LATERAL (
            SELECT max(c.position) AS position FROM dlr.status_changes AS c
            WHERE c.login = n.login AND c.message_id = n.message_id AND c.changed_at >= recent
                  AND c.changed_at < written_at + interval '1 hour'
        ) AS p ON true
        WHERE (n.status, n.is_final, n.reason) IS DISTINCT FROM (o.status, o.is_final, o.reason);
    ELSE
        -- DELETE: the status withdrawn. The recompute's audit row of this transaction (same
        -- now()) names why and under which rules; AFTER triggers run once the statement that
        -- wrote it is complete, so it is visible here.
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason)
        SELECT greatest(own_epoch, coalesce(trunc(p.position / 1e19), 0)) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, o.login, o.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, o.reason
        FROM old_rows AS o
        LEFT JOIN LATERAL (
            SELECT max(c.position) AS position FROM dlr.status_changes AS c
            WHERE c.login = o.login AND c.message_id = o.message_id AND c.changed_at >= recent
                  AND c.changed_at < written_at + interval '1 hour'
        ) AS p ON true
        LEFT JOIN LATERAL (
            SELECT r.why, r.new_rules_version FROM dlr.status_recomputations AS r
            WHERE r.login = o.login AND r.message_id = o.message_id AND r.new_status IS NULL
                  AND r.recomputed_at = now()
            ORDER BY r.id DESC LIMIT 1
        ) AS a ON true
        ORDER BY o.login, o.message_id;
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
REVOKE ALL ON FUNCTION dlr.record_status_changes() FROM PUBLIC;

CREATE TRIGGER message_status_changes_delete
    AFTER DELETE ON dlr.message_status
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_status_changes();
