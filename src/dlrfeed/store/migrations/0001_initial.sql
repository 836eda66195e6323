-- The receipt store (interfaces §4, P5–P8). Applied by `dlrfeed migrate` inside one transaction.
-- Five tables: what was sent (messages), every delivery as evidence (receptions, append-only),
-- one row per logical event (events), the computed summary (message_status) and the
-- investigation queue (exceptions).

CREATE SCHEMA IF NOT EXISTS dlr;

-- P5: what was sent, written by the sending application (`dlrfeed record-submissions`).
CREATE TABLE dlr.messages (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login           text        NOT NULL,
    message_id      text        NOT NULL,          -- the gateway's id, exactly as returned (P10)
    internal_id     text        NOT NULL,          -- the sending application's immutable id
    destination     text        NOT NULL,          -- E.164 when normalisable, else the raw value
    destination_raw text        NOT NULL,          -- the addressing exactly as sent
    destination_is_e164 boolean NOT NULL,
    source          text,
    route           text,
    submitted_at    timestamptz,
    dlr_requested   boolean     NOT NULL DEFAULT true,   -- P3
    dlr_level       smallint    CHECK (dlr_level IN (1, 2, 3)),
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT messages_login_message_id_key UNIQUE (login, message_id)
);

-- P13/P14: one row per logical event (login, id, level) (F8).
CREATE TABLE dlr.events (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login                 text        NOT NULL,
    message_id            text        NOT NULL,    -- the receipt's id, as received (storable form)
    correlation_id        text        NOT NULL,    -- the id used to find the message (P10 option)
    level                 bigint      NOT NULL,
    stat                  text        NOT NULL,    -- P17 raw layer
    status                text        NOT NULL,    -- P17 normalised layer
    err                   text,
    done_date_raw         text,
    done_at               timestamptz,
    fingerprint           text        NOT NULL,    -- P14, see docs/rules.md
    flags                 text[]      NOT NULL DEFAULT '{}',
    times_received        integer     NOT NULL DEFAULT 1,  -- deliveries with this exact content
    conflicting_receptions integer    NOT NULL DEFAULT 0,  -- deliveries of this key with other content
    parser_version        text        NOT NULL,    -- P8
    rules_version         text        NOT NULL,    -- P8
    first_received_at     timestamptz NOT NULL,
    last_received_at      timestamptz NOT NULL,
    CONSTRAINT events_login_message_id_level_key UNIQUE (login, message_id, level)
);
CREATE INDEX events_login_correlation_id_idx ON dlr.events (login, correlation_id);

-- P6/P13: every delivery of every receipt, repeats included. Append-only (trigger below).
CREATE TABLE dlr.receptions (
    id               bigint      NOT NULL,         -- from receptions_id_seq, allocated in the ingest statement
    login            text        NOT NULL,
    message_id       text        NOT NULL,         -- as received (storable form)
    level            bigint      NOT NULL,
    stat             text        NOT NULL,
    err              text,
    submit_date_raw  text,
    submit_at        timestamptz,
    done_date_raw    text,
    done_at          timestamptz,
    delivery_count   bigint      NOT NULL,
    received_at      timestamptz NOT NULL,         -- P19: our clock, never the reported one
    stored_at        timestamptz NOT NULL DEFAULT now(),
    payload          bytea       NOT NULL,         -- P9: the serialized receipt, whole
    payload_json     jsonb       NOT NULL,         -- the same for humans (NUL escaped, see docs/rules.md)
    flags            text[]      NOT NULL DEFAULT '{}',
    outcome          text        NOT NULL CHECK (outcome IN
                         ('applied', 'repeat', 'late_progress', 'superseded', 'corroborated',
                          'conflict', 'uncorrelated', 'unrecognized')),
    -- No FOREIGN KEY: a per-row FK check would cost the hot path ~a third of its time; the
    -- ingest transaction writes the event before its receptions, in the same transaction.
    event_id         bigint      NOT NULL,
    parser_version   text        NOT NULL,
    -- One index only (each index costs every insert): it serves `show MESSAGE_ID` and makes
    -- `id` unique all the same.
    PRIMARY KEY (login, message_id, id)
);
CREATE SEQUENCE dlr.receptions_id_seq OWNED BY dlr.receptions.id;
ALTER TABLE dlr.receptions ALTER COLUMN id SET DEFAULT nextval('dlr.receptions_id_seq');

CREATE FUNCTION dlr.forbid_reception_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- P13: the reception log is evidence; it is appended to, never rewritten.
    RAISE EXCEPTION 'dlr.receptions is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER receptions_append_only
    BEFORE UPDATE OR DELETE ON dlr.receptions
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reception_change();
CREATE TRIGGER receptions_no_truncate
    BEFORE TRUNCATE ON dlr.receptions
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.forbid_reception_change();

-- P7/P20: the computed summary of one correlated message.
CREATE TABLE dlr.message_status (
    login               text        NOT NULL,
    message_id          text        NOT NULL,      -- dlr.messages.message_id
    status              text        NOT NULL,
    is_final            boolean     NOT NULL,
    reason              text        NOT NULL,
    supporting_event_id bigint      NOT NULL,      -- dlr.events.id (no FK: see receptions)
    repeats             integer     NOT NULL DEFAULT 0,
    conflicts           integer     NOT NULL DEFAULT 0,
    progress_events     integer     NOT NULL DEFAULT 0,
    deadline_superseded boolean     NOT NULL DEFAULT false,  -- option deadline_unknown_superseded
    rules_version       text        NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (login, message_id)
) WITH (fillfactor = 80);  -- room for HOT updates: the row is rewritten as events arrive
-- Only the primary key is indexed so that status updates stay HOT (no index entry rewritten);
-- counts by status (`dlrfeed stats`) scan the table.

-- P12/P18/P20, C3/C4/C8: the investigation queue.
CREATE TABLE dlr.exceptions (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL CHECK (kind IN
                         ('uncorrelated', 'conflict', 'unrecognized', 'unstorable', 'malformed')),
    login            text        NOT NULL,
    message_id       text,                          -- storable form of the receipt id
    details          jsonb       NOT NULL DEFAULT '{}',
    event_id         bigint      REFERENCES dlr.events (id),
    reception_id     bigint,                        -- dlr.receptions.id (of login, message_id)
    evidence         bytea,                         -- C8: raw bytes when no reception could be stored
    opened_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    resolution       text,
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE INDEX exceptions_open_kind_idx ON dlr.exceptions (kind, opened_at) WHERE resolved_at IS NULL;
CREATE INDEX exceptions_login_message_id_idx ON dlr.exceptions (login, message_id);
CREATE INDEX exceptions_event_id_idx ON dlr.exceptions (event_id);
