-- Each message's change order kept on its status row, so the change log needs no per-message
-- index (docs/postgresql.md, "The change log without a per-message index").
-- A change's position is epoch * 10^19 + tick, its epoch at least the writing transaction's id
-- and at least the epoch of the message's previous change (0009). The writers found that
-- previous epoch in the log itself, through a B-tree of (login, message_id, position): ~106
-- bytes per change, and, its keys being random, most of its leaves came back into the WAL as
-- full-page images after every checkpoint, the largest share of a grown store's WAL under
-- PostgreSQL's default checkpoints. Now:
-- - dlr.message_status.change_epoch holds the epoch of the row's latest write. A BEFORE row
--   trigger sets it on every write, whoever writes: the greater of the writing transaction's id
--   and the row's previous value. The writers of one message hold its row lock one after the
--   other (P16), so the values grow in the order of its changes, exactly as the lookup's did.
-- - A row deleted by a recompute (a withdrawal, 0012) takes its value with it, and the message
--   may get a status again: so a change's epoch is also at least that of the message's latest
--   withdrawal of the last hour (the bound 0011's lookup had), read from the log through a
--   partial index of withdrawals only (status NULL: a recompute's, rare), once per statement.
-- - Rows that exist now get, as their change_epoch, a constant above the epoch of every change
--   already written: this transaction's own id, taken once the two tables are locked (so after
--   every writer that wrote a change before it), or the snapshot's horizon if that is larger.
-- Locks: ACCESS EXCLUSIVE on dlr.message_status and dlr.status_changes with its days, held to the
-- commit: adding the column rewrites nothing (its value for the stored rows is a constant), the
-- B-tree's drop reads nothing, and the partial index is built on the days the trigger can
-- still read (today's is read once, well under a second per million changes of the day:
-- docs/retention.md, "Migration 0017"). lock_timeout bounds the wait for the locks, as in 0016.

SET LOCAL lock_timeout = '5s';

LOCK TABLE dlr.message_status, dlr.status_changes IN ACCESS EXCLUSIVE MODE;

DO $column$
BEGIN
    EXECUTE format('ALTER TABLE dlr.message_status ADD COLUMN change_epoch numeric NOT NULL'
                   ' DEFAULT %s',
                   greatest(pg_current_xact_id()::text::numeric,
                            pg_snapshot_xmax(pg_current_snapshot())::text::numeric));
    -- The trigger below sets every new value; the constant stays only with the stored rows.
    ALTER TABLE dlr.message_status ALTER COLUMN change_epoch DROP DEFAULT;
END
$column$;
COMMENT ON COLUMN dlr.message_status.change_epoch IS
    'at least the epoch of this message''s latest status change (its position div 10^19,'
    ' migration 0017): raised by a trigger on every write of the row, whatever the writer sets';

DROP INDEX dlr.status_changes_message_idx;

-- The withdrawals of a message in order, on each day the trigger can read. Partial: a withdrawal
-- is a recompute's exception, so the index stays a few pages whatever the log's size.
CREATE OR REPLACE FUNCTION dlr.create_status_change_partitions(through timestamptz)
RETURNS SETOF text
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
        EXECUTE format('CREATE INDEX %I ON dlr_partitions.%I (login, message_id, position)'
                       ' WHERE status IS NULL', name || '_withdrawn', name);
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

-- Of the days that exist, those the trigger can still read: the days that end less than an
-- hour ago, the days ahead and the default partition. Older days keep no index by message:
-- nothing reads them by message.
DO $index$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT partition_name FROM dlr.day_partitions
        WHERE parent_table = 'status_changes'
          AND (is_default OR upper_bound > now() - interval '1 hour')
    LOOP
        EXECUTE format('CREATE INDEX %I ON dlr_partitions.%I (login, message_id, position)'
                       ' WHERE status IS NULL', part.partition_name || '_withdrawn',
                       part.partition_name);
    END LOOP;
END
$index$;

-- BEFORE INSERT OR UPDATE, per row: the row's change_epoch (above), whatever the writer put
-- there. No table read, no privilege needed: it runs as the writer, cheaply, once per status
-- written, without the per-call cost of SECURITY DEFINER and SET search_path. So every name in
-- it is qualified: a writer's search_path (its pg_temp schema first) must not be able to
-- bend the value, say with a temporary type named text.
CREATE FUNCTION dlr.keep_change_epoch() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    own_epoch pg_catalog.numeric :=
        pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.numeric;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        NEW.change_epoch := greatest(own_epoch, OLD.change_epoch);
    ELSE
        NEW.change_epoch := own_epoch;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER message_status_change_epoch
    BEFORE INSERT OR UPDATE ON dlr.message_status
    FOR EACH ROW EXECUTE FUNCTION dlr.keep_change_epoch();

-- The epoch of a message's latest withdrawal written in [since, before), if any: a probe of the
-- withdrawals' index. LANGUAGE sql, STABLE, no SET: inlined into the statement that calls it,
-- so each change statement plans it once with the day partitions pruned.
CREATE FUNCTION dlr.latest_withdrawal(
    login text, message_id text, since timestamptz, before timestamptz)
RETURNS TABLE (epoch numeric)
LANGUAGE sql STABLE AS $$
    SELECT trunc(max(c.position) / 1e19)
    FROM dlr.status_changes AS c
    WHERE c.login = $1 AND c.message_id = $2 AND c.status IS NULL
          AND c.changed_at >= $3 AND c.changed_at < $4
$$;
REVOKE ALL ON FUNCTION dlr.latest_withdrawal(text, text, timestamptz, timestamptz) FROM PUBLIC;

-- Restated from 0012: each change's epoch is now its row's change_epoch, raised to the
-- message's latest withdrawal of the last hour when that is larger (and, should anything have
-- bent the row's value, never below the writing transaction's id).
CREATE OR REPLACE FUNCTION dlr.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written_at timestamptz := clock_timestamp();
    recent timestamptz := now() - interval '1 hour';
    horizon timestamptz := written_at + interval '1 hour';
    written bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
            ON true;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Only real changes: a rewrite that keeps status, finality and reason writes nothing.
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason,
               n.supporting_event_id, n.rules_version, o.status, o.is_final, o.reason
        FROM new_rows AS n
        JOIN old_rows AS o USING (login, message_id)
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
            ON true
        WHERE (n.status, n.is_final, n.reason) IS DISTINCT FROM (o.status, o.is_final, o.reason);
    ELSE
        -- DELETE: the status withdrawn (0012). The recompute's audit row of this transaction
        -- (same now()) names why and under which rules.
        INSERT INTO dlr.status_changes (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason)
        SELECT greatest(own_epoch, o.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, o.login, o.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, o.reason
        FROM old_rows AS o
        LEFT JOIN LATERAL dlr.latest_withdrawal(o.login, o.message_id, recent, horizon) AS w
            ON true
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
