-- A reception names its logical event's key by the event, not by writing it out again
-- (docs/scaling.md, "Where the bytes go").
--
-- Every reception repeated its event's login, gateway message id and level (~50 bytes of a
-- ~384-byte row: the id alone is 37 for a UUID) beside the event id that already names them.
-- From now on:
-- - The table is dlr.reception_rows (renamed: its partitions, keys, triggers, privileges and
--   sequence go with it, nothing is moved or rewritten). A row written from now on holds an
--   empty login and message id and no level: they are its event's. A row stored before keeps
--   its own, for as long as its day is kept.
-- - dlr.receptions is the view of it with the same columns in the same order, the key filled
--   in from the event (by its primary key, only for the rows that name it so). Every reader
--   (`dlrfeed show`, stats, reports, SQL consumers) reads the same answers as before.
--   dlr.receptions_readable likewise.
-- - The login and message id are emptied rather than NULL: on a store upgraded from before
--   migration 0016 a day still keyed by them cannot hold a NULL there. Two empty texts take
--   2 bytes; the level, in no key, is NULL.
-- Locks: ACCESS EXCLUSIVE on dlr.receptions and its day partitions (a rename, defaults, a
-- dropped NOT NULL, a NOT VALID check: catalog changes, held for milliseconds whatever the
-- days' size), to the commit. A dlrfeed process from before it that is still running fails
-- its next batch (the table it copies into is renamed) with nothing of it committed or acked;
-- restarted, it refuses the newer schema (exit 78).

SET LOCAL lock_timeout = '5s';

ALTER TABLE dlr.receptions RENAME TO reception_rows;
ALTER TABLE dlr.reception_rows
    ALTER COLUMN login SET DEFAULT '',
    ALTER COLUMN message_id SET DEFAULT '',
    ALTER COLUMN level DROP NOT NULL;
-- A row names its key by its event only whole: the view tells them apart by the level.
ALTER TABLE dlr.reception_rows
    ADD CONSTRAINT reception_rows_key_check
    CHECK (level IS NOT NULL OR (login = '' AND message_id = '')) NOT VALID;
COMMENT ON TABLE dlr.reception_rows IS
    'every delivery received (P6, P13), append-only, partitioned by day of received_at; read'
    ' through the view dlr.receptions';
COMMENT ON COLUMN dlr.reception_rows.level IS
    'NULL: the row''s login, message id and level are its event''s (migration 0021); its login'
    ' and message_id are then empty';

-- The same columns in the same order as the table had, each as the table showed it.
CREATE VIEW dlr.receptions AS
SELECT r.id,
       CASE WHEN r.level IS NULL THEN e.login ELSE r.login END AS login,
       CASE WHEN r.level IS NULL THEN e.message_id ELSE r.message_id END AS message_id,
       coalesce(r.level, e.level) AS level,
       r.stat, r.err, r.submit_date_raw, r.submit_at, r.done_date_raw, r.done_at,
       r.delivery_count, r.received_at, r.stored_at, r.payload, r.flags, r.outcome,
       r.event_id, r.parser_version, r.fingerprint, r.channel, r.peer
FROM dlr.reception_rows AS r
-- The event by its primary key, only for the rows that name their key by it (and never when a
-- query reads none of its columns: the join is then removed).
LEFT JOIN dlr.events AS e ON r.level IS NULL AND e.id = r.event_id;
-- P13 says so through the view too, as the table does (the owner would otherwise be told
-- only that a view joined to another cannot be updated).
CREATE TRIGGER receptions_append_only
    INSTEAD OF UPDATE OR DELETE ON dlr.receptions
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reception_change();
COMMENT ON VIEW dlr.receptions IS
    'every delivery received (P6, P13), repeats included, with its login, message id and level'
    ' (from its event where the row names it so, migration 0021)';

-- As 0016's view, on the table, the key filled in as dlr.receptions fills it. The same columns
-- in the same order, so that CREATE OR REPLACE keeps every reader and grant.
CREATE OR REPLACE VIEW dlr.receptions_readable AS
SELECT r.id,
       CASE WHEN r.level IS NULL THEN e.login ELSE r.login END AS login,
       CASE WHEN r.level IS NULL THEN e.message_id ELSE r.message_id END AS message_id,
       coalesce(r.level, e.level) AS level,
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
FROM dlr.reception_rows AS r
LEFT JOIN dlr.events AS e ON (r.stat IS NULL OR r.level IS NULL) AND e.id = r.event_id;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with every delivery''s parsed fields filled in (from its event where the'
    ' row defers to it) and payload_json: the receipt in payload, as JSON (dlr.receipt_json'
    ' for the feed, dlr.callback_json for a callback)';

-- The partitions keep their names (receptions_YYYYMMDD, receptions_default): only the parent
-- they are created under is named anew.
CREATE OR REPLACE FUNCTION dlr.create_reception_partitions(through timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql SET timezone = 'UTC' AS $fn$
DECLARE
    day timestamptz;
    name text;
BEGIN
    SELECT coalesce(max(p.upper_bound), date_trunc('day', now())) INTO day
    FROM dlr.day_partitions AS p WHERE p.parent_table = 'reception_rows';
    WHILE day < through LOOP
        name := 'receptions_' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.reception_rows'
                       ' FOR VALUES FROM (%L) TO (%L)', name, day, day + interval '1 day');
        EXECUTE format('ALTER TABLE dlr_partitions.%I ADD CONSTRAINT %I'
                       ' PRIMARY KEY (event_id, id)', name, name || '_pkey');
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

-- The table's privileges went with it (the writer INSERTs and reads the columns late
-- correlation replays; the reader reads). The view is read by the reader only: the writer
-- reads the table, by the keys each day has.
REVOKE ALL ON dlr.receptions FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.receptions TO dlrfeed_reader;
    END IF;
END
$grants$;
