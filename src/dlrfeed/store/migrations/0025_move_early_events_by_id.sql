-- Recording a message moves its early events by their ids (docs/postgresql.md, "The events
-- under their message's row id").
--
-- The trigger of migration 0024 deleted the early events of the messages just recorded with a
-- join of dlr.event_rows to the probes that found them. dlr.event_rows stays small but churns
-- (every early event is inserted, then moved away), so its statistics are often stale; with
-- one row estimated the planner put the table on the outer side of the join, and ran all the
-- probes again for every row it held: 500 messages recorded against 189 waiting events were
-- 94,500 probes, 0.15-0.27 s of the recording call. Now the probes run once, into an array of
-- ids, and the delete reads the table's primary key for those ids: a plan with no join to
-- choose. What is moved, and where, is unchanged.
-- Lock: none beyond the function's catalog row; the trigger keeps calling it by the same oid.

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION dlr.move_events_to_messages() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    early bigint[];
    refs bigint[];
BEGIN
    -- Each message recorded probes the key of dlr.event_rows once (OFFSET 0: whatever the
    -- statistics say).
    SELECT array_agg(x.id ORDER BY x.id), array_agg(m.id ORDER BY x.id) INTO early, refs
    FROM recorded AS m
    CROSS JOIN LATERAL (
        SELECT x.id FROM dlr.event_rows AS x
        WHERE x.login = m.login AND x.message_id = m.message_id
        OFFSET 0
    ) AS x
    WHERE m.id >= dlr.message_events_first_message();
    IF early IS NULL THEN
        RETURN NULL;
    END IF;
    WITH moved AS (
        DELETE FROM dlr.event_rows AS e WHERE e.id = ANY (early) RETURNING e.*
    )
    INSERT INTO dlr.message_events (
        id, message_ref, level, first_received_at, last_received_at, done_at, times_received,
        conflicting_receptions, stat, status, err, done_date_raw, fingerprint, correlation_id,
        flags, updates, parser_version, rules_version)
    SELECT m.id, k.ref, m.level, m.first_received_at, m.last_received_at, m.done_at,
           m.times_received, m.conflicting_receptions, m.stat, m.status, m.err,
           m.done_date_raw, m.fingerprint,
           -- Its own id, written out before migration 0016: NULL, as it is written now.
           nullif(m.correlation_id, m.message_id), m.flags, m.updates, m.parser_version,
           m.rules_version
    FROM moved AS m
    JOIN unnest(early, refs) AS k(id, ref) ON k.id = m.id;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION dlr.move_events_to_messages() FROM PUBLIC;
