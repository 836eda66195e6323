-- Rows that say each fact once (docs/scaling.md, "where the bytes go").
--
-- 1. A reception repeated its event's content. Every delivery kept the parsed fields of its
--    receipt (stat, err, done_date_raw, done_at, fingerprint, flags, parser_version) beside
--    the payload, yet nearly every delivery (the first of its logical event, and every repeat)
--    carries exactly the content its event already holds: the event is written from the
--    first delivery, and a repeat is by definition the same content (P14). From now on a
--    reception whose parsed fields are its event's stores none of them: `stat` NULL says
--    "these fields are those of event_id", and the other six are NULL with it (the check
--    below). A delivery with content of its own (a progress update, a conflict, a different
--    flag or date form) keeps all of them, as before. The payload, both times (received_at,
--    stored_at), the key (message_id, level) and the outcome stay on every row: the evidence
--    itself is untouched (P6, P9, P13). dlr.receptions_readable shows every row with its
--    fields filled in from the event, as they were stored before; the ingest's late
--    correlation, `dlrfeed show` and retention's archives read them the same way.
-- 2. An event repeated its own id. `correlation_id` (the id looked up among sent messages,
--    P10) equals `message_id` unless an integration option (receipt_ids_hex) says otherwise,
--    and was stored twice. From now on it is NULL when it is the event's own id; every
--    reader takes coalesce(correlation_id, message_id). The partial correlation index
--    (0005: WHERE correlation_id <> message_id) holds exactly the same events as before.
--    Nearly every event also stored two empty arrays (its flags, its further accepted
--    contents), 13 bytes each: NULL says "none" in no bytes, and the readers take '{}'.
--
-- 3. A day's index repeated the login. Each day partition of dlr.receptions is keyed
--    (login, event_id, id) since 0013; an event id belongs to one login, and a reception id is
--    unique on its own, so the login made each entry a quarter bigger and told nothing. Days
--    created from now on, and the empty days already created ahead, are keyed (event_id, id);
--    a day that holds rows keeps its key (rebuilding it would hold the ingest back), and every
--    reader names the login, the message id and the event id, so each day is probed through
--    whichever key it has.
--
-- Online on an installed store: no row is rewritten and no table scanned. Dropping NOT NULL
-- and adding a CHECK ... NOT VALID change the catalog only (rows already stored keep their
-- full form, which the new readers read as they are, and leave with their day by retention),
-- the view is replaced in place, and only empty days are rekeyed. Each statement takes an
-- ACCESS EXCLUSIVE lock (on dlr.receptions and every partition, on dlr.events, on the view,
-- on the key of each empty day), held to the end of this transaction: tens of milliseconds
-- once granted on a store of a million receptions (docs/retention.md, "Migration 0016"). To
-- be granted, it waits for the ingest transactions in flight and queues the next ones behind
-- it; lock_timeout bounds that wait, so a migration stuck behind a long transaction gives up
-- (run it again) rather than stall the ingest.
-- Every dlrfeed before this version reads these columns without the event: restart every
-- dlrfeed process on the new version once the migration is done (an old process refuses to
-- start on this schema; one already running keeps working as long as no new one writes).

SET LOCAL lock_timeout = '5s';

ALTER TABLE dlr.receptions
    ALTER COLUMN stat DROP NOT NULL,
    ALTER COLUMN flags DROP NOT NULL,
    ALTER COLUMN parser_version DROP NOT NULL;
-- NOT VALID: checked for every row written from now on, without reading the stored ones
-- (which all have a stat, so hold it anyway).
ALTER TABLE dlr.receptions ADD CONSTRAINT receptions_content_as_event_check CHECK (
    stat IS NOT NULL
    OR (err IS NULL AND done_date_raw IS NULL AND done_at IS NULL AND fingerprint IS NULL
        AND flags IS NULL AND parser_version IS NULL)) NOT VALID;
COMMENT ON COLUMN dlr.receptions.stat IS
    'the raw stat; NULL: this delivery''s parsed fields (stat, err, done_date_raw, done_at,'
    ' fingerprint, flags, parser_version) are those of its event (dlr.receptions_readable'
    ' shows them filled in)';

ALTER TABLE dlr.events
    ALTER COLUMN correlation_id DROP NOT NULL,
    ALTER COLUMN flags DROP NOT NULL,
    ALTER COLUMN flags DROP DEFAULT,
    ALTER COLUMN updates DROP NOT NULL,
    ALTER COLUMN updates DROP DEFAULT;
COMMENT ON COLUMN dlr.events.correlation_id IS
    'the id used to find the sent message (P10); NULL: the event''s own message_id';
COMMENT ON COLUMN dlr.events.flags IS
    'the parse flags of the first content; NULL: none (an empty array took 13 bytes)';
COMMENT ON COLUMN dlr.events.updates IS
    'the further contents the key accepted, in arrival order (P14); NULL: none';

-- The same columns in the same order as 0015's view (`r.*` then payload_json), so that
-- CREATE OR REPLACE keeps every reader and grant; a row that holds its own fields shows them,
-- one that defers to its event shows the event's.
CREATE OR REPLACE VIEW dlr.receptions_readable AS
SELECT r.id, r.login, r.message_id, r.level,
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
       r.channel, r.peer,
       CASE r.channel
           WHEN 'webhook' THEN dlr.callback_json(r.payload)
           ELSE dlr.receipt_json(r.payload)
       END AS payload_json
FROM dlr.receptions AS r
-- The event by its primary key, only for the rows that defer to it (and never at all when a
-- query reads none of its columns: the join is then removed).
LEFT JOIN dlr.events AS e ON r.stat IS NULL AND e.id = r.event_id;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with every delivery''s parsed fields filled in (from its event where the'
    ' row defers to it) and payload_json: the receipt in payload, as JSON (dlr.receipt_json'
    ' for the feed, dlr.callback_json for a callback)';

CREATE OR REPLACE FUNCTION dlr.create_reception_partitions(through timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql SET timezone = 'UTC' AS $fn$
DECLARE
    day timestamptz;
    name text;
BEGIN
    SELECT coalesce(max(p.upper_bound), date_trunc('day', now())) INTO day
    FROM dlr.day_partitions AS p WHERE p.parent_table = 'receptions';
    WHILE day < through LOOP
        name := 'receptions_' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.receptions'
                       ' FOR VALUES FROM (%L) TO (%L)', name, day, day + interval '1 day');
        EXECUTE format('ALTER TABLE dlr_partitions.%I ADD CONSTRAINT %I'
                       ' PRIMARY KEY (event_id, id)', name, name || '_pkey');
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

-- The empty days (ahead, and an empty default partition) take the new key now: nothing to
-- rebuild. The ALTER TABLE above holds every partition, so none fills meanwhile.
DO $rekey$
DECLARE
    part record;
    holds_rows boolean;
BEGIN
    FOR part IN
        SELECT c.relname AS partition_name, k.conname AS key_name
        FROM pg_inherits AS i
        JOIN pg_class AS c ON c.oid = i.inhrelid
        JOIN pg_constraint AS k ON k.conrelid = c.oid AND k.contype = 'p'
        WHERE i.inhparent = 'dlr.receptions'::regclass
    LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM dlr_partitions.%I)', part.partition_name)
            INTO holds_rows;
        CONTINUE WHEN holds_rows;
        EXECUTE format('ALTER TABLE dlr_partitions.%I DROP CONSTRAINT %I,'
                       ' ADD CONSTRAINT %I PRIMARY KEY (event_id, id)',
                       part.partition_name, part.key_name, part.key_name);
    END LOOP;
END
$rekey$;
