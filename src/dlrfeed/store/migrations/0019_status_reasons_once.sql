-- Each message's status names its reason by id, as the change log does since 0018
-- (docs/scaling.md, "Where the bytes go").
--
-- A status row stored its reason as text, ~55 bytes of a ~240-byte row, and an empty flags
-- array, 13 bytes more; the row is rewritten at every change of the message, so its dead
-- versions carry them too. From now on:
-- - The rows live in dlr.message_status_rows (the table, renamed: its key, triggers,
--   statistics and privileges go with it). A status written from now on names its reason by
--   id in dlr.reasons (reason_id) and leaves the text NULL; a status stored before keeps its
--   text until it is next written, and so does a reason the dictionary has no id for (too long,
--   the dictionary full, or met by a REPEATABLE READ writer after another added it: 0018).
--   No flags is NULL, not an empty array.
-- - dlr.message_status is a view with the table's columns in their order, the reason as its
--   text and the flags as an array: every reader (`dlrfeed show`, stats, reports, SQL
--   consumers) reads the same answers as before. It is simple, so DELETE through it still
--   works (recompute and forgetting delete statuses by that name); the ingest, the late
--   correlation and the recompute write the rows table, resolving reasons through
--   dlr.reason_ids once per statement.
-- - The change log's trigger copies a change's reason as the row holds it (an id, or a text),
--   instead of looking each text up again.
-- Locks: ACCESS EXCLUSIVE on dlr.message_status, held to the commit. Every step is a catalog
-- change (the new column is NULL, dropping NOT NULL checks nothing, a rename moves no row), so
-- it is held for milliseconds whatever the table's size; reads wait that long too.
-- lock_timeout bounds the wait for it, as in 0016-0018. A dlrfeed process from before it that
-- is still running fails its next status write (it writes the view), with nothing of that
-- batch committed or acked; restarted, it refuses the newer schema (exit 78, docs/systemd.md).

SET LOCAL lock_timeout = '5s';

LOCK TABLE dlr.message_status IN ACCESS EXCLUSIVE MODE;

ALTER TABLE dlr.message_status RENAME TO message_status_rows;
ALTER TABLE dlr.message_status_rows
    ALTER COLUMN reason DROP NOT NULL,
    ALTER COLUMN flags DROP NOT NULL,
    ALTER COLUMN flags DROP DEFAULT,
    ADD COLUMN reason_id integer;
COMMENT ON COLUMN dlr.message_status_rows.reason_id IS
    'dlr.reasons.id of the reason (migration 0019); NULL when the text is in column reason';
COMMENT ON COLUMN dlr.message_status_rows.flags IS
    'the status''s flags; NULL when it has none (migration 0019)';

-- Every status has its reason, as text or by id, not both (the text would hide the id's):
-- checked on every row written from now on (NOT VALID: the stored rows all have their text,
-- and proving it would read the table under the lock). That an id is the dictionary's is
-- checked by the change log's trigger (below), not by a foreign key, whose row locks would
-- make the dictionary's busiest rows a write of every status.
ALTER TABLE dlr.message_status_rows
    ADD CONSTRAINT message_status_rows_reason_check
    CHECK (num_nonnulls(reason, reason_id) = 1) NOT VALID;

CREATE VIEW dlr.message_status AS
SELECT s.login, s.message_id, s.status, s.is_final,
       dlr.reason_text(s.reason, s.reason_id) AS reason,
       s.supporting_event_id, s.repeats, s.conflicts, s.progress_events, s.deadline_superseded,
       s.rules_version, s.updated_at, s.supporting_reception_id, s.basis_level, s.basis_stat,
       s.basis_err, s.basis_done_at, coalesce(s.flags, '{}') AS flags, s.change_epoch
FROM dlr.message_status_rows AS s;
COMMENT ON VIEW dlr.message_status IS
    'the computed status of each correlated message (P7), its reason as text (migration 0019)';

-- Restated from 0018: never past the bound, however many texts one call brings (it was
-- checked once, before a call's whole set was added).
CREATE OR REPLACE FUNCTION dlr.add_reasons(candidates text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    missing text[];
    room bigint := 100000 - coalesce(pg_sequence_last_value('dlr.reasons_id_seq'::regclass), 0);
BEGIN
    SELECT array_agg(c.reason ORDER BY c.reason) INTO missing
    FROM unnest(candidates) AS c (reason)
    WHERE octet_length(c.reason) <= 1000
      AND NOT EXISTS (SELECT 1 FROM dlr.reasons AS r WHERE r.reason = c.reason);
    IF missing IS NULL OR room <= 0 THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO dlr.reasons (reason)
        SELECT m.reason FROM unnest(missing) WITH ORDINALITY AS m (reason, n)
        ORDER BY m.n LIMIT room
        ON CONFLICT (reason) DO NOTHING;
    EXCEPTION WHEN serialization_failure THEN
        NULL;  -- the statuses and changes keep these texts in their rows
    END;
END;
$$;

-- The ids of those of `texts` the dictionary holds, after adding those it lacks and may take
-- (dlr.add_reasons, 0018). Its second statement takes its own snapshot (READ COMMITTED), so
-- it sees a text another transaction added meanwhile. For the status writers, who may not
-- write the dictionary themselves: one call per statement, whatever its rows.
CREATE FUNCTION dlr.reason_ids(texts text[]) RETURNS TABLE (reason text, id integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM dlr.add_reasons(texts);
    RETURN QUERY SELECT r.reason, r.id FROM dlr.reasons AS r WHERE r.reason = ANY (texts);
END;
$$;
REVOKE ALL ON FUNCTION dlr.reason_ids(text[]) FROM PUBLIC;

-- A status may name only an id the dictionary gave: the writer role writes reason_id, and a
-- change logged with an id not yet drawn would later read whatever text is given it.
CREATE FUNCTION dlr.check_reason_ids(ids integer[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unknown integer;
BEGIN
    SELECT i INTO unknown FROM unnest(ids) AS i
    WHERE NOT EXISTS (SELECT 1 FROM dlr.reasons AS r WHERE r.id = i)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a status names reason id %, which dlr.reasons does not hold', unknown;
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION dlr.check_reason_ids(integer[]) FROM PUBLIC;

-- Restated from 0018: a change takes its reason as the status row holds it, by id or as text,
-- and the previous reason as the previous row held it. A row stored before this migration holds
-- its text; the change it is replaced by names that text by id where the dictionary has one,
-- as 0018 did. A rewrite that keeps status, finality and reason writes nothing: two ids are
-- the same reason exactly when they are equal (a text has one id), and a text is compared with
-- a text or an id by what they read.
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
        PERFORM dlr.check_reason_ids(ARRAY(
            SELECT DISTINCT n.reason_id FROM new_rows AS n WHERE n.reason_id IS NOT NULL));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason, reason_id,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
            ON true;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM dlr.check_reason_ids(ARRAY(
            SELECT DISTINCT n.reason_id FROM new_rows AS n WHERE n.reason_id IS NOT NULL));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason, reason_id,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version, o.status, o.is_final,
               CASE WHEN ro.id IS NULL THEN o.reason END, coalesce(o.reason_id, ro.id)
        FROM new_rows AS n
        JOIN old_rows AS o USING (login, message_id)
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
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
               written_at, o.login, o.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, CASE WHEN ro.id IS NULL THEN o.reason END,
               coalesce(o.reason_id, ro.id)
        FROM old_rows AS o
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
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

-- Privileges: the writer and the reader read the view (its reasons from the dictionary); the
-- writer writes the rows table, which keeps its grants through the rename, resolving reasons
-- through dlr.reason_ids. Only the schema's owner deletes or locks rows through the view (the
-- recompute, forgetting). A site role granted SELECT on the table keeps it on the rows table;
-- to read the view it needs SELECT on dlr.message_status and dlr.reasons.
REVOKE ALL ON dlr.message_status FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        GRANT SELECT ON dlr.message_status, dlr.reasons TO dlrfeed_writer;
        GRANT EXECUTE ON FUNCTION dlr.reason_ids(text[]) TO dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.message_status TO dlrfeed_reader;
    END IF;
END
$grants$;
