-- The events of a recorded message are keyed by its message row's id, not by its gateway id
-- again (docs/postgresql.md, "Where the WAL goes").
--
-- Every new event went into dlr.events' unique key (login, message_id, level): a random leaf of
-- the largest random-keyed index of the store, which after each checkpoint wrote that leaf
-- whole to the WAL. Once a store's keys outgrow memory, nearly every new message brought one
-- such image for its events (and one more for its own record), so the WAL per reception grew
-- with the store. From now on:
-- - An event whose own id names a message recorded after this migration (its id at least
--   dlr.message_events_first_message()) is kept in dlr.message_events, under that message
--   row's id and its level: an 8-byte key that follows the order messages are recorded in, so
--   its index grows near its right end. Its login and gateway id are its message's.
-- - Every other event - stored before this migration, or whose message is not recorded (yet),
--   or recorded before it - is kept where it was, in the table renamed dlr.event_rows (keyed by
--   login, gateway id and level as before; its key, identity, indexes and privileges go with
--   it). When a message is recorded after its events arrived, a trigger of dlr.messages moves
--   them (the same ids) to dlr.message_events, under the advisory lock that serialises their
--   writers, whatever records it.
--   So each event key is in exactly one of the two tables, which its message decides.
-- - dlr.events is the view of both, with the same columns in the same order: every reader
--   (`dlrfeed show`, reports, recompute, SQL consumers) reads the same answers as before.
-- - dlr.exceptions.event_id now names an event of either table, so its foreign key to the
--   renamed table gives way to a trigger that checks each exception written names a stored
--   event (P12: an exception never points at nothing).
-- Locks: SHARE ROW EXCLUSIVE on dlr.messages (its trigger: recording waits, the ingest's row
-- locks do not), ACCESS EXCLUSIVE on dlr.events (the rename) and dlr.exceptions (the key), held
-- to the commit. Every step is a catalog change (a rename, an empty table, views, functions,
-- triggers), so they are held for milliseconds whatever the tables' size. A dlrfeed process
-- from before it that is still running fails its next event write (the view takes none), with
-- nothing of that batch committed or acked; restarted, it refuses the newer schema (exit 78).

SET LOCAL lock_timeout = '5s';

-- The messages first, as 0020 did: recording waits from here (so no message is recorded between
-- the boundary below and the trigger that moves its events), the ingest's row locks do not; an
-- ingest holding the events is waited for next.
LOCK TABLE dlr.messages IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE dlr.events, dlr.exceptions IN ACCESS EXCLUSIVE MODE;

ALTER TABLE dlr.events RENAME TO event_rows;
COMMENT ON TABLE dlr.event_rows IS
    'the logical events (P14) whose message is not recorded, or was recorded before migration'
    ' 0024 (dlr.message_events_first_message()), keyed by login, gateway id and level; read'
    ' through the view dlr.events';

-- The first message id whose events are kept in dlr.message_events: past every id the
-- messages' sequence has given, committed or not, and every id stored, so the table of a
-- message's events never changes. A constant, IMMUTABLE, so every statement folds it when it is
-- planned.
DO $first$
BEGIN
    EXECUTE format(
        'CREATE FUNCTION dlr.message_events_first_message() RETURNS bigint'
        ' LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
        format('SELECT %s::bigint', 1 + greatest(
            coalesce(pg_sequence_last_value(
                pg_get_serial_sequence('dlr.messages', 'id')::regclass), 0),
            coalesce((SELECT max(id) FROM dlr.messages), 0))));
END
$first$;
COMMENT ON FUNCTION dlr.message_events_first_message() IS
    'the first dlr.messages.id whose events are kept in dlr.message_events (migration 0024);'
    ' the events of the messages before it, and of ids not recorded, are in dlr.event_rows';

-- Fixed-width columns first, widest first, then the variable ones: no alignment padding. The
-- ids are drawn from the same sequence as dlr.event_rows', so an event id names one event.
DO $table$
BEGIN
    EXECUTE format($sql$
        CREATE TABLE dlr.message_events (
            id bigint PRIMARY KEY DEFAULT nextval(%L::regclass),
            message_ref bigint NOT NULL,
            level bigint NOT NULL,
            first_received_at timestamptz NOT NULL,
            last_received_at timestamptz,
            done_at timestamptz,
            times_received integer NOT NULL DEFAULT 1,
            conflicting_receptions integer NOT NULL DEFAULT 0,
            stat text NOT NULL,
            status text NOT NULL,
            err text,
            done_date_raw text,
            fingerprint text NOT NULL,
            correlation_id text,
            flags text[],
            updates text[],
            parser_version text NOT NULL,
            rules_version text NOT NULL,
            CONSTRAINT message_events_key UNIQUE (message_ref, level)
        )$sql$, pg_get_serial_sequence('dlr.event_rows', 'id'));
END
$table$;
-- Events correlated to another id than their own (only with receipt_ids_hex), as 0005 indexes
-- them in dlr.event_rows: late correlation and recompute find them by it.
CREATE INDEX message_events_correlation_id_idx ON dlr.message_events (correlation_id)
    WHERE correlation_id IS NOT NULL;
COMMENT ON TABLE dlr.message_events IS
    'the logical events (P14) whose own id names a message recorded after migration 0024,'
    ' keyed by that message''s row id (dlr.messages.id) and level; read through the view'
    ' dlr.events';
COMMENT ON COLUMN dlr.message_events.correlation_id IS
    'the id the event is correlated by (P10); NULL: its own id, its message''s gateway id';

-- The same columns in the same order as the table had.
CREATE VIEW dlr.events AS
SELECT e.id, e.login, e.message_id, e.correlation_id, e.level, e.stat, e.status, e.err,
       e.done_date_raw, e.done_at, e.fingerprint, e.flags, e.times_received,
       e.conflicting_receptions, e.parser_version, e.rules_version, e.first_received_at,
       e.last_received_at, e.updates
FROM dlr.event_rows AS e
UNION ALL
SELECT e.id, m.login, m.message_id, e.correlation_id, e.level, e.stat, e.status, e.err,
       e.done_date_raw, e.done_at, e.fingerprint, e.flags, e.times_received,
       e.conflicting_receptions, e.parser_version, e.rules_version, e.first_received_at,
       e.last_received_at, e.updates
FROM dlr.message_events AS e
JOIN dlr.messages AS m ON m.id = e.message_ref;
COMMENT ON VIEW dlr.events IS
    'the logical events (P14), unique by login, gateway id and level: those of dlr.event_rows'
    ' and of dlr.message_events (migration 0024), with the same columns';

-- The two views of the receptions read every event, of either table (as 0021 defined them).
CREATE OR REPLACE VIEW dlr.receptions AS
SELECT r.id,
       CASE WHEN r.level IS NULL THEN e.login ELSE r.login END AS login,
       CASE WHEN r.level IS NULL THEN e.message_id ELSE r.message_id END AS message_id,
       coalesce(r.level, e.level) AS level,
       r.stat, r.err, r.submit_date_raw, r.submit_at, r.done_date_raw, r.done_at,
       r.delivery_count, r.received_at, r.stored_at, r.payload, r.flags, r.outcome,
       r.event_id, r.parser_version, r.fingerprint, r.channel, r.peer
FROM dlr.reception_rows AS r
LEFT JOIN dlr.events AS e ON r.level IS NULL AND e.id = r.event_id;

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

-- An exception's event is one of either table, so the foreign key to the renamed table gives
-- way to a trigger that refuses, as it did, an exception written with an event that is not
-- stored (P12: it never points at nothing). Each event probed by its primary key, as its own
-- subquery (OFFSET 0), so that no plan, whatever the statistics, scans a table per row. An
-- event leaves only by forgetting, which deletes the closed exceptions that name it first and
-- keeps every message an open one names (dlrfeed.store.retention); the move below puts back
-- every row it takes.
ALTER TABLE dlr.exceptions DROP CONSTRAINT exceptions_event_id_fkey;
CREATE FUNCTION dlr.check_exception_event() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_exceptions AS x
               WHERE x.event_id IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM dlr.event_rows AS e
                                 WHERE e.id = x.event_id OFFSET 0)
                 AND NOT EXISTS (SELECT 1 FROM dlr.message_events AS e
                                 WHERE e.id = x.event_id OFFSET 0)) THEN
        RAISE EXCEPTION 'an exception names an event that is not stored'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER exceptions_event_stored
    AFTER INSERT ON dlr.exceptions
    REFERENCING NEW TABLE AS new_exceptions
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.check_exception_event();

-- Recording a message moves the events that arrived before it (dlr.event_rows) to where its
-- later events go (dlr.message_events): the same rows, the same ids, each event still stored
-- once. A trigger of dlr.messages does it, in the statement that records the message, so that
-- whatever records one - this dlrfeed, one from before this migration still running, an
-- operator - moves its events: no key is ever left in the table its message does not decide.
-- Every writer of an id's events holds that id's advisory lock or its message row's lock, and
-- recording takes the advisory lock first, so no event of it is written meanwhile. The writer
-- may not delete an event (P13 keeps DELETE for the owner): the function is the owner's. Each
-- message probes the key of dlr.event_rows once (OFFSET 0: whatever the statistics say), and
-- each statement is planned for the rows it is given.
CREATE FUNCTION dlr.move_events_to_messages() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    WITH moved AS (
        DELETE FROM dlr.event_rows AS e
        USING (
            SELECT x.id, m.id AS ref
            FROM recorded AS m
            CROSS JOIN LATERAL (
                SELECT x.id FROM dlr.event_rows AS x
                WHERE x.login = m.login AND x.message_id = m.message_id
                OFFSET 0
            ) AS x
            WHERE m.id >= dlr.message_events_first_message()
        ) AS k
        WHERE e.id = k.id
        RETURNING e.*, k.ref
    )
    INSERT INTO dlr.message_events (
        id, message_ref, level, first_received_at, last_received_at, done_at, times_received,
        conflicting_receptions, stat, status, err, done_date_raw, fingerprint, correlation_id,
        flags, updates, parser_version, rules_version)
    SELECT m.id, m.ref, m.level, m.first_received_at, m.last_received_at, m.done_at,
           m.times_received, m.conflicting_receptions, m.stat, m.status, m.err,
           m.done_date_raw, m.fingerprint,
           -- Its own id, written out before migration 0016: NULL, as it is written now.
           nullif(m.correlation_id, m.message_id), m.flags, m.updates, m.parser_version,
           m.rules_version
    FROM moved AS m;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION dlr.move_events_to_messages() FROM PUBLIC;
CREATE TRIGGER messages_take_their_events
    AFTER INSERT ON dlr.messages
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.move_events_to_messages();

-- The writer inserts events (their ids drawn in arrival order from the one sequence) and
-- updates their delivery counters (P14); the reader reads.
REVOKE ALL ON dlr.message_events, dlr.events FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        GRANT SELECT, INSERT,
              UPDATE (times_received, conflicting_receptions, last_received_at, updates)
              ON dlr.message_events TO dlrfeed_writer;
        GRANT USAGE ON SEQUENCE dlr.events_id_seq TO dlrfeed_writer;
        GRANT SELECT ON dlr.events TO dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.message_events, dlr.events TO dlrfeed_reader;
    END IF;
END
$grants$;
