-- A logical event key remembers its results and the contents that conflicted with them
-- (docs/rules.md, "Logical events, contents and the fingerprint").
--
-- P14: only an applicable result (a final stat at level 2) takes a key's result place, and a
-- redelivery of any content already seen for a key - the held one or a conflicting one - is a
-- repeat. The planner reads both from the event row on the live path:
-- - later_results: the normalised statuses of the results the key accepted after its first
--   content (a level-2 result after a level-2 progress or unrecognized stat, or the second
--   result that the option deadline_unknown_superseded accepts); NULL while none;
-- - conflicting_contents: the fingerprints of the other contents that conflicted with the
--   key's result, once each, in arrival order; NULL while none.
-- And one open conflict exception per conflicting content of a key, whatever races: a unique
-- index of the open same-key conflicts by event and fingerprint (the ingest inserts with ON
-- CONFLICT DO NOTHING).
-- Existing rows are filled from the receptions that remain (those with an outcome of their
-- own keep their fingerprint and stat); duplicate open conflicts of one content are resolved
-- as repeats of the first.
-- Lock: ACCESS EXCLUSIVE on dlr.event_rows and dlr.message_events for the two ADD COLUMN
-- (catalog only, no rewrite) and the fill; SHARE on dlr.exceptions while the index builds.

SET LOCAL lock_timeout = '5s';

ALTER TABLE dlr.event_rows
    ADD COLUMN later_results text[],
    ADD COLUMN conflicting_contents text[];
ALTER TABLE dlr.message_events
    ADD COLUMN later_results text[],
    ADD COLUMN conflicting_contents text[];
COMMENT ON COLUMN dlr.event_rows.later_results IS
    'P14: statuses of the results the key accepted after its first content; NULL: none';
COMMENT ON COLUMN dlr.event_rows.conflicting_contents IS
    'P14: fingerprints of the contents that conflicted with the key''s result, once each';
COMMENT ON COLUMN dlr.message_events.later_results IS
    'P14: statuses of the results the key accepted after its first content; NULL: none';
COMMENT ON COLUMN dlr.message_events.conflicting_contents IS
    'P14: fingerprints of the contents that conflicted with the key''s result, once each';

-- The contents that conflicted, from the receptions that say so.
WITH seen AS (
    SELECT c.event_id, array_agg(c.fingerprint ORDER BY c.first_id) AS fingerprints
    FROM (
        SELECT r.event_id, r.fingerprint, min(r.id) AS first_id
        FROM dlr.reception_rows AS r
        WHERE r.outcome = 'conflict' AND r.fingerprint IS NOT NULL
        GROUP BY r.event_id, r.fingerprint
    ) AS c
    GROUP BY c.event_id
),
in_rows AS (
    UPDATE dlr.event_rows AS e SET conflicting_contents = s.fingerprints
    FROM seen AS s WHERE s.event_id = e.id
)
UPDATE dlr.message_events AS e SET conflicting_contents = s.fingerprints
FROM seen AS s WHERE s.event_id = e.id;

-- Before this migration a level-2 key accepted a further content only as the option's second
-- result: its status from the reception that brought it (a fragment repeated per table).
UPDATE dlr.event_rows AS e SET later_results = (
    SELECT array_agg(x.status ORDER BY x.first_id)
    FROM (
        SELECT min(r.id) AS first_id,
               CASE min(r.stat) WHEN 'DELIVRD' THEN 'DELIVERED' WHEN 'UNDELIV' THEN 'UNDELIVERABLE'
                    WHEN 'EXPIRED' THEN 'EXPIRED' WHEN 'DELETED' THEN 'DELETED'
                    WHEN 'REJECTD' THEN 'REJECTED' WHEN 'UNKNOWN' THEN 'UNKNOWN' END AS status
        FROM dlr.reception_rows AS r
        WHERE r.event_id = e.id AND r.fingerprint = ANY (e.updates) AND r.stat IS NOT NULL
        GROUP BY r.fingerprint
    ) AS x
    WHERE x.status IS NOT NULL)
WHERE e.level = 2 AND e.updates IS NOT NULL;
UPDATE dlr.message_events AS e SET later_results = (
    SELECT array_agg(x.status ORDER BY x.first_id)
    FROM (
        SELECT min(r.id) AS first_id,
               CASE min(r.stat) WHEN 'DELIVRD' THEN 'DELIVERED' WHEN 'UNDELIV' THEN 'UNDELIVERABLE'
                    WHEN 'EXPIRED' THEN 'EXPIRED' WHEN 'DELETED' THEN 'DELETED'
                    WHEN 'REJECTD' THEN 'REJECTED' WHEN 'UNKNOWN' THEN 'UNKNOWN' END AS status
        FROM dlr.reception_rows AS r
        WHERE r.event_id = e.id AND r.fingerprint = ANY (e.updates) AND r.stat IS NOT NULL
        GROUP BY r.fingerprint
    ) AS x
    WHERE x.status IS NOT NULL)
WHERE e.level = 2 AND e.updates IS NOT NULL;

-- The same columns as before, the two new ones last.
CREATE OR REPLACE VIEW dlr.events AS
SELECT e.id, e.login, e.message_id, e.correlation_id, e.level, e.stat, e.status, e.err,
       e.done_date_raw, e.done_at, e.fingerprint, e.flags, e.times_received,
       e.conflicting_receptions, e.parser_version, e.rules_version, e.first_received_at,
       e.last_received_at, e.updates, e.later_results, e.conflicting_contents
FROM dlr.event_rows AS e
UNION ALL
SELECT e.id, m.login, m.message_id, e.correlation_id, e.level, e.stat, e.status, e.err,
       e.done_date_raw, e.done_at, e.fingerprint, e.flags, e.times_received,
       e.conflicting_receptions, e.parser_version, e.rules_version, e.first_received_at,
       e.last_received_at, e.updates, e.later_results, e.conflicting_contents
FROM dlr.message_events AS e
JOIN dlr.messages AS m ON m.id = e.message_ref;

-- Recording a message moves its early events with the two new columns (0025's function).
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
        flags, updates, parser_version, rules_version, later_results, conflicting_contents)
    SELECT m.id, k.ref, m.level, m.first_received_at, m.last_received_at, m.done_at,
           m.times_received, m.conflicting_receptions, m.stat, m.status, m.err,
           m.done_date_raw, m.fingerprint,
           -- Its own id, written out before migration 0016: NULL, as it is written now.
           nullif(m.correlation_id, m.message_id), m.flags, m.updates, m.parser_version,
           m.rules_version, m.later_results, m.conflicting_contents
    FROM moved AS m
    JOIN unnest(early, refs) AS k(id, ref) ON k.id = m.id;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION dlr.move_events_to_messages() FROM PUBLIC;

-- One open same-key conflict per content: the later duplicates are repeats of the first.
UPDATE dlr.exceptions AS x
SET resolved_at = now(),
    resolution = 'another delivery of the content of open exception ' || f.first_id
FROM (
    SELECT o.id, min(o.id) OVER (PARTITION BY o.event_id, o.details->>'fingerprint') AS first_id
    FROM dlr.exceptions AS o
    WHERE o.kind = 'conflict' AND o.resolved_at IS NULL
      AND o.details->>'fingerprint' IS NOT NULL AND o.event_id IS NOT NULL
) AS f
WHERE x.id = f.id AND f.id <> f.first_id;
CREATE UNIQUE INDEX exceptions_open_conflict_key ON dlr.exceptions
    (event_id, (details->>'fingerprint'))
    WHERE kind = 'conflict' AND resolved_at IS NULL;

DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        GRANT UPDATE (later_results, conflicting_contents)
              ON dlr.event_rows, dlr.message_events TO dlrfeed_writer;
    END IF;
END
$grants$;
