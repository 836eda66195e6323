-- The schema of dlrfeed, schema `dlr`: every table, key, view, function, trigger and grant.
--
-- A store starts here: `dlrfeed migrate` applies this file once, as schema version 1. A later
-- change is a further numbered file beside this one, and src/dlrfeed/store/schema.sql then
-- says the schema as it stands (docs/postgresql.md, "Changing the schema").
--
-- The map (PK: primary key, UQ: unique, → : refers to, by value; nothing here is a foreign
-- key constraint: a key is checked where it is written, inside the ingest transaction):
--
--   messages        PK id, UQ (login, message_id)        one row per sent message (P5)
--     ├─ message_events  PK id, UQ (message_ref, level)  events of a recorded message (P14)
--     ├─ statuses        PK message_ref                  its computed status (P7)
--   event_rows      PK id, UQ (login, message_id, level) events waiting for their message
--   reception_rows  by day of received_at; PK (event_id, id) in each day
--                                                        every delivery (P6, P13) → event
--   status_change_rows  by day of changed_at; PK (position, changed_at)
--                                                        every status change → message
--   exceptions      PK id                                the investigation queue (P12)
--   reasons         PK id, UQ reason                     each status reason text once
--   verifications   PK id, UQ (login, message_id, kind, verified_at)   C6, apart (P2)
--   status_recomputations  PK id                         what `dlrfeed recompute` changed
--   change_cursors  PK consumer;  forgetting_position    readers' and retention's places
--   quality_hours   by hour and cell; quality_marks PK id; quality_refresh;
--   quality_refresh_lock                                 `dlrfeed quality`'s rollup, what
--                                                        it must redo, its frontier, the
--                                                        lock of its refreshes
--
-- Public names (docs/spec/interfaces.md): the tables messages, exceptions, verifications;
-- the plain views events (event_rows ∪ message_events), message_status (statuses ⋈
-- messages), receptions and receptions_readable (reception_rows ⋈ events), status_changes
-- (status_change_rows ⋈ messages). Event ids (events_id_seq) are shared by the two event
-- tables, so an event keeps its id when its message is recorded and it moves under it.
--
-- Day partitions live in schema dlr_partitions, created ahead by `dlrfeed maintain`
-- (dlr.create_reception_partitions, dlr.create_status_change_partitions) and dropped whole
-- by retention (docs/retention.md).

CREATE SCHEMA IF NOT EXISTS dlr;
CREATE SCHEMA dlr_partitions;

-------------------------------------------------------------------------------------------
-- Messages: what the sending application sent (P5), recorded once, never changed.
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login text NOT NULL,
    message_id text NOT NULL,
    internal_id text NOT NULL,
    destination text NOT NULL,
    destination_raw text NOT NULL,
    destination_is_e164 boolean NOT NULL,
    source text,
    route text,
    submitted_at timestamptz,
    dlr_requested boolean NOT NULL DEFAULT true,
    dlr_level smallint CHECK (dlr_level IN (1, 2, 3)),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT messages_login_message_id_key UNIQUE (login, message_id)
);
COMMENT ON TABLE dlr.messages IS
    'one row per sent message (P5), unique by login and gateway id; its id keys its events and its status';
-- Retention forgets messages by age (docs/retention.md).
CREATE INDEX messages_sent_at_idx ON dlr.messages (coalesce(submitted_at, recorded_at));

-------------------------------------------------------------------------------------------
-- Events: one row per logical event, a key (login, message id, level) of the feed (P14),
-- in one table only: under its message's row id, or waiting for its message in event_rows
-- until recording the message moves it (dlr.move_events_to_messages).
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.event_rows (
    id bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME dlr.events_id_seq) PRIMARY KEY,
    login text NOT NULL,
    message_id text NOT NULL,
    correlation_id text,
    level bigint NOT NULL,
    stat text NOT NULL,
    status text NOT NULL,
    err text,
    done_date_raw text,
    done_at timestamptz,
    fingerprint text NOT NULL,
    flags text[],
    times_received integer NOT NULL DEFAULT 1,
    conflicting_receptions integer NOT NULL DEFAULT 0,
    parser_version text NOT NULL,
    rules_version text NOT NULL,
    first_received_at timestamptz NOT NULL,
    last_received_at timestamptz,
    updates text[],
    later_results text[],
    conflicting_contents text[],
    CONSTRAINT events_login_message_id_level_key UNIQUE (login, message_id, level)
);
COMMENT ON TABLE dlr.event_rows IS
    'the logical events (P14) whose message is not recorded (the waiting room), keyed by login, gateway id and level; read through the view dlr.events';
-- P10: the events correlated to another message than their own id's.
CREATE INDEX events_login_correlation_id_idx ON dlr.event_rows (login, correlation_id)
    WHERE correlation_id <> message_id;

CREATE TABLE dlr.message_events (
    id bigint PRIMARY KEY DEFAULT nextval('dlr.events_id_seq'),
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
    later_results text[],
    conflicting_contents text[],
    CONSTRAINT message_events_key UNIQUE (message_ref, level)
);
COMMENT ON TABLE dlr.message_events IS
    'the logical events (P14) whose own id names a recorded message, keyed by that message''s row id (dlr.messages.id) and level; read through the view dlr.events';
COMMENT ON COLUMN dlr.message_events.correlation_id IS
    'the id the event is correlated by (P10); NULL: its own id, its message''s gateway id';
COMMENT ON COLUMN dlr.message_events.flags IS
    'the parse flags of the first content; NULL: none';
COMMENT ON COLUMN dlr.message_events.last_received_at IS
    'when the latest delivery of the event was received; NULL: only its first was (first_received_at)';
COMMENT ON COLUMN dlr.message_events.updates IS
    'P14: the further contents the key accepted, in arrival order; NULL: none';
COMMENT ON COLUMN dlr.message_events.later_results IS
    'P14: statuses of the results the key accepted after its first content; NULL: none';
COMMENT ON COLUMN dlr.message_events.conflicting_contents IS
    'P14: fingerprints of the contents that conflicted with the key''s result, once each';
-- P10: the events correlated to another message than their own id's.
CREATE INDEX message_events_correlation_id_idx ON dlr.message_events (correlation_id)
    WHERE correlation_id IS NOT NULL;

-------------------------------------------------------------------------------------------
-- Statuses: the computed status of each correlated message (P7), under its message row's id.
-- Every write is logged by triggers into the status-change log (below).
-------------------------------------------------------------------------------------------

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
) WITH (fillfactor = 80);  -- rewritten in place as events arrive (HOT updates)
COMMENT ON TABLE dlr.statuses IS
    'the computed status of each correlated message (P7), keyed by its dlr.messages.id; read through the view dlr.message_status';
COMMENT ON COLUMN dlr.statuses.message_ref IS 'dlr.messages.id of the message';
COMMENT ON COLUMN dlr.statuses.reason_id IS
    'dlr.reasons.id of the reason; NULL when the text is in column reason (the dictionary is full)';
COMMENT ON COLUMN dlr.statuses.flags IS 'the status''s flags; NULL when it has none';
COMMENT ON COLUMN dlr.statuses.change_epoch IS
    'at least the epoch of this message''s latest status change (its position div 10^19): raised by a trigger on every write of the row, whatever the writer sets';

-------------------------------------------------------------------------------------------
-- Receptions: every delivery received, repeats included (P6, P13); append-only, one partition
-- per UTC day of received_at. Its login, message id and level are its event's (event_id).
-------------------------------------------------------------------------------------------

CREATE TYPE dlr.reception_channel AS ENUM ('feed', 'webhook');
COMMENT ON TYPE dlr.reception_channel IS
    'how a reception reached dlrfeed: the gateway''s gRPC feed, or an HTTP callback (dlr_url)';

-- Ids are drawn in blocks of 1000 per batch, under the batch's locks, so that they follow
-- arrival (P19); unique across partitions without a constraint.
CREATE SEQUENCE dlr.receptions_id_seq INCREMENT BY 1000;

CREATE TABLE dlr.reception_rows (
    id bigint NOT NULL DEFAULT nextval('dlr.receptions_id_seq'),
    stat text,
    err text,
    submit_date_raw text,
    submit_at timestamptz,
    done_date_raw text,
    done_at timestamptz,
    delivery_count bigint NOT NULL,
    received_at timestamptz NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    payload bytea NOT NULL,
    flags text[] DEFAULT '{}',
    outcome text NOT NULL CHECK (outcome IN (
        'applied', 'repeat', 'late_progress', 'superseded', 'corroborated', 'conflict',
        'uncorrelated', 'unrecognized', 'unexpected_level')),
    event_id bigint NOT NULL,
    parser_version text,
    fingerprint text,
    channel dlr.reception_channel NOT NULL DEFAULT 'feed',
    peer text,
    CONSTRAINT receptions_content_as_event_check CHECK (
        stat IS NOT NULL
        OR (err IS NULL AND done_date_raw IS NULL AND done_at IS NULL AND fingerprint IS NULL
            AND flags IS NULL AND parser_version IS NULL))
) PARTITION BY RANGE (received_at);
ALTER SEQUENCE dlr.receptions_id_seq OWNED BY dlr.reception_rows.id;
COMMENT ON TABLE dlr.reception_rows IS
    'every delivery received (P6, P13), append-only, partitioned by day of received_at, each day keyed by (event_id, id); read through the view dlr.receptions';
COMMENT ON COLUMN dlr.reception_rows.stat IS
    'the raw stat; NULL: this delivery''s parsed fields (stat, err, done_date_raw, done_at, fingerprint, flags, parser_version) are those of its event (dlr.receptions_readable shows them filled in)';
COMMENT ON COLUMN dlr.reception_rows.channel IS
    'feed: payload is the serialized gateway.receipts.v1.Receipt; webhook: payload is the callback as posted (its body, or the query string of a GET)';
COMMENT ON COLUMN dlr.reception_rows.peer IS
    'the address (host:port) an HTTP callback came from; NULL for the feed';

-------------------------------------------------------------------------------------------
-- Status changes: one row per change of a message's computed status (docs/changes.md),
-- written by the triggers of dlr.statuses in the transaction that wrote the status, so every
-- writer (live ingest, late correlation, a recompute) is covered without knowing of the log;
-- one partition per UTC day of changed_at.
--
-- Positions and the gap. A reader asks for "changes after position P". A sequence alone cannot
-- serve that: a writer may draw 5, another 6 and commit first, and a reader that moved to 6
-- never sees 5. So a position is two parts, printed as one decimal integer
--     position = epoch * 10^19 + tick
-- - tick: nextval of dlr.status_changes_tick (< 2^63 < 10^19), drawn as the row is written;
-- - epoch: the writing transaction's id (pg_current_xact_id), raised to the epoch of the
--   message's previous change when that is larger (statuses.change_epoch; a withdrawal's, from
--   the log: dlr.latest_withdrawal), for a transaction that took its id before another but
--   locked the message after it (row locks order the writers of one message).
-- Readers take only positions below  pg_snapshot_xmin(pg_current_snapshot()) * 10^19.
-- Why no change is ever skipped or seen twice:
-- 1. epoch >= own transaction id, so a row below the horizon was written by a transaction older
--    than every transaction still running: it has committed (and is visible) or aborted.
--    Every row still to be written has epoch >= its writer's id >= xmin: above the horizon. The
--    set of rows below any horizon is therefore final, and a read "position > P below the
--    horizon, in position order" returns a prefix of what every later read returns.
-- 2. Per message the positions grow in the order of the changes: the later writer holds the
--    message's row lock after the earlier one committed, so its epoch is at least the earlier
--    one's and its tick larger (ticks are drawn in real time order, CACHE 1).
-- 3. Unique: ticks are.
-------------------------------------------------------------------------------------------

CREATE SEQUENCE dlr.status_changes_tick;  -- CACHE 1: ticks follow real time (point 2)

CREATE TABLE dlr.status_change_rows (
    position numeric NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    message_ref bigint,
    login text,
    message_id text,
    status text,
    is_final boolean NOT NULL,
    reason_id integer,
    reason text,
    supporting_event_id bigint NOT NULL,
    rules_version text NOT NULL,
    previous_status text,
    previous_is_final boolean,
    previous_reason_id integer,
    previous_reason text,
    CONSTRAINT status_changes_pkey PRIMARY KEY (position, changed_at),
    CONSTRAINT status_change_rows_message_check CHECK (
        message_ref IS NOT NULL OR (login IS NOT NULL AND message_id IS NOT NULL)),
    CONSTRAINT status_change_rows_reason_check CHECK (reason IS NOT NULL OR reason_id IS NOT NULL)
) PARTITION BY RANGE (changed_at);
COMMENT ON TABLE dlr.status_change_rows IS
    'one row per change of a message''s computed status (docs/changes.md), partitioned by UTC day of changed_at; read through the view dlr.status_changes';
COMMENT ON COLUMN dlr.status_change_rows.message_ref IS
    'the message (dlr.messages.id) of a new or changed status; NULL on a withdrawal (status NULL), which names login and message_id itself';
COMMENT ON COLUMN dlr.status_change_rows.reason_id IS
    'dlr.reasons.id of the reason; NULL when the text is in column reason';
COMMENT ON COLUMN dlr.status_change_rows.previous_reason_id IS
    'dlr.reasons.id of the previous reason; NULL when the text is in previous_reason, or none';

-------------------------------------------------------------------------------------------
-- Exceptions: the investigation queue (P12, C8). A refused receipt keeps its bytes here
-- (evidence), never lost.
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.exceptions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN (
        'uncorrelated', 'conflict', 'unrecognized', 'unstorable', 'malformed', 'second_record')),
    login text NOT NULL,
    message_id text,
    details jsonb NOT NULL DEFAULT '{}',
    event_id bigint,
    reception_id bigint,
    evidence bytea,
    opened_at timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    resolution text,
    evidence_key text,
    CONSTRAINT exceptions_check CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE INDEX exceptions_event_id_idx ON dlr.exceptions (event_id);
CREATE INDEX exceptions_login_message_id_idx ON dlr.exceptions (login, message_id);
CREATE INDEX exceptions_open_kind_idx ON dlr.exceptions (kind, opened_at)
    WHERE resolved_at IS NULL;
-- P14/C1: one open conflict per content of a key.
CREATE UNIQUE INDEX exceptions_open_conflict_key ON dlr.exceptions (event_id, (details->>'fingerprint'))
    WHERE kind = 'conflict' AND resolved_at IS NULL;
-- C8: one open unstorable exception per refused receipt, however often it is redelivered.
CREATE UNIQUE INDEX exceptions_open_unstorable_key ON dlr.exceptions (login, evidence_key)
    WHERE kind = 'unstorable' AND resolved_at IS NULL;

-------------------------------------------------------------------------------------------
-- Reasons: each status reason text once; statuses and changes name it by id. Append-only:
-- an id names its text for good, so the change log keeps its meaning.
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.reasons (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reason text NOT NULL UNIQUE CHECK (octet_length(reason) <= 1000)
);
COMMENT ON TABLE dlr.reasons IS
    'each status reason text once (at most 100000 of them); ids are never reused or changed';

-------------------------------------------------------------------------------------------
-- Verifications: independent evidence that a message arrived (C6); never an input of the
-- computed status (P2).
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.verifications (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login text NOT NULL,
    message_id text NOT NULL,
    kind text NOT NULL CHECK (kind <> '' AND octet_length(kind) <= 100),
    verified_at timestamptz NOT NULL,
    source text CHECK (octet_length(source) <= 1000),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT verifications_key UNIQUE (login, message_id, kind, verified_at)
);
COMMENT ON TABLE dlr.verifications IS
    'independent verification of a message (C6), correlated by (login, message_id) when read; never an input of the computed status (P2)';
CREATE INDEX verifications_verified_at_idx ON dlr.verifications (verified_at);

-------------------------------------------------------------------------------------------
-- Recompute log: what `dlrfeed recompute` changed, and why (old and new status).
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.status_recomputations (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login text NOT NULL,
    message_id text NOT NULL,
    old_status text,
    old_is_final boolean,
    old_reason text,
    old_supporting_event_id bigint,
    old_rules_version text,
    new_status text,
    new_is_final boolean,
    new_reason text,
    new_supporting_event_id bigint,
    new_rules_version text NOT NULL,
    why text NOT NULL,
    recomputed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX status_recomputations_message_idx ON dlr.status_recomputations (login, message_id);

-------------------------------------------------------------------------------------------
-- Cursors and forgetting: where each reader of the change log is (`dlrfeed changes
-- --consumer`), and how far retention has forgotten messages (by message row id).
-------------------------------------------------------------------------------------------

CREATE TABLE dlr.change_cursors (
    consumer text PRIMARY KEY,
    position numeric NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dlr.forgetting_position (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    after_id bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-------------------------------------------------------------------------------------------
-- Functions: readable evidence (receipt_json, callback_json), the reasons dictionary, the
-- day partitions, and the bodies of the triggers below.
-------------------------------------------------------------------------------------------

CREATE FUNCTION dlr.wire_varint(payload bytea, pos integer, OUT value numeric, OUT next integer) RETURNS record
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
    byte integer;
    scale numeric := 1;
BEGIN
    value := 0;
    next := pos;
    LOOP
        IF next - pos >= 10 THEN
            RAISE EXCEPTION 'varint longer than 10 bytes at byte %', pos;
        END IF;
        byte := get_byte(payload, next);  -- raises past the end
        next := next + 1;
        value := value + (byte & 127) * scale;
        EXIT WHEN byte < 128;
        scale := scale * 128;
    END LOOP;
    value := mod(value, 18446744073709551616);
END;
$$;
COMMENT ON FUNCTION dlr.wire_varint(bytea, integer) IS
    'one protobuf varint of payload at byte pos: its value and the byte after it (for dlr.receipt_json)';

CREATE FUNCTION dlr.receipt_json(payload bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
DECLARE
    -- Field numbers 1-13 of Receipt; 2 (level) is the one number among them.
    names CONSTANT text[] := ARRAY[
        'id', 'level', 'stat', 'err', 'sub', 'dlvrd', 'submit_date', 'done_date', 'text',
        'source_addr', 'destination_addr', 'smsc_message_id', 'connector'];
    -- proto3 leaves zero values off the wire: the non-optional fields start at their zero.
    result jsonb := '{"id": "", "level": 0, "stat": "", "delivery_count": 0}';
    size CONSTANT integer := length(payload);
    pos integer := 0;
    start integer;
    tag numeric;
    field bigint;
    wire integer;
    number numeric;
    groups bigint[] := '{}';  -- the groups we are inside (their numbers): skipped whole
    piece bytea;
    nul integer;
    nuls integer;
    string text;
BEGIN
    WHILE pos < size LOOP
        start := pos;
        SELECT v.value, v.next INTO tag, pos FROM dlr.wire_varint(payload, pos) AS v;
        IF tag >= 4294967296 OR pos - start > 5 THEN  -- protobuf: a tag is a 32-bit varint
            RAISE EXCEPTION 'tag beyond 32 bits at byte %', start;
        END IF;
        field := div(tag, 8);
        wire := mod(tag, 8)::integer;
        IF field = 0 THEN
            RAISE EXCEPTION 'field number 0 at byte %', pos;
        END IF;
        IF wire = 3 THEN  -- start of a group: nothing of Receipt, skipped to its end
            IF cardinality(groups) >= 100 THEN  -- protobuf's recursion limit
                RAISE EXCEPTION 'groups nested too deep at byte %', pos;
            END IF;
            groups := groups || field;
        ELSIF wire = 4 THEN
            IF cardinality(groups) = 0 OR groups[cardinality(groups)] <> field THEN
                RAISE EXCEPTION 'end of a group never started at byte %', pos;
            END IF;
            groups := groups[1:cardinality(groups) - 1];
        ELSIF wire = 0 THEN
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF cardinality(groups) = 0 AND field IN (2, 101) THEN
                result := result || jsonb_build_object(
                    CASE field WHEN 2 THEN 'level' ELSE 'delivery_count' END,
                    mod(number, 4294967296)::bigint);
            END IF;
        ELSIF wire = 2 THEN
            start := pos;
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF pos - start > 5 THEN  -- protobuf: a length is a 32-bit varint
                RAISE EXCEPTION 'length of field % beyond 32 bits at byte %', field, start;
            END IF;
            IF pos + number > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
            IF cardinality(groups) = 0 AND (field BETWEEN 1 AND 13 AND field <> 2 OR field = 100)
            THEN
                piece := substring(payload FROM pos + 1 FOR number::integer);
                IF position('\x00'::bytea IN piece) = 0 THEN
                    string := convert_from(piece, 'UTF8');  -- raises unless UTF-8
                ELSE
                    -- protobuf refuses the field unless all of it is UTF-8, and convert_from
                    -- refuses every NUL, so validate a copy whose NULs are other ASCII bytes
                    -- (an ASCII byte never takes part in a multi-byte character: validity is
                    -- the same). In hex, replacing each "00" by "01" does that in one pass:
                    -- a pair at a byte boundary turns 0x00 into 0x01, one straddling two bytes
                    -- (x0|0y) turns the second, 0x0y, into 0x1y; only bytes below 0x10 change,
                    -- each into another ASCII byte, and no NUL is left.
                    PERFORM convert_from(decode(replace(encode(piece, 'hex'), '00', '01'), 'hex'),
                                         'UTF8');  -- raises unless UTF-8
                    string := '';
                    nuls := 0;
                    LOOP  -- NUL is not storable in text: shown as \u0000 (six characters)
                        nul := position('\x00'::bytea IN piece);
                        EXIT WHEN nul = 0;
                        nuls := nuls + 1;
                        IF nuls > 256 THEN  -- each turn copies the rest: bounded work
                            piece := convert_to(encode(piece, 'escape'), 'UTF8');
                            EXIT;
                        END IF;
                        string := string || convert_from(substring(piece FOR nul - 1), 'UTF8')
                                  || '\u0000';
                        piece := substring(piece FROM nul + 1);
                    END LOOP;
                    string := string || convert_from(piece, 'UTF8');
                END IF;
                IF field <> 100 THEN  -- the token is read (it must be UTF-8), not shown
                    result := result || jsonb_build_object(names[field], string);
                END IF;
            END IF;
            pos := pos + number::integer;
        ELSIF wire IN (1, 5) THEN  -- fixed64 / fixed32: nothing of Receipt, skipped
            pos := pos + CASE wire WHEN 1 THEN 8 ELSE 4 END;
            IF pos > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
        ELSE
            RAISE EXCEPTION 'wire type % at byte %', wire, pos;
        END IF;
    END LOOP;
    IF cardinality(groups) > 0 THEN
        RAISE EXCEPTION 'a group never ends';
    END IF;
    RETURN result;
EXCEPTION WHEN OTHERS THEN
    RETURN jsonb_build_object('undecodable', encode(payload, 'hex'));
END;
$$;
COMMENT ON FUNCTION dlr.receipt_json(bytea) IS
    'a feed reception''s payload as JSON: what protobuf reads of the Receipt bytes, or {"undecodable": hex}';

CREATE FUNCTION dlr.callback_json(payload bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
DECLARE
    body text;
    parsed jsonb;
BEGIN
    BEGIN
        body := convert_from(payload, 'UTF8');
    EXCEPTION WHEN OTHERS THEN
        RETURN jsonb_build_object('undecodable', encode(payload, 'hex'));
    END;
    BEGIN
        parsed := body::jsonb;
    EXCEPTION WHEN OTHERS THEN
        RETURN jsonb_build_object('form', body);
    END;
    IF jsonb_typeof(parsed) = 'object' THEN
        RETURN parsed;
    END IF;
    RETURN jsonb_build_object('form', body);
END;
$$;
COMMENT ON FUNCTION dlr.callback_json(bytea) IS
    'an HTTP callback''s payload as JSON: the posted object, {"form": text}, or {"undecodable": hex}';

-- The dictionary of reasons is bounded (100000 texts of at most 1000 bytes): a reason it cannot
-- hold (full, too long, or added by a concurrent serializable writer) stays as text in the
-- status's or change's own row, so a status is never refused for its wording. Its functions
-- run in every ingest transaction with a handful of texts or ids: their statements keep one
-- generic plan (index probes whatever the array) instead of being planned at each call.
CREATE FUNCTION dlr.add_reasons(candidates text[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION dlr.reason_ids(texts text[]) RETURNS TABLE(reason text, id integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    PERFORM dlr.add_reasons(texts);
    RETURN QUERY SELECT r.reason, r.id FROM dlr.reasons AS r WHERE r.reason = ANY (texts);
END;
$$;
COMMENT ON FUNCTION dlr.reason_ids(text[]) IS
    'the ids of texts in dlr.reasons, adding those it lacks while it has room (the writers'' one way in)';

-- A reason as read: the row's own text, else its id's text in the dictionary.
CREATE FUNCTION dlr.reason_text(stored text, id integer) RETURNS text
    LANGUAGE sql STABLE
    AS $_$
    SELECT coalesce($1, (SELECT r.reason FROM dlr.reasons AS r WHERE r.id = $2))
$_$;

-- A status may name only an id the dictionary holds (the change log's triggers check it, since
-- the writers pass ids, not texts).
CREATE FUNCTION dlr.check_reason_ids(ids integer[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

-- The partitions of each partitioned table of dlr, with their bounds (NULL lower_bound: from
-- MINVALUE; is_default: the default partition).
CREATE VIEW dlr.day_partitions AS
SELECT parent.relname AS parent_table,
       child.relname AS partition_name,
       substring(pg_get_expr(child.relpartbound, child.oid), 'FROM \(''([^'']*)''\)')::timestamptz
           AS lower_bound,
       substring(pg_get_expr(child.relpartbound, child.oid), 'TO \(''([^'']*)''\)')::timestamptz
           AS upper_bound,
       pg_get_expr(child.relpartbound, child.oid) = 'DEFAULT' AS is_default
FROM pg_inherits AS i
JOIN pg_class AS parent ON parent.oid = i.inhparent
JOIN pg_class AS child ON child.oid = i.inhrelid
WHERE parent.relnamespace = 'dlr'::regnamespace AND parent.relkind = 'p';

-- `dlrfeed maintain` (the owner) creates the days ahead, from the last one that exists; each day
-- of receptions keyed by (event_id, id), so a day's index grows where its events are written.
CREATE FUNCTION dlr.create_reception_partitions(through timestamp with time zone) RETURNS SETOF text
    LANGUAGE plpgsql
    SET "TimeZone" TO 'UTC'
    AS $$
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
$$;

-- The same for the change log; each day indexes its withdrawals (status NULL) by message, for
-- dlr.latest_withdrawal.
CREATE FUNCTION dlr.create_status_change_partitions(through timestamp with time zone) RETURNS SETOF text
    LANGUAGE plpgsql
    SET "TimeZone" TO 'UTC'
    AS $$
DECLARE
    day timestamptz;
    name text;
BEGIN
    SELECT coalesce(max(p.upper_bound), date_trunc('day', now())) INTO day
    FROM dlr.day_partitions AS p WHERE p.parent_table = 'status_change_rows';
    WHILE day < through LOOP
        name := 'status_changes_' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_change_rows'
                       ' FOR VALUES FROM (%L) TO (%L)', name, day, day + interval '1 day');
        EXECUTE format('CREATE INDEX %I ON dlr_partitions.%I (login, message_id, position)'
                       ' WHERE status IS NULL', name || '_withdrawn', name);
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$$;

CREATE FUNCTION dlr.forgetting() RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(current_setting('dlrfeed.forgetting', true), '') = 'on'
       AND pg_has_role(session_user,
                       (SELECT nspowner FROM pg_namespace WHERE nspname = 'dlr'), 'USAGE')
$$;
COMMENT ON FUNCTION dlr.forgetting() IS
    'true in a transaction of the schema owner that forgets old messages (set_config of dlrfeed.forgetting, local to it): their statuses go without a withdrawn change';

-- The epoch of a message's latest withdrawal in [since, before): a status written again after
-- a withdrawal is positioned past it (a withdrawn status has no row to carry its epoch). The
-- writer asks for the hour either side of its own transaction, so the lookup probes the days
-- of today and at most a neighbour, however many are kept. Why that window is enough: a
-- withdrawal raises a change's epoch only when its epoch E is above the writing transaction's
-- id X. E is the id of the transaction W0 that started the message's chain of changes (epochs
-- are only inherited along one message's changes, each written after the one before under the
-- row lock), and E > X means W0's id was assigned after ours, so after our transaction began
-- (now()). Each change is stamped with the clock as its writer's trigger runs
-- (clock_timestamp(), after the write that assigned the writer's id), so the withdrawal has
-- changed_at >= now(); and it was written before we could lock the message, so before our
-- clock_timestamp(). The hour of margin on either side covers a step of the server's clock
-- (NTP); beyond it a raise could be missed, and per-message order rests on the tick alone,
-- which still grows in real time.
CREATE FUNCTION dlr.latest_withdrawal(login text, message_id text, since timestamp with time zone, before timestamp with time zone) RETURNS TABLE(epoch numeric)
    LANGUAGE sql STABLE
    AS $_$
    SELECT trunc(max(c.position) / 1e19)
    FROM dlr.status_change_rows AS c
    WHERE c.login = $1 AND c.message_id = $2 AND c.status IS NULL
          AND c.changed_at >= $3 AND c.changed_at < $4
$_$;

-- A status row carries at least the epoch of its latest change, whatever its writer sets: the
-- next change of the message is positioned after it.
CREATE FUNCTION dlr.keep_change_epoch() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

-- The change log's writer: one row per status inserted, changed (status, finality or reason)
-- or deleted, in the transaction that wrote it; it runs as the owner (the writer role may not
-- write the log itself).
CREATE FUNCTION dlr.record_status_changes() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written_at timestamptz := clock_timestamp();
    recent timestamptz := now() - interval '1 hour';
    horizon timestamptz := written_at + interval '1 hour';
    written bigint;
BEGIN
    -- A change's position is past its transaction's epoch, past the message's previous change
    -- (change_epoch) and past a withdrawal of the last hour, so a reader never sees a
    -- message's changes out of order (docs/changes.md).
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr.check_reason_ids(ARRAY(
            SELECT DISTINCT n.reason_id FROM new_rows AS n WHERE n.reason_id IS NOT NULL));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, message_ref, status, is_final, reason, reason_id,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.message_ref, n.status, n.is_final, n.reason, n.reason_id,
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
            position, changed_at, message_ref, status, is_final, reason, reason_id,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.message_ref, n.status, n.is_final, n.reason, n.reason_id,
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
        -- Only a change of the status, finality or reason is a change; counters are not.
        WHERE (n.status, n.is_final) IS DISTINCT FROM (o.status, o.is_final)
           OR CASE WHEN n.reason_id IS NOT NULL AND o.reason_id IS NOT NULL
                   THEN n.reason_id <> o.reason_id
                   ELSE dlr.reason_text(n.reason, n.reason_id)
                        IS DISTINCT FROM dlr.reason_text(o.reason, o.reason_id) END;
    ELSE
        -- DELETE: the status withdrawn (status NULL), named by login and gateway id so that
        -- dlr.latest_withdrawal finds it by its index. The recompute's audit row of this
        -- transaction (same now()) names why and under which rules.
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

-- P14: the events that waited for a message move under its row id when it is recorded, with
-- their ids, so a key is in one table only.
CREATE FUNCTION dlr.move_events_to_messages() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
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
    ) AS x;
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
           -- Its own id as its correlation id is NULL under its message, as the ingest
           -- writes it there (a writer of the waiting room may have written it out).
           m.done_date_raw, m.fingerprint, nullif(m.correlation_id, m.message_id), m.flags,
           m.updates,
           m.parser_version, m.rules_version, m.later_results, m.conflicting_contents
    FROM moved AS m
    JOIN unnest(early, refs) AS k(id, ref) ON k.id = m.id;
    RETURN NULL;
END;
$$;

CREATE FUNCTION dlr.refuse_new_message_id() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION 'a message''s id does not change: its status is kept under it';
END;
$$;

CREATE FUNCTION dlr.check_exception_event() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION dlr.forbid_reception_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- P13: the reception log is evidence; it is appended to, never rewritten.
    RAISE EXCEPTION 'dlr.receptions is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE FUNCTION dlr.forbid_reason_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'dlr.reasons only grows: an id names its text for good'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

-------------------------------------------------------------------------------------------
-- The public views: plain reads of the tables above, the columns of docs/spec/interfaces.md.
-------------------------------------------------------------------------------------------

CREATE VIEW dlr.events AS
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
COMMENT ON VIEW dlr.events IS
    'the logical events (P14), unique by login, gateway id and level: those waiting for their message (dlr.event_rows) and those under it (dlr.message_events)';

CREATE VIEW dlr.message_status AS
SELECT m.login, m.message_id, s.status, s.is_final, dlr.reason_text(s.reason, s.reason_id) AS reason,
       s.supporting_event_id, s.repeats, s.conflicts, s.progress_events,
       s.deadline_superseded, s.rules_version, s.updated_at, s.supporting_reception_id,
       s.basis_level, s.basis_stat, s.basis_err, s.basis_done_at,
       coalesce(s.flags, '{}') AS flags, s.change_epoch
FROM dlr.statuses AS s
JOIN dlr.messages AS m ON m.id = s.message_ref;
COMMENT ON VIEW dlr.message_status IS
    'the computed status of each correlated message (P7), by login and gateway id, the reason as text';

CREATE VIEW dlr.receptions AS
SELECT r.id, e.login, e.message_id, e.level, r.stat, r.err, r.submit_date_raw, r.submit_at,
       r.done_date_raw, r.done_at, r.delivery_count, r.received_at, r.stored_at, r.payload,
       r.flags, r.outcome, r.event_id, r.parser_version, r.fingerprint, r.channel, r.peer
FROM dlr.reception_rows AS r
LEFT JOIN dlr.events AS e ON e.id = r.event_id;
COMMENT ON VIEW dlr.receptions IS
    'every delivery received (P6, P13), repeats included, with the login, message id and level of its event';

CREATE VIEW dlr.receptions_readable AS
SELECT r.id, e.login, e.message_id, e.level,
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
       CASE r.channel WHEN 'webhook' THEN dlr.callback_json(r.payload)
                      ELSE dlr.receipt_json(r.payload) END AS payload_json
FROM dlr.reception_rows AS r
LEFT JOIN dlr.events AS e ON e.id = r.event_id;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with every delivery''s parsed fields filled in (from its event where the row defers to it) and payload_json: the receipt in payload, as JSON (dlr.receipt_json for the feed, dlr.callback_json for a callback)';

CREATE VIEW dlr.status_changes AS
SELECT c.position, c.changed_at,
       coalesce(c.login, m.login) AS login, coalesce(c.message_id, m.message_id) AS message_id,
       c.status, c.is_final, dlr.reason_text(c.reason, c.reason_id) AS reason,
       c.supporting_event_id, c.rules_version, c.previous_status, c.previous_is_final,
       dlr.reason_text(c.previous_reason, c.previous_reason_id) AS previous_reason
FROM dlr.status_change_rows AS c
LEFT JOIN dlr.messages AS m ON c.login IS NULL AND m.id = c.message_ref;
COMMENT ON VIEW dlr.status_changes IS
    'the status-change log (docs/changes.md), every reason as its text';

-------------------------------------------------------------------------------------------
-- The first partitions: everything received (or changed) before today in one partition,
-- today and a week ahead one per day, and a default partition for a day not created yet
-- (`dlrfeed maintain` not run for a week: it still lands, out of reach of retention until
-- the owner moves it, docs/retention.md).
-------------------------------------------------------------------------------------------

DO $partitions$
DECLARE
    today timestamptz;
BEGIN
    SET LOCAL timezone = 'UTC';
    today := date_trunc('day', now());
    EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.reception_rows'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   'receptions_before_' || to_char(today, 'YYYYMMDD'), today);
    EXECUTE format('ALTER TABLE dlr_partitions.%I ADD PRIMARY KEY (event_id, id)',
                   'receptions_before_' || to_char(today, 'YYYYMMDD'));
    EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_change_rows'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   'status_changes_before_' || to_char(today, 'YYYYMMDD'), today);
    PERFORM dlr.create_reception_partitions(today + interval '7 days');
    PERFORM dlr.create_status_change_partitions(today + interval '7 days');
END
$partitions$;
CREATE TABLE dlr_partitions.receptions_default PARTITION OF dlr.reception_rows DEFAULT;
ALTER TABLE dlr_partitions.receptions_default ADD PRIMARY KEY (event_id, id);
CREATE TABLE dlr_partitions.status_changes_default PARTITION OF dlr.status_change_rows DEFAULT;
CREATE INDEX status_changes_default_withdrawn ON dlr_partitions.status_changes_default
    (login, message_id, position) WHERE status IS NULL;

-------------------------------------------------------------------------------------------
-- Triggers
-------------------------------------------------------------------------------------------

-- P5: a message's row id keys its events and status; it never changes (the writer may lock
-- the row FOR NO KEY UPDATE, which needs UPDATE on one column: id).
CREATE TRIGGER messages_id_fixed BEFORE UPDATE OF id ON dlr.messages
    FOR EACH ROW WHEN (NEW.id IS DISTINCT FROM OLD.id) EXECUTE FUNCTION dlr.refuse_new_message_id();
-- P14: recording a message takes its waiting events under its row id.
CREATE TRIGGER messages_take_their_events AFTER INSERT ON dlr.messages
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.move_events_to_messages();

-- The status-change log: every write of a status, whoever writes it. Forgetting old
-- messages (dlr.forgetting()) deletes their statuses without a withdrawal.
CREATE TRIGGER statuses_change_epoch BEFORE INSERT OR UPDATE ON dlr.statuses
    FOR EACH ROW EXECUTE FUNCTION dlr.keep_change_epoch();
CREATE TRIGGER statuses_changes_insert AFTER INSERT ON dlr.statuses
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_status_changes();
CREATE TRIGGER statuses_changes_update AFTER UPDATE ON dlr.statuses
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_status_changes();
CREATE TRIGGER statuses_changes_delete AFTER DELETE ON dlr.statuses
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT WHEN (NOT dlr.forgetting()) EXECUTE FUNCTION dlr.record_status_changes();

-- P13: the reception log is evidence, appended to and never rewritten (even by the owner;
-- retention drops whole days).
CREATE TRIGGER receptions_append_only BEFORE UPDATE OR DELETE ON dlr.reception_rows
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reception_change();
CREATE TRIGGER receptions_no_truncate BEFORE TRUNCATE ON dlr.reception_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.forbid_reception_change();

CREATE TRIGGER reasons_append_only BEFORE UPDATE OR DELETE ON dlr.reasons
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reason_change();
CREATE TRIGGER reasons_no_truncate BEFORE TRUNCATE ON dlr.reasons
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.forbid_reason_change();

-- An exception that names an event names a stored one (either event table).
CREATE TRIGGER exceptions_event_stored AFTER INSERT ON dlr.exceptions
    REFERENCING NEW TABLE AS new_exceptions
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.check_exception_event();

-------------------------------------------------------------------------------------------
-- Route quality rollup (docs/quality.md, "Cost"): `dlrfeed quality` reads dlr.quality_hours
-- up to its frontier, and only the partial first hour of its window, and the messages sent
-- from the frontier on, from the raw tables. The rollup is brought up to date by
-- dlr.refresh_quality_hours(), outside the ingest: it re-aggregates what changed since its last
-- run - whole hours where messages were recorded or forgotten (dlr.quality_marks), in the hour
-- not over each slice where they were, and elsewhere only the groups of the
-- messages whose status changed (the status-change log, by position: every change its
-- snapshot sees), or that were verified or recomputed (dlr.quality_marks).
-------------------------------------------------------------------------------------------

-- A latency's bucket: 0 for 0 s; else its sign times 32 + floor(10 log10 |seconds|), clamped
-- to 1 (under 1 ms) .. 112 (10^8 s and more): ten buckets a decade, each spanning a factor of
-- 10^0.1, ascending with the latency.
CREATE FUNCTION dlr.latency_bucket(seconds double precision) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN seconds = 0 THEN 0
                ELSE (sign(seconds)
                      * (least(greatest(floor(10 * log(abs(seconds))), -31), 80) + 32))::smallint
           END;

CREATE TABLE dlr.quality_hours (
    hour timestamptz NOT NULL,
    login text NOT NULL,
    source text NOT NULL,
    route text,
    country text,
    err text,
    status text,
    is_final boolean NOT NULL,
    messages integer NOT NULL,
    verified integer NOT NULL,
    with_done_time integer NOT NULL,
    to_done_buckets smallint[] NOT NULL,
    to_done_counts integer[] NOT NULL,
    to_received_buckets smallint[] NOT NULL,
    to_received_counts integer[] NOT NULL,
    awaiting_sent timestamptz[]
);
COMMENT ON TABLE dlr.quality_hours IS
    'the quality report''s facts per hour the messages were sent in (UTC; in the frontier''s hour, per slice of it, from its start to the next one''s or the frontier) and group: counts (integers: their sums are bigint, fast), and the finals'' latencies as sparse histograms of dlr.latency_bucket (a bucket may repeat: its counts add up)';
COMMENT ON COLUMN dlr.quality_hours.awaiting_sent IS
    'a non-final group''s send times, so that a deadline falling within the hour counts its pending messages exactly; NULL for finals';
CREATE INDEX quality_hours_hour_idx ON dlr.quality_hours (hour);

CREATE TABLE dlr.quality_marks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sent_at timestamptz,
    login text,
    message_id text
);
COMMENT ON TABLE dlr.quality_marks IS
    'send times whose hour or slice the rollup must re-aggregate (messages recorded or forgotten: the first of a statement in each minute), and messages verified or recomputed (their group in their hour or slice); written by triggers, consumed by dlr.refresh_quality_hours_up_to() (or dropped by `dlrfeed maintain` while no rollup is built)';

CREATE TABLE dlr.quality_refresh (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    position numeric,
    refreshed_at timestamptz,
    countries_digest text,
    open_from timestamptz
);
COMMENT ON TABLE dlr.quality_refresh IS
    'how far dlr.quality_hours has read the status-change log (NULL: never built)';
COMMENT ON COLUMN dlr.quality_refresh.countries_digest IS
    'SHA-256 of the country map dlr.quality_hours was built with: a refresh with another map rebuilds it whole';
COMMENT ON COLUMN dlr.quality_refresh.open_from IS
    'the frontier: the rollup holds the messages sent before it; where the last refresh stopped (a report''s window end, never past the database''s clock; never moving back); a report counts the later ones from the raw tables';
INSERT INTO dlr.quality_refresh DEFAULT VALUES;

CREATE TABLE dlr.quality_refresh_lock ();
COMMENT ON TABLE dlr.quality_refresh_lock IS
    'empty: its EXCLUSIVE lock lets one refresh of dlr.quality_hours run at a time; LOCK TABLE takes no snapshot, so a report takes it first in its repeatable-read transaction, whose snapshot then follows every refresh committed';

-- The facts of the messages sent in [lo, hi), of `only_login` or all, one row per hour and
-- group; `pending` counts the non-final ones sent before `cutoff`. With `only_messages`, only
-- the groups those messages are in (login, source, route and country; a message never
-- changes group), each whole. Ranges, never a whole table: the messages by their send time,
-- their statuses and events by the range of their row ids (messages are recorded as they are
-- sent), the verifications by their keys. A verification counts when dated at most 24 hours
-- before its message was sent (clock skew; hours, not a local day, so that no session's time
-- zone moves the bound); the country comes from the first four digits of an E.164 destination
-- in `countries`.
CREATE FUNCTION dlr.quality_facts(lo timestamptz, hi timestamptz, only_login text,
                                  cutoff timestamptz, countries jsonb, only_messages bigint[])
    RETURNS TABLE (hour timestamptz, login text, source text, route text, country text,
                   err text, status text, is_final boolean, messages integer, pending integer,
                   verified integer, with_done_time integer, to_done_buckets smallint[],
                   to_done_counts integer[], to_received_buckets smallint[],
                   to_received_counts integer[], awaiting_sent timestamptz[])
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET jit TO off
    SET enable_sort TO off
    AS $function$
BEGIN
-- Planned at each call with its arguments (EXECUTE ... USING), not once for any: a plan for
-- an unknown range guesses its size, and the filter of only_messages, guessed to keep half
-- of it, turns a hash join around, so that a long range hashes its messages instead of their
-- statuses (docs/quality.md, "Cost"). Knowing the range, the planner sizes the joins; with
-- only_messages NULL, the filter drops out. No JIT: its compilation, triggered by the
-- estimates, costs more than it saves. Sorts discouraged: the planner, guessing about a
-- group per message, would sort every message of the window by its group (on disk, for an
-- hour of a busy sender's) where a hash of the groups takes them as they come; only the
-- groups are sorted, for their ordered aggregates. A message's verifications are probed by
-- its key: a join of the window's messages, whose count a range of fresh rows beyond the
-- statistics hides from the planner, may be planned as a loop over all of them per message.
RETURN QUERY EXECUTE $query$
WITH window_messages AS MATERIALIZED (
    SELECT m.id, m.login, m.message_id, m.route, coalesce(m.source, '') AS source,
           m.submitted_at, coalesce(m.submitted_at, m.recorded_at) AS sent_at,
           CASE WHEN m.destination_is_e164 THEN $5 ->> substr(m.destination, 2, 4) END
               AS country
    FROM dlr.messages AS m
    WHERE coalesce(m.submitted_at, m.recorded_at) >= $1
      AND coalesce(m.submitted_at, m.recorded_at) < $2
      AND ($3 IS NULL OR m.login = $3)
),
-- The window's, with or without $6: an event kept under another message of the window (P10)
-- is found for a group as for its whole hour.
ids AS (
    SELECT coalesce(min(id), 0) AS first, coalesce(max(id), -1) AS last FROM window_messages
),
-- A group as one jsonb value: equal when its four keys are, NULLs included. Filtered once
-- for its two readers.
sent AS MATERIALIZED (
    SELECT w.* FROM window_messages AS w
    WHERE $6 IS NULL
       OR jsonb_build_array(w.login, w.source, w.route, w.country) IN (
              SELECT jsonb_build_array(t.login, t.source, t.route, t.country)
              FROM window_messages AS t JOIN unnest($6) AS u(id) ON u.id = t.id)
),
statuses AS (
    SELECT st.message_ref, st.status, st.is_final, st.basis_err, st.basis_done_at,
           st.supporting_event_id
    FROM dlr.statuses AS st
    WHERE st.message_ref BETWEEN (SELECT first FROM ids) AND (SELECT last FROM ids)
),
events AS (
    SELECT me.id, me.first_received_at
    FROM dlr.message_events AS me
    WHERE me.message_ref BETWEEN (SELECT first FROM ids) AND (SELECT last FROM ids)
),
facts AS (
    SELECT date_trunc('hour', s.sent_at, 'UTC') AS hour, s.login, s.source, s.route,
           s.country, st.basis_err AS err, st.status, coalesce(st.is_final, false) AS is_final,
           s.sent_at,
           EXISTS (SELECT 1 FROM dlr.verifications AS v
                   WHERE v.login = s.login AND v.message_id = s.message_id
                     AND v.verified_at >= s.sent_at - interval '24 hours') AS verified,
           -- Seconds as double precision, what dlr.latency_bucket takes (extract's numeric
           -- would cost a conversion a row).
           date_part('epoch', st.basis_done_at - s.submitted_at) AS to_done,
           date_part('epoch', coalesce(me.first_received_at, er.first_received_at)
                              - s.submitted_at) AS to_received
    FROM sent AS s
    LEFT JOIN statuses AS st ON st.message_ref = s.id
    LEFT JOIN events AS me ON me.id = st.supporting_event_id
    LEFT JOIN dlr.event_rows AS er ON me.id IS NULL AND er.id = st.supporting_event_id
),
-- Grouped on its own (materialized), by a hash: the grouping below would take its order from
-- one sort of the window's messages serving both.
cells AS MATERIALIZED (
    SELECT f.hour, f.login, f.source, f.route, f.country, f.err, f.status, f.is_final,
           CASE WHEN f.is_final THEN dlr.latency_bucket(f.to_done) END AS done_bucket,
           CASE WHEN f.is_final THEN dlr.latency_bucket(f.to_received) END AS received_bucket,
           count(*)::integer AS messages,
           count(*) FILTER (WHERE NOT f.is_final AND f.sent_at < $4)::integer AS pending,
           count(*) FILTER (WHERE f.verified)::integer AS verified,
           count(*) FILTER (WHERE f.to_done IS NOT NULL)::integer AS with_done_time,
           array_agg(f.sent_at) FILTER (WHERE NOT f.is_final) AS awaiting_sent
    FROM facts AS f
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
)
SELECT c.hour, c.login, c.source, c.route, c.country, c.err, c.status, c.is_final,
       sum(c.messages)::integer, sum(c.pending)::integer, sum(c.verified)::integer,
       sum(c.with_done_time)::integer,
       coalesce(array_agg(c.done_bucket ORDER BY c.done_bucket, c.received_bucket)
                FILTER (WHERE c.done_bucket IS NOT NULL), '{}'),
       coalesce(array_agg(c.messages ORDER BY c.done_bucket, c.received_bucket)
                FILTER (WHERE c.done_bucket IS NOT NULL), '{}'),
       coalesce(array_agg(c.received_bucket ORDER BY c.done_bucket, c.received_bucket)
                FILTER (WHERE c.received_bucket IS NOT NULL), '{}'),
       coalesce(array_agg(c.messages ORDER BY c.done_bucket, c.received_bucket)
                FILTER (WHERE c.received_bucket IS NOT NULL), '{}'),
       -- A non-final group is one row of cells (no buckets): its one array.
       max(c.awaiting_sent)
FROM cells AS c
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
$query$
USING lo, hi, only_login, cutoff, countries, only_messages;
END;
$function$;

-- Brings dlr.quality_hours up to date (docs/quality.md, "Cost") with the messages sent before
-- `up_to`; returns how many hours, or slices of the hour not over, holding messages it counted
-- again. The owner's alone: a frontier set ahead of the
-- clock would stay there (it never moves back), and every refresh until the clock caught up
-- would count its hour whole again. A map other than the one the rollup was built with
-- rebuilds it whole, so that no two maps are ever mixed.
CREATE FUNCTION dlr.refresh_quality_hours_up_to(countries jsonb, up_to timestamptz)
    RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    read_from numeric;
    built_with text;
    digest text := encode(sha256(convert_to(countries::text, 'UTF8')), 'hex');
    horizon numeric;
    open_before timestamptz;  -- the frontier the last refresh left
    frontier timestamptz;  -- the messages sent before it are in the rollup after this refresh
    open_hour timestamptz;  -- the frontier's hour: its rows are slices of it, not the hour
    new_from timestamptz;  -- the slice this refresh adds: [new_from, frontier)
    slices timestamptz[];  -- the starts of open_hour's slices before it, ascending; each ends
                           -- where the next starts, the last at new_from
    touched timestamptz[];  -- hours re-aggregated whole
    redone integer[];  -- slices counted again whole (their subscripts in `slices`)
    partial_from timestamptz[];  -- and the hours or slices where the groups of the messages
    partial_messages bigint[];  -- that changed are re-aggregated
    rewritten integer := 0;
    inserted integer;
    run record;
BEGIN
    -- One refresh at a time: in read committed, the second one's statements, after the lock,
    -- see the first's (a report takes the lock before its snapshot). A table of its own: no
    -- receipt ever waits for it.
    LOCK TABLE dlr.quality_refresh_lock IN EXCLUSIVE MODE;
    SELECT r.position, r.countries_digest, r.open_from INTO read_from, built_with, open_before
    FROM dlr.quality_refresh AS r FOR UPDATE;
    -- Never moved back: a refresh that waited for the lock may have been asked for less than
    -- the one before it. A slice spans 30 seconds at least, so that reports in a loop cannot
    -- cut an hour into thousands of them.
    frontier := up_to;
    IF frontier < open_before + interval '30 seconds' THEN
        frontier := open_before;
    END IF;
    open_hour := date_trunc('hour', frontier, 'UTC');
    -- Every change below the horizon is committed, hence visible to the statements below
    -- (docs/changes.md, "Positions and the gap"): the position advances to it. The changes
    -- committed above it are read too (a transaction left open must not hold the report's
    -- counts back), and again next time: a group re-aggregated twice is the same group.
    horizon := pg_snapshot_xmin(pg_current_snapshot())::text::numeric * 1e19;
    IF read_from IS NULL OR built_with IS DISTINCT FROM digest OR open_before IS NULL THEN
        read_from := NULL;
        DELETE FROM dlr.quality_hours;
        -- The marks this statement sees are consumed before the messages are read: a later
        -- statement sees at least their messages. (The other way round, a message recorded
        -- in between would lose its mark unread.) Messages sent from the frontier on (ahead
        -- of the clock) get marks of their own, read once the frontier passes them.
        DELETE FROM dlr.quality_marks;
        WITH sent AS (
            SELECT min(coalesce(m.submitted_at, m.recorded_at)) AS sent_at
            FROM dlr.messages AS m
            GROUP BY date_trunc('minute', coalesce(m.submitted_at, m.recorded_at), 'UTC')
        ),
        ahead AS (
            INSERT INTO dlr.quality_marks (sent_at)
            SELECT s.sent_at FROM sent AS s WHERE s.sent_at >= frontier
        )
        SELECT array_agg(DISTINCT date_trunc('hour', s.sent_at, 'UTC'))
                   FILTER (WHERE s.sent_at < open_hour)
            INTO touched FROM sent AS s;
        new_from := open_hour;
    ELSE
        new_from := greatest(open_before, open_hour);
        -- The hour's start is a slice's start whether or not rows start there.
        slices := ARRAY(SELECT open_hour
                        UNION
                        SELECT q.hour FROM dlr.quality_hours AS q
                        WHERE q.hour >= open_hour AND q.hour < new_from
                        ORDER BY 1);
        -- The marks are consumed as they are read, by one statement: those it sees, however
        -- many (a bulk of verifications writes one a message), and no other; rolled back with
        -- the refresh. Those from the frontier on stay for the refresh that passes them.
        WITH consumed AS (
            DELETE FROM dlr.quality_marks AS k
            WHERE k.sent_at IS NULL OR k.sent_at < frontier
            RETURNING k.sent_at, k.login, k.message_id
        ),
        -- The hours over with messages recorded or forgotten, and the hour the frontier left:
        -- its slices give way to the hour, counted whole with every change it had meanwhile.
        whole AS (
            SELECT date_trunc('hour', k.sent_at, 'UTC') AS hour FROM consumed AS k
            WHERE k.sent_at < open_hour
            UNION
            SELECT date_trunc('hour', open_before, 'UTC') WHERE open_before < open_hour
        ),
        -- The slices where messages were recorded or forgotten since they were counted (a
        -- transaction that began before the frontier and committed after it): each counted
        -- again whole, within its own bounds. A mark is the first send time of its statement
        -- in its minute: every slice the rest of that minute overlaps is counted again too.
        again AS (
            SELECT DISTINCT b.i
            FROM consumed AS k
            CROSS JOIN generate_subscripts(slices, 1) AS b(i)
            WHERE k.sent_at >= open_hour AND k.sent_at < new_from
              AND slices[b.i] < date_trunc('minute', k.sent_at, 'UTC') + interval '1 minute'
              AND coalesce(slices[b.i + 1], new_from) > k.sent_at
        ),
        -- A verification's message not recorded in this snapshot is recorded later, with a
        -- mark of its own: its hour or slice is re-aggregated then, with this verification
        -- (committed before this snapshot, as its mark is).
        -- Messages known by their key alone - verified or recomputed (a mark), or a change
        -- withdrawn from its message - are found by probes of their keys (OFFSET 0: whatever
        -- the statistics say of the marks, which a bulk of verifications fills and a refresh
        -- empties).
        keyed AS (
            SELECT k.login, k.message_id FROM consumed AS k WHERE k.sent_at IS NULL
            UNION
            SELECT c.login, c.message_id FROM dlr.status_change_rows AS c
            WHERE c.position >= read_from AND c.message_ref IS NULL
        ),
        changed AS (
            SELECT m.id
            FROM keyed AS k
            CROSS JOIN LATERAL (
                SELECT m.id FROM dlr.messages AS m
                WHERE m.login = k.login AND m.message_id = k.message_id
                OFFSET 0
            ) AS m
            UNION
            SELECT c.message_ref FROM dlr.status_change_rows AS c WHERE c.position >= read_from
        ),
        -- Each message in its hour, or in its slice of the open hour (the last one starting
        -- at or before it was sent).
        partial AS (
            SELECT CASE WHEN m.sent_at >= open_hour THEN width_bucket(m.sent_at, slices) END
                       AS slice,
                   m.sent_at, m.id
            FROM changed AS c
            CROSS JOIN LATERAL (
                SELECT coalesce(m.submitted_at, m.recorded_at) AS sent_at, m.id
                FROM dlr.messages AS m WHERE m.id = c.id
                OFFSET 0
            ) AS m
        )
        SELECT (SELECT array_agg(w.hour) FROM whole AS w), (SELECT array_agg(a.i) FROM again AS a),
               array_agg(coalesce(slices[p.slice], date_trunc('hour', p.sent_at, 'UTC'))),
               array_agg(p.id)
        FROM partial AS p
        WHERE date_trunc('hour', p.sent_at, 'UTC') NOT IN (SELECT w.hour FROM whole AS w)
          AND p.sent_at < new_from
          AND (p.slice IS NULL OR p.slice NOT IN (SELECT a.i FROM again AS a))
            INTO touched, redone, partial_from, partial_messages;
    END IF;
    -- A range a call, the first build too (each call's joins hold at most an hour of rows,
    -- however large the store): its rows out - all of them, or those of the groups of the
    -- messages that changed - and the same rows counted again in. A slice ends where the next
    -- one starts. The statement's parts share one snapshot: the DELETE sees no row the INSERT
    -- adds.
    FOR run IN
        SELECT u.hour AS range_from, u.hour + interval '1 hour' AS range_to,
               NULL::bigint[] AS messages
        FROM unnest(touched) AS u(hour)
        UNION ALL
        SELECT slices[r.i], coalesce(slices[r.i + 1], new_from), NULL
        FROM unnest(redone) AS r(i)
        UNION ALL
        SELECT p.range_from,
               CASE WHEN p.range_from < open_hour THEN p.range_from + interval '1 hour'
                    ELSE coalesce((SELECT min(s.start) FROM unnest(slices) AS s(start)
                                   WHERE s.start > p.range_from), new_from)
               END,
               array_agg(p.id)
        FROM unnest(partial_from, partial_messages) AS p(range_from, id)
        GROUP BY p.range_from
        UNION ALL
        SELECT new_from, frontier, NULL WHERE new_from < frontier
    LOOP
        WITH fresh AS MATERIALIZED (
            SELECT * FROM dlr.quality_facts(run.range_from, run.range_to, NULL, '-infinity',
                                            countries, run.messages)
        ),
        stale AS (
            DELETE FROM dlr.quality_hours AS q
            WHERE q.hour >= run.range_from AND q.hour < run.range_to
              AND (run.messages IS NULL
                   OR (q.hour = run.range_from
                       AND jsonb_build_array(q.login, q.source, q.route, q.country) IN (
                               SELECT jsonb_build_array(f.login, f.source, f.route, f.country)
                               FROM fresh AS f)))
        )
        INSERT INTO dlr.quality_hours
        SELECT run.range_from, f.login, f.source, f.route, f.country, f.err, f.status,
               f.is_final, f.messages, f.verified, f.with_done_time, f.to_done_buckets,
               f.to_done_counts, f.to_received_buckets, f.to_received_counts, f.awaiting_sent
        FROM fresh AS f;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        rewritten := rewritten + (inserted > 0)::integer;
    END LOOP;
    UPDATE dlr.quality_refresh
    SET position = greatest(horizon, read_from), refreshed_at = now(), countries_digest = digest,
        open_from = frontier;
    RETURN rewritten;
END;
$$;

-- dlr.refresh_quality_hours_up_to `up_to`, never past the database's clock (a report's
-- window end: what it counts raw then starts there). Runs as the owner; only the writer may
-- call it (docs/security.md): the caller supplies the country map.
CREATE FUNCTION dlr.refresh_quality_hours(countries jsonb, up_to timestamptz) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN dlr.refresh_quality_hours_up_to(countries, least(up_to, clock_timestamp()));

-- The marks: of the messages recorded or forgotten, the first send time in each minute (one
-- mark a statement and minute); messages verified, and messages whose status a recompute
-- rewrote (a new supporting receipt may keep the status, reason and finality, hence log no
-- change, and still move the done time and the latencies).
-- Written whether or not the rollup was ever built: a message recorded while the first build
-- runs must be read by the next refresh, and nothing here may wait for a build. `maintain`
-- drops the marks of a rollup never built (quality.drop_unread_marks).
CREATE FUNCTION dlr.mark_sent_times() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO dlr.quality_marks (sent_at)
    SELECT min(coalesce(m.submitted_at, m.recorded_at))
    FROM changed_messages AS m
    GROUP BY date_trunc('minute', coalesce(m.submitted_at, m.recorded_at), 'UTC');
    RETURN NULL;
END;
$$;

CREATE FUNCTION dlr.mark_messages() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO dlr.quality_marks (login, message_id)
    SELECT DISTINCT v.login, v.message_id FROM marked_messages AS v;
    RETURN NULL;
END;
$$;

CREATE TRIGGER messages_quality_marks_insert AFTER INSERT ON dlr.messages
    REFERENCING NEW TABLE AS changed_messages
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.mark_sent_times();
CREATE TRIGGER messages_quality_marks_delete AFTER DELETE ON dlr.messages
    REFERENCING OLD TABLE AS changed_messages
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.mark_sent_times();
CREATE TRIGGER verifications_quality_marks AFTER INSERT ON dlr.verifications
    REFERENCING NEW TABLE AS marked_messages
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.mark_messages();
CREATE TRIGGER status_recomputations_quality_marks AFTER INSERT ON dlr.status_recomputations
    REFERENCING NEW TABLE AS marked_messages
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.mark_messages();

-------------------------------------------------------------------------------------------
-- Roles (docs/security.md): what each dlrfeed group role of sql/roles.sql may do. Where the
-- roles do not exist (a developer's throwaway database) nothing is granted. The block is
-- idempotent: when the roles are created after the schema, the owner runs it again as it is.
-- Nobody but the owner gets DELETE or TRUNCATE on any table, or CREATE on the schema; a
-- table or column added later is granted explicitly (tests/integration/test_roles.py checks
-- that the reader can read every table).
-------------------------------------------------------------------------------------------

REVOKE ALL ON FUNCTION dlr.add_reasons(text[]), dlr.reason_ids(text[]),
    dlr.check_reason_ids(integer[]), dlr.create_reception_partitions(timestamptz),
    dlr.create_status_change_partitions(timestamptz),
    dlr.latest_withdrawal(text, text, timestamptz, timestamptz),
    dlr.record_status_changes(), dlr.move_events_to_messages(),
    dlr.refresh_quality_hours(jsonb, timestamptz),
    dlr.refresh_quality_hours_up_to(jsonb, timestamptz),
    dlr.mark_sent_times(),
    dlr.mark_messages()
    FROM PUBLIC;

DO $grants$
BEGIN
    -- Only what the owner created is ours to grant; PUBLIC gets nothing in schema dlr.
    REVOKE ALL ON SCHEMA dlr, dlr_partitions FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA dlr FROM PUBLIC;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA dlr FROM PUBLIC;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        -- `dlrfeed run`, `dlrfeed webhook` (Store.ingest) and `dlrfeed record-submissions`.
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_writer;
        GRANT SELECT ON dlr.schema_version TO dlrfeed_writer;  -- the start-up schema check
        -- P5: messages are recorded, never changed. Row locks (SELECT ... FOR NO KEY UPDATE,
        -- the P10 correlation lock) require UPDATE on at least one column: the surrogate key
        -- `id`, which a trigger keeps as it is.
        GRANT SELECT, INSERT, UPDATE (id) ON dlr.messages TO dlrfeed_writer;
        -- P14: events are inserted once; only their delivery counters and later contents move.
        GRANT SELECT, INSERT,
              UPDATE (times_received, conflicting_receptions, last_received_at, updates,
                      later_results, conflicting_contents)
              ON dlr.event_rows, dlr.message_events TO dlrfeed_writer;
        GRANT USAGE ON SEQUENCE dlr.events_id_seq TO dlrfeed_writer;
        GRANT SELECT ON dlr.events TO dlrfeed_writer;
        -- P7: the statuses are recomputed and rewritten by the rules (never deleted).
        GRANT SELECT, INSERT, UPDATE ON dlr.statuses TO dlrfeed_writer;
        GRANT SELECT ON dlr.message_status, dlr.reasons TO dlrfeed_writer;
        GRANT EXECUTE ON FUNCTION dlr.reason_ids(text[]) TO dlrfeed_writer;
        -- P13: receptions are appended, never updated, deleted or truncated; late correlation
        -- reads back what the planner needs, never the payload.
        GRANT INSERT ON dlr.reception_rows TO dlrfeed_writer;
        GRANT SELECT (id, stat, err, done_date_raw, done_at, received_at, flags, event_id,
                      fingerprint)
              ON dlr.reception_rows TO dlrfeed_writer;
        GRANT USAGE ON SEQUENCE dlr.receptions_id_seq TO dlrfeed_writer;
        -- P12/C8: exceptions are opened, and late correlation resolves `uncorrelated` ones.
        GRANT SELECT, INSERT, UPDATE (resolved_at, resolution)
              ON dlr.exceptions TO dlrfeed_writer;
        -- C6: `dlrfeed record-verifications`.
        GRANT SELECT, INSERT ON dlr.verifications TO dlrfeed_writer;
        -- The daemon's route gauges (docs/quality.md).
        GRANT SELECT ON dlr.quality_hours, dlr.quality_refresh TO dlrfeed_writer;
        -- Its lock, in EXCLUSIVE mode (which needs UPDATE; the table has no row to update).
        GRANT UPDATE ON dlr.quality_refresh_lock TO dlrfeed_writer;
        GRANT EXECUTE ON FUNCTION dlr.refresh_quality_hours(jsonb, timestamptz) TO dlrfeed_writer;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        -- `dlrfeed show`, `exceptions`, `stats`, `changes`, `quality` and any reporting: read
        -- everything, write nothing.
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_reader;
        GRANT SELECT ON ALL TABLES IN SCHEMA dlr TO dlrfeed_reader;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_operator') THEN
        -- `dlrfeed exceptions --resolve` and a consumer's place in the change log (a member
        -- of dlrfeed_reader for the reads).
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_operator;
        GRANT UPDATE (resolved_at, resolution) ON dlr.exceptions TO dlrfeed_operator;
        GRANT INSERT, UPDATE (position, updated_at) ON dlr.change_cursors TO dlrfeed_operator;
    END IF;
END
$grants$;
