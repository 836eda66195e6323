-- Independent verification (C6): evidence, recorded by the sender, that a message really
-- reached a person - an OTP code entered, a reply, a click (docs/quality.md).
--
-- - dlr.verifications holds one row per verification, unique by (login, message_id, kind,
--   verified_at): the same verification recorded twice is one. It is correlated with its
--   message by the gateway's message id only, when read (`dlrfeed show`, the reports):
--   a verification recorded before its message simply waits in the table, and counts from the
--   moment the message is recorded. Nothing reads it when a status is computed, and nothing in
--   it is written by the ingest: a verification never changes a DLR status (P2).
-- - dlr.messages gains an index on the time each message was sent (its submission time, or
--   when it was recorded when the sender gave none), which `dlrfeed quality --since` ranges
--   over: a report over this week reads this week's messages, whatever the store's size.
-- Locks: SHARE on dlr.messages while the index is built (recording waits; the ingest's row
-- locks do not), seconds per million messages; the new table is empty.

SET LOCAL lock_timeout = '5s';

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
-- The reports read a window's verifications by the time verified (never before the message
-- was sent).
CREATE INDEX verifications_verified_at_idx ON dlr.verifications (verified_at);
COMMENT ON TABLE dlr.verifications IS
    'independent verification of a message (C6), correlated by (login, message_id) when read;'
    ' never an input of the computed status (P2)';

CREATE INDEX messages_sent_at_idx ON dlr.messages ((coalesce(submitted_at, recorded_at)));

DO $grants$
BEGIN
    REVOKE ALL ON dlr.verifications FROM PUBLIC;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        -- `dlrfeed record-verifications`: verifications are recorded, never changed.
        GRANT SELECT, INSERT ON dlr.verifications TO dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.verifications TO dlrfeed_reader;
    END IF;
END
$grants$;
