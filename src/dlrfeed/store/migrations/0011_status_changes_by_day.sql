-- The status-change log (dlr.status_changes, 0009) joins the evidence's retention by whole
-- days (0010, docs/retention.md): partitioned by range of changed_at, one partition per UTC
-- day, in schema dlr_partitions, named as the receptions' are (status_changes_YYYYMMDD,
-- status_changes_before_YYYYMMDD, status_changes_default).
--
-- Nothing a reader relies on changes. The triggers of 0009 write into dlr.status_changes by
-- name, now the partitioned parent; a row lands in the partition of its writing transaction's
-- day. Positions are still drawn as 0009 says, so the gap-free read rule (positions below the
-- oldest running transaction's horizon) holds across partitions: it orders by position, never
-- by partition. The key (position, changed_at) holds the partition key, so the parent keeps
-- its primary key and its index on (login, message_id, position); every partition gets both.
--
-- An installed log is moved without copying a row, as 0010 moved the receptions: the existing
-- table becomes the first partition, holding everything changed before the day after the
-- newest change (or today). ATTACH reads it once to prove the bound and adopts its two indexes
-- as the parent's (nothing is rebuilt), under a lock that holds writers of statuses back
-- meanwhile: stop the daemons before migrating (docs/systemd.md).

ALTER TABLE dlr.status_changes RENAME TO status_changes_unpartitioned;
ALTER TABLE dlr.status_changes_unpartitioned RENAME CONSTRAINT status_changes_pkey
    TO status_changes_unpartitioned_pkey;
ALTER INDEX dlr.status_changes_message_idx RENAME TO status_changes_unpartitioned_message_idx;
ALTER TABLE dlr.status_changes_unpartitioned SET SCHEMA dlr_partitions;

CREATE TABLE dlr.status_changes (
    LIKE dlr_partitions.status_changes_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (position, changed_at)
) PARTITION BY RANGE (changed_at);
CREATE INDEX status_changes_message_idx ON dlr.status_changes (login, message_id, position);
COMMENT ON TABLE dlr.status_changes IS
    'one row per change of a message''s computed status (docs/changes.md), partitioned by UTC'
    ' day of changed_at';

-- One partition of dlr.status_changes per UTC day from the end of the newest one (today on a
-- table with none) up to `through`; returns the names created. The indexes come from the
-- parent. Run by the owner (`dlrfeed maintain` creates days ahead).
CREATE FUNCTION dlr.create_status_change_partitions(through timestamptz) RETURNS SETOF text
LANGUAGE plpgsql SET timezone = 'UTC' AS $fn$
DECLARE
    day timestamptz;
    name text;
BEGIN
    SELECT coalesce(max(p.upper_bound), date_trunc('day', now())) INTO day
    FROM dlr.day_partitions AS p WHERE p.parent_table = 'status_changes';
    WHILE day < through LOOP
        name := 'status_changes_' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_changes'
                       ' FOR VALUES FROM (%L) TO (%L)', name, day, day + interval '1 day');
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
    SELECT max(changed_at) INTO newest FROM dlr_partitions.status_changes_unpartitioned;
    first_day := CASE WHEN newest IS NULL THEN date_trunc('day', now())
                      ELSE date_trunc('day', greatest(newest, now())) + interval '1 day' END;
    legacy := 'status_changes_before_' || to_char(first_day, 'YYYYMMDD');
    -- PostgreSQL scans the table once here, to prove every row lies below first_day, and
    -- attaches its two indexes to the parent's (they match column for column).
    EXECUTE format('ALTER TABLE dlr.status_changes ATTACH PARTITION'
                   ' dlr_partitions.status_changes_unpartitioned'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', first_day);
    EXECUTE format('ALTER TABLE dlr_partitions.status_changes_unpartitioned RENAME TO %I',
                   legacy);
    EXECUTE format('ALTER INDEX dlr_partitions.status_changes_unpartitioned_pkey RENAME TO %I',
                   legacy || '_pkey');
    EXECUTE format('ALTER INDEX dlr_partitions.status_changes_unpartitioned_message_idx'
                   ' RENAME TO %I', legacy || '_message_idx');
    -- A week ahead, as for the receptions; `dlrfeed maintain` keeps it so.
    PERFORM dlr.create_status_change_partitions(first_day + interval '7 days');
END
$move$;

-- A change of a day with no partition yet still lands; it stays here, out of reach of
-- retention, until the owner moves it (docs/retention.md).
CREATE TABLE dlr_partitions.status_changes_default PARTITION OF dlr.status_changes DEFAULT;

-- The writers' epoch lookup (0009: a change's epoch is raised to the epoch of the message's
-- previous change when that is larger) would probe every day's partition for every change:
-- measured 4x the CPU of a status write at 100 partitions. It needs only the days near now.
-- Why: a raise happens only when the message's latest change C has an epoch E above our own
-- transaction id X. E is the id of the transaction W0 that started C's chain (epochs are only
-- ever inherited along one message's changes, each written after the one before under the
-- row lock), and E > X means W0's id was assigned after ours, which was assigned after our
-- transaction began (now()). Each change is stamped with the clock as its writer's trigger
-- runs (clock_timestamp(), after the status write that assigned the writer's id), so C, the
-- last of the chain, has changed_at >= W0's id assignment > now(). Looking only at changes
-- with changed_at >= now() therefore finds C whenever it matters; an older latest change has
-- an epoch below X and greatest() takes X anyway. And C was written before we could lock the
-- message, so before our clock_timestamp(). The hour of margin on either side covers a step
-- of the server's clock (NTP); beyond that a raise could be missed and per-message order
-- rests on the tick alone, which still grows in real time (0009, point 2). So the lookup
-- probes the partitions of today and at most its neighbour, however many days are kept.
-- changed_at is thus the time the change was written, within its transaction.
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
    ELSE
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

-- Privileges as in 0009 on the new table: read by the reader, written only through the
-- SECURITY DEFINER trigger function; partitions are reached only through the parent.
REVOKE ALL ON dlr.status_changes FROM PUBLIC;
REVOKE ALL ON FUNCTION dlr.create_status_change_partitions(timestamptz) FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.status_changes TO dlrfeed_reader;
    END IF;
END
$grants$;
