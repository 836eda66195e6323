-- P6/P13: the evidence (dlr.receptions) is partitioned by the day it was received, so that
-- retention drops whole days (`dlrfeed maintain`, docs/retention.md) instead of deleting rows.
--
-- dlr.receptions becomes a table partitioned by range of received_at (our clock, P19), one
-- partition per UTC day, in schema dlr_partitions (their names carry dates, so they are kept
-- apart from the stable schema dlr). Readers and the writer use dlr.receptions as before; a
-- partition is an implementation detail only the owner touches.
--
-- An installed store is moved without copying a row: the existing table becomes the first
-- partition, `receptions_before_YYYYMMDD`, holding everything received before that day (the
-- day after the newest reception, or today on an empty store). Its one index is kept as it is;
-- the migration reads the table twice (its newest received_at, then the proof of the partition
-- bound; 1-5 s per million receptions measured, docs/retention.md) under a lock that holds
-- ingest back meanwhile: stop the daemons before migrating (docs/systemd.md).
--
-- No index on the partitioned parent: PostgreSQL would want the partition key in it, i.e.
-- rebuilding the existing table's index under the lock. Each partition gets its own index on
-- (login, message_id, id), as the single table had (`show MESSAGE_ID`; ids come from
-- receptions_id_seq, so are unique without a constraint across partitions).
--
-- dlr.events is not partitioned: it holds the key (login, message_id, level) that makes a
-- redelivery a repeat (P14), and must keep every key at least as long as the gateway may
-- redeliver (F16), whichever partition the first delivery's evidence lay in or whether it
-- was dropped.

CREATE SCHEMA dlr_partitions;
REVOKE ALL ON SCHEMA dlr_partitions FROM PUBLIC;

DROP VIEW dlr.receptions_readable;  -- recreated below on the partitioned table

ALTER TABLE dlr.receptions RENAME TO receptions_unpartitioned;
-- The row triggers come back on every partition from the parent (below).
DROP TRIGGER receptions_append_only ON dlr.receptions_unpartitioned;
DROP TRIGGER receptions_no_truncate ON dlr.receptions_unpartitioned;
ALTER TABLE dlr.receptions_unpartitioned RENAME CONSTRAINT receptions_pkey
    TO receptions_unpartitioned_pkey;
-- A table's own sequences would follow it into the other schema; the id sequence stays in dlr.
ALTER SEQUENCE dlr.receptions_id_seq OWNED BY NONE;
ALTER TABLE dlr.receptions_unpartitioned SET SCHEMA dlr_partitions;

CREATE TABLE dlr.receptions (
    LIKE dlr_partitions.receptions_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS
) PARTITION BY RANGE (received_at);
ALTER SEQUENCE dlr.receptions_id_seq OWNED BY dlr.receptions.id;
COMMENT ON TABLE dlr.receptions IS
    'every delivery received from the feed (P6, P13), partitioned by UTC day of received_at';

-- P13: append-only, as before; row triggers are cloned onto every partition.
CREATE TRIGGER receptions_append_only
    BEFORE UPDATE OR DELETE ON dlr.receptions
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reception_change();
CREATE TRIGGER receptions_no_truncate
    BEFORE TRUNCATE ON dlr.receptions
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.forbid_reception_change();

-- The partitions of each partitioned table of dlr, with their bounds (NULL lower_bound: the
-- first partition, unbounded below; is_default: the catch-all for a day not created yet).
CREATE VIEW dlr.day_partitions AS
SELECT parent.relname AS parent_table,
       child.relname AS partition_name,
       substring(pg_get_expr(child.relpartbound, child.oid) FROM 'FROM \(''([^'']*)''\)')
           ::timestamptz AS lower_bound,
       substring(pg_get_expr(child.relpartbound, child.oid) FROM 'TO \(''([^'']*)''\)')
           ::timestamptz AS upper_bound,
       pg_get_expr(child.relpartbound, child.oid) = 'DEFAULT' AS is_default
FROM pg_inherits AS i
JOIN pg_class AS parent ON parent.oid = i.inhparent
JOIN pg_class AS child ON child.oid = i.inhrelid
WHERE parent.relnamespace = 'dlr'::regnamespace AND parent.relkind = 'p';

-- One partition of dlr.receptions per UTC day from the end of the newest one (today on a
-- table with none) up to `through`; returns the names created. Each gets the index the single
-- table had. Run by the owner (`dlrfeed maintain` creates days ahead).
CREATE FUNCTION dlr.create_reception_partitions(through timestamptz) RETURNS SETOF text
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
                       ' PRIMARY KEY (login, message_id, id)', name, name || '_pkey');
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

DO $move$
DECLARE
    newest timestamptz;
    first_day timestamptz;
    legacy text;
BEGIN
    SET LOCAL timezone = 'UTC';
    SELECT max(received_at) INTO newest FROM dlr_partitions.receptions_unpartitioned;
    first_day := CASE WHEN newest IS NULL THEN date_trunc('day', now())
                      ELSE date_trunc('day', greatest(newest, now())) + interval '1 day' END;
    legacy := 'receptions_before_' || to_char(first_day, 'YYYYMMDD');
    -- PostgreSQL scans the table once here, to prove every row lies below first_day.
    EXECUTE format('ALTER TABLE dlr.receptions ATTACH PARTITION'
                   ' dlr_partitions.receptions_unpartitioned FOR VALUES FROM (MINVALUE) TO (%L)',
                   first_day);
    EXECUTE format('ALTER TABLE dlr_partitions.receptions_unpartitioned RENAME TO %I', legacy);
    EXECUTE format('ALTER INDEX dlr_partitions.receptions_unpartitioned_pkey RENAME TO %I',
                   legacy || '_pkey');
    -- A week ahead; `dlrfeed maintain` keeps it so.
    PERFORM dlr.create_reception_partitions(first_day + interval '7 days');
END
$move$;

-- A reception of a day with no partition yet (maintain not run for a week) still lands; it
-- stays here, out of reach of retention, until the owner moves it (docs/retention.md).
CREATE TABLE dlr_partitions.receptions_default PARTITION OF dlr.receptions DEFAULT;
ALTER TABLE dlr_partitions.receptions_default
    ADD CONSTRAINT receptions_default_pkey PRIMARY KEY (login, message_id, id);

-- `r.*` is expanded when the view is created, as in 0003_receipt_json_on_read.sql.
CREATE VIEW dlr.receptions_readable AS
SELECT r.*, dlr.receipt_json(r.payload) AS payload_json
FROM dlr.receptions AS r;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with payload_json: the receipt in payload, as JSON (dlr.receipt_json)';

-- Privileges as in 0002_roles.sql on the new table; partitions are reached only through it.
REVOKE ALL ON dlr.receptions, dlr.receptions_readable, dlr.day_partitions FROM PUBLIC;
REVOKE ALL ON FUNCTION dlr.create_reception_partitions(timestamptz) FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        GRANT INSERT ON dlr.receptions TO dlrfeed_writer;
        -- As 0008 granted on the table this one replaces: late correlation replays the
        -- deliveries (P19), never reading the payload.
        GRANT SELECT (id, login, message_id, level, stat, err, done_date_raw, done_at,
                      received_at, fingerprint, flags, event_id)
              ON dlr.receptions TO dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.receptions, dlr.receptions_readable, dlr.day_partitions
            TO dlrfeed_reader;
    END IF;
END
$grants$;
