-- The evidence's index follows arrival instead of the message id (docs/scaling.md).
--
-- Each day partition of dlr.receptions had one index, its primary key (login, message_id, id).
-- With the gateway's ids random (UUIDs, hashes), every reception was inserted into a random
-- leaf of the day's index: the whole index was the working set, read back into the cache as
-- it outgrew it, and re-imaged in WAL by the first change after every checkpoint. Every reader
-- reaches receptions through their logical event (late correlation replays an event's
-- deliveries, `show` the deliveries of a message's events), so the key is now
-- (login, event_id, id). Event ids are drawn in the order each key is first delivered, so a
-- reception of a new event lands at the right edge of its login's range, and a repeat lands
-- beside the earlier deliveries of its event: the index is written like a log.
--
-- Partitions created from now on (dlr.create_reception_partitions) get the new key, as do the
-- empty partitions already created ahead and an empty default partition. A partition that
-- holds rows keeps its key: rebuilding it would hold ingest back for the whole build, and it
-- leaves by retention like any other day. Readers name both the message id and the event id,
-- so each partition is probed through whichever key it has.

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
                       ' PRIMARY KEY (login, event_id, id)', name, name || '_pkey');
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

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
                       ' ADD CONSTRAINT %I PRIMARY KEY (login, event_id, id)',
                       part.partition_name, part.key_name, part.key_name);
    END LOOP;
END
$rekey$;
