-- Each message's status is keyed by its message row's id, not by its gateway id again
-- (docs/scaling.md, "Where the bytes go").
--
-- A status row repeated its message's login and gateway id (~42 bytes of a ~184-byte row) and
-- kept its own random-keyed index on them (~45 bytes per reception), whose leaves every new
-- status read and, after each checkpoint, wrote whole to the WAL. The status of a message is
-- now kept in dlr.statuses under dlr.messages.id (message_ref): an 8-byte key that follows the
-- order messages are recorded in, so its index grows at its right end like a log, and the row
-- is laid out with no alignment padding. From now on:
-- - A message recorded after this migration (its id at least dlr.statuses_first_message())
--   keeps its status in dlr.statuses. One recorded before keeps it where it was, in the table
--   renamed dlr.earlier_statuses (keyed by login and gateway id as before; its key, triggers,
--   fillfactor and privileges go with it), for as long as it is kept: no row is moved or
--   rewritten, and forgetting empties that table with time.
-- - dlr.message_status is the view of both, with the same columns in the same order: every
--   reader (`dlrfeed show`, stats, reports, the ingest's probe, SQL consumers) reads the same
--   answers as before. UPDATE and DELETE through it still work (INSTEAD OF triggers change
--   the row in its table); row locks through it do not (the message row's lock is what
--   serialises a message's status writes).
-- - The change log's trigger on dlr.statuses names each change's message by its login and
--   gateway id, read from the message row, so the log reads as before.
-- Locks: ACCESS EXCLUSIVE on dlr.message_status's rows table (as 0019), and SHARE ROW
-- EXCLUSIVE on dlr.messages for its new trigger (recording waits; the ingest's row locks do
-- not), held to the commit. Every step is a catalog change (a rename, an empty table, a view,
-- functions, triggers), so they are held for milliseconds whatever the tables' size. A dlrfeed process from before it that is still
-- running fails its next status write (the table it writes is renamed), with nothing of that
-- batch committed or acked; restarted, it refuses the newer schema (exit 78).

SET LOCAL lock_timeout = '5s';

LOCK TABLE dlr.message_status_rows IN ACCESS EXCLUSIVE MODE;

ALTER TABLE dlr.message_status_rows RENAME TO earlier_statuses;
COMMENT ON TABLE dlr.earlier_statuses IS
    'the status of each message recorded before migration 0020 (dlr.statuses_first_message()),'
    ' keyed by login and gateway id; read through the view dlr.message_status';

-- The first message id whose status is kept in dlr.statuses: past every id the messages'
-- sequence has given, committed or not, and every id stored (a restored or replicated store's
-- sequence may lag its rows), so a message's table never changes. A constant, IMMUTABLE, so
-- every statement folds it when it is planned.
DO $first$
BEGIN
    EXECUTE format(
        'CREATE FUNCTION dlr.statuses_first_message() RETURNS bigint'
        ' LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
        format('SELECT %s::bigint', 1 + greatest(
            coalesce(pg_sequence_last_value(
                pg_get_serial_sequence('dlr.messages', 'id')::regclass), 0),
            coalesce((SELECT max(id) FROM dlr.messages), 0))));
END
$first$;
COMMENT ON FUNCTION dlr.statuses_first_message() IS
    'the first dlr.messages.id whose status is kept in dlr.statuses (migration 0020); the'
    ' messages before it keep theirs in dlr.earlier_statuses';

-- A status names its message by this id from now on, so the id never changes. (The writer holds
-- UPDATE on it only to take the correlation lock, FOR NO KEY UPDATE, which fires no trigger;
-- docs/security.md.)
CREATE FUNCTION dlr.refuse_new_message_id() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'a message''s id does not change: its status is kept under it';
END;
$$;
CREATE TRIGGER messages_id_fixed
    BEFORE UPDATE OF id ON dlr.messages
    FOR EACH ROW WHEN (NEW.id IS DISTINCT FROM OLD.id)
    EXECUTE FUNCTION dlr.refuse_new_message_id();

-- Fixed-width columns first, widest first, then the variable ones: no alignment padding.
CREATE TABLE dlr.statuses (
    message_ref bigint PRIMARY KEY,
    supporting_event_id bigint NOT NULL,
    supporting_reception_id bigint,
    basis_level bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    basis_done_at timestamptz,
    repeats integer NOT NULL DEFAULT 0,
    conflicts integer NOT NULL DEFAULT 0,
    progress_events integer NOT NULL DEFAULT 0,
    reason_id integer,
    is_final boolean NOT NULL,
    deadline_superseded boolean NOT NULL DEFAULT false,
    status text NOT NULL,
    rules_version text NOT NULL,
    basis_stat text,
    basis_err text,
    reason text,
    flags text[],
    change_epoch numeric NOT NULL,
    CONSTRAINT statuses_reason_check CHECK (num_nonnulls(reason, reason_id) = 1)
) WITH (fillfactor = 80);  -- room for HOT updates: the row is rewritten as events arrive
COMMENT ON TABLE dlr.statuses IS
    'the computed status of each correlated message (P7) recorded since migration 0020, keyed'
    ' by its dlr.messages.id; read through the view dlr.message_status';
COMMENT ON COLUMN dlr.statuses.message_ref IS 'dlr.messages.id of the message';
COMMENT ON COLUMN dlr.statuses.reason_id IS
    'dlr.reasons.id of the reason; NULL when the text is in column reason';
COMMENT ON COLUMN dlr.statuses.flags IS 'the status''s flags; NULL when it has none';

CREATE TRIGGER statuses_change_epoch
    BEFORE INSERT OR UPDATE ON dlr.statuses
    FOR EACH ROW EXECUTE FUNCTION dlr.keep_change_epoch();

CREATE OR REPLACE VIEW dlr.message_status AS
SELECT m.login, m.message_id, s.status, s.is_final,
       dlr.reason_text(s.reason, s.reason_id) AS reason,
       s.supporting_event_id, s.repeats, s.conflicts, s.progress_events, s.deadline_superseded,
       s.rules_version, s.updated_at, s.supporting_reception_id, s.basis_level, s.basis_stat,
       s.basis_err, s.basis_done_at, coalesce(s.flags, '{}') AS flags, s.change_epoch
FROM dlr.statuses AS s
JOIN dlr.messages AS m ON m.id = s.message_ref
UNION ALL
SELECT s.login, s.message_id, s.status, s.is_final,
       dlr.reason_text(s.reason, s.reason_id) AS reason,
       s.supporting_event_id, s.repeats, s.conflicts, s.progress_events, s.deadline_superseded,
       s.rules_version, s.updated_at, s.supporting_reception_id, s.basis_level, s.basis_stat,
       s.basis_err, s.basis_done_at, coalesce(s.flags, '{}') AS flags, s.change_epoch
FROM dlr.earlier_statuses AS s;
COMMENT ON VIEW dlr.message_status IS
    'the computed status of each correlated message (P7): dlr.statuses and'
    ' dlr.earlier_statuses (migration 0020), the reason as text';

-- UPDATE and DELETE through the view, as before it (by the schema's owner: the writer and the
-- reader may not): the row of (login, message_id) is changed in, or leaves, whichever table
-- holds it, and that table's triggers keep its change epoch and write the change. Each takes
-- the message row's lock first, as every status write does, and an UPDATE changes only the
-- columns it set, on the row as it is then (the view's row may be older: a write committed
-- meanwhile is kept). A reason written through the view is kept as that text (the writers name
-- it by id); a status stays with its message. NULL, as for no row, when none was there.
CREATE FUNCTION dlr.update_message_status() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    message bigint;
BEGIN
    IF (NEW.login, NEW.message_id) IS DISTINCT FROM (OLD.login, OLD.message_id) THEN
        RAISE EXCEPTION 'a status stays with its message: its login and message_id do not change';
    END IF;
    SELECT m.id INTO message FROM dlr.messages AS m
    WHERE m.login = OLD.login AND m.message_id = OLD.message_id
    FOR NO KEY UPDATE;
    UPDATE dlr.statuses AS s SET
        status = CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status ELSE s.status END,
        is_final = CASE WHEN NEW.is_final IS DISTINCT FROM OLD.is_final THEN NEW.is_final ELSE s.is_final END,
        supporting_event_id = CASE WHEN NEW.supporting_event_id IS DISTINCT FROM OLD.supporting_event_id THEN NEW.supporting_event_id ELSE s.supporting_event_id END,
        repeats = CASE WHEN NEW.repeats IS DISTINCT FROM OLD.repeats THEN NEW.repeats ELSE s.repeats END,
        conflicts = CASE WHEN NEW.conflicts IS DISTINCT FROM OLD.conflicts THEN NEW.conflicts ELSE s.conflicts END,
        progress_events = CASE WHEN NEW.progress_events IS DISTINCT FROM OLD.progress_events THEN NEW.progress_events ELSE s.progress_events END,
        deadline_superseded = CASE WHEN NEW.deadline_superseded IS DISTINCT FROM OLD.deadline_superseded THEN NEW.deadline_superseded ELSE s.deadline_superseded END,
        rules_version = CASE WHEN NEW.rules_version IS DISTINCT FROM OLD.rules_version THEN NEW.rules_version ELSE s.rules_version END,
        updated_at = CASE WHEN NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN NEW.updated_at ELSE s.updated_at END,
        supporting_reception_id = CASE WHEN NEW.supporting_reception_id IS DISTINCT FROM OLD.supporting_reception_id THEN NEW.supporting_reception_id ELSE s.supporting_reception_id END,
        basis_level = CASE WHEN NEW.basis_level IS DISTINCT FROM OLD.basis_level THEN NEW.basis_level ELSE s.basis_level END,
        basis_stat = CASE WHEN NEW.basis_stat IS DISTINCT FROM OLD.basis_stat THEN NEW.basis_stat ELSE s.basis_stat END,
        basis_err = CASE WHEN NEW.basis_err IS DISTINCT FROM OLD.basis_err THEN NEW.basis_err ELSE s.basis_err END,
        basis_done_at = CASE WHEN NEW.basis_done_at IS DISTINCT FROM OLD.basis_done_at THEN NEW.basis_done_at ELSE s.basis_done_at END,
        reason = CASE WHEN NEW.reason IS DISTINCT FROM OLD.reason THEN NEW.reason ELSE s.reason END,
        reason_id = CASE WHEN NEW.reason IS DISTINCT FROM OLD.reason THEN NULL ELSE s.reason_id END,
        flags = CASE WHEN NEW.flags IS DISTINCT FROM OLD.flags THEN nullif(NEW.flags, '{}') ELSE s.flags END
    WHERE s.message_ref = message;
    IF NOT FOUND THEN
        UPDATE dlr.earlier_statuses AS s SET
            status = CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status ELSE s.status END,
            is_final = CASE WHEN NEW.is_final IS DISTINCT FROM OLD.is_final THEN NEW.is_final ELSE s.is_final END,
            supporting_event_id = CASE WHEN NEW.supporting_event_id IS DISTINCT FROM OLD.supporting_event_id THEN NEW.supporting_event_id ELSE s.supporting_event_id END,
            repeats = CASE WHEN NEW.repeats IS DISTINCT FROM OLD.repeats THEN NEW.repeats ELSE s.repeats END,
            conflicts = CASE WHEN NEW.conflicts IS DISTINCT FROM OLD.conflicts THEN NEW.conflicts ELSE s.conflicts END,
            progress_events = CASE WHEN NEW.progress_events IS DISTINCT FROM OLD.progress_events THEN NEW.progress_events ELSE s.progress_events END,
            deadline_superseded = CASE WHEN NEW.deadline_superseded IS DISTINCT FROM OLD.deadline_superseded THEN NEW.deadline_superseded ELSE s.deadline_superseded END,
            rules_version = CASE WHEN NEW.rules_version IS DISTINCT FROM OLD.rules_version THEN NEW.rules_version ELSE s.rules_version END,
            updated_at = CASE WHEN NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN NEW.updated_at ELSE s.updated_at END,
            supporting_reception_id = CASE WHEN NEW.supporting_reception_id IS DISTINCT FROM OLD.supporting_reception_id THEN NEW.supporting_reception_id ELSE s.supporting_reception_id END,
            basis_level = CASE WHEN NEW.basis_level IS DISTINCT FROM OLD.basis_level THEN NEW.basis_level ELSE s.basis_level END,
            basis_stat = CASE WHEN NEW.basis_stat IS DISTINCT FROM OLD.basis_stat THEN NEW.basis_stat ELSE s.basis_stat END,
            basis_err = CASE WHEN NEW.basis_err IS DISTINCT FROM OLD.basis_err THEN NEW.basis_err ELSE s.basis_err END,
            basis_done_at = CASE WHEN NEW.basis_done_at IS DISTINCT FROM OLD.basis_done_at THEN NEW.basis_done_at ELSE s.basis_done_at END,
            reason = CASE WHEN NEW.reason IS DISTINCT FROM OLD.reason THEN NEW.reason ELSE s.reason END,
            reason_id = CASE WHEN NEW.reason IS DISTINCT FROM OLD.reason THEN NULL ELSE s.reason_id END,
            flags = CASE WHEN NEW.flags IS DISTINCT FROM OLD.flags THEN nullif(NEW.flags, '{}') ELSE s.flags END
        WHERE s.login = OLD.login AND s.message_id = OLD.message_id;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER message_status_update
    INSTEAD OF UPDATE ON dlr.message_status
    FOR EACH ROW EXECUTE FUNCTION dlr.update_message_status();

CREATE FUNCTION dlr.delete_message_status() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    message bigint;
BEGIN
    SELECT m.id INTO message FROM dlr.messages AS m
    WHERE m.login = OLD.login AND m.message_id = OLD.message_id
    FOR NO KEY UPDATE;
    DELETE FROM dlr.statuses AS s WHERE s.message_ref = message;
    IF NOT FOUND THEN
        DELETE FROM dlr.earlier_statuses AS s
        WHERE s.login = OLD.login AND s.message_id = OLD.message_id;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END;
$$;
CREATE TRIGGER message_status_delete
    INSTEAD OF DELETE ON dlr.message_status
    FOR EACH ROW EXECUTE FUNCTION dlr.delete_message_status();

-- Restated from 0019: nothing to check, nothing read. Each status write fires the triggers of
-- both tables, one of them with no row (~50 µs a call before).
CREATE OR REPLACE FUNCTION dlr.check_reason_ids(ids integer[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unknown integer;
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    SELECT i INTO unknown FROM unnest(ids) AS i
    WHERE NOT EXISTS (SELECT 1 FROM dlr.reasons AS r WHERE r.id = i)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a status names reason id %, which dlr.reasons does not hold', unknown;
    END IF;
END;
$$;

-- The change log of dlr.statuses, as dlr.record_status_changes (0019) writes it for
-- dlr.earlier_statuses: each change names its message by login and gateway id, read from the
-- message row by its primary key (LATERAL ... OFFSET 0: one probe per row, never a join of
-- every message, whatever the estimate of the transition table).
CREATE FUNCTION dlr.record_statuses_changes() RETURNS trigger
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
               written_at, m.login, m.message_id, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = n.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
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
               written_at, m.login, m.message_id, n.status, n.is_final, n.reason, n.reason_id,
               n.supporting_event_id, n.rules_version, o.status, o.is_final,
               CASE WHEN ro.id IS NULL THEN o.reason END, coalesce(o.reason_id, ro.id)
        FROM new_rows AS n
        JOIN old_rows AS o USING (message_ref)
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = n.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
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
               written_at, m.login, m.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, CASE WHEN ro.id IS NULL THEN o.reason END,
               coalesce(o.reason_id, ro.id)
        FROM old_rows AS o
        CROSS JOIN LATERAL (
            SELECT m.login, m.message_id FROM dlr.messages AS m WHERE m.id = o.message_ref
            OFFSET 0
        ) AS m
        LEFT JOIN dlr.reasons AS ro ON o.reason_id IS NULL AND ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(m.login, m.message_id, recent, horizon) AS w
            ON true
        LEFT JOIN LATERAL (
            SELECT r.why, r.new_rules_version FROM dlr.status_recomputations AS r
            WHERE r.login = m.login AND r.message_id = m.message_id AND r.new_status IS NULL
                  AND r.recomputed_at = now()
            ORDER BY r.id DESC LIMIT 1
        ) AS a ON true
        ORDER BY m.login, m.message_id;
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
REVOKE ALL ON FUNCTION dlr.record_statuses_changes() FROM PUBLIC;

CREATE TRIGGER statuses_changes_insert
    AFTER INSERT ON dlr.statuses
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_statuses_changes();
CREATE TRIGGER statuses_changes_update
    AFTER UPDATE ON dlr.statuses
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_statuses_changes();
CREATE TRIGGER statuses_changes_delete
    AFTER DELETE ON dlr.statuses
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT WHEN (NOT dlr.forgetting())
    EXECUTE FUNCTION dlr.record_statuses_changes();

-- Privileges: the writer writes dlr.statuses as it wrote the statuses' table, and reads both
-- through the view (0019); the reader reads the view. Only the schema's owner deletes.
REVOKE ALL ON dlr.statuses FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        -- dlr.earlier_statuses kept its grants through the renames; stated here as well, so
        -- that running this block again on a store whose roles came after it grants them.
        GRANT SELECT, INSERT, UPDATE ON dlr.statuses, dlr.earlier_statuses TO dlrfeed_writer;
        GRANT SELECT ON dlr.message_status, dlr.reasons TO dlrfeed_writer;
        -- 0002's grant, run again, would name the view: the writer only reads it.
        REVOKE INSERT, UPDATE ON dlr.message_status FROM dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.statuses, dlr.earlier_statuses, dlr.message_status
            TO dlrfeed_reader;
    END IF;
END
$grants$;
