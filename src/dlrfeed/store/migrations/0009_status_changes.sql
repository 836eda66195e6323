-- The status-change log (docs/changes.md): one row per change of a message's computed status,
-- written by triggers on dlr.message_status in the transaction that wrote the status, so every
-- writer (live ingest, late correlation, a recompute) is covered without knowing of the log.
--
-- Positions and the gap. A reader asks for "changes after position P". A sequence alone cannot
-- serve that: a writer may draw 5, another 6 and commit first, and a reader that moved to 6
-- never sees 5. So a position is two parts, printed as one decimal integer
--     position = epoch * 10^19 + tick
-- - tick: nextval of dlr.status_changes_tick (< 2^63 < 10^19), drawn as the row is written;
-- - epoch: the writing transaction's id (pg_current_xact_id), raised to the epoch of the
--   message's previous change when that is larger (a transaction that took its id before
--   another but locked the message after it; P16 row locks order the writers of one message).
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
-- Rows are partition-ready for retention by time: the key includes changed_at.

CREATE SEQUENCE dlr.status_changes_tick;  -- CACHE 1: ticks follow real time (point 2)

CREATE TABLE dlr.status_changes (
    position            numeric     NOT NULL,   -- epoch * 10^19 + tick, see above
    changed_at          timestamptz NOT NULL DEFAULT now(),  -- the writing transaction's time
    login               text        NOT NULL,
    message_id          text        NOT NULL,
    status              text        NOT NULL,
    is_final            boolean     NOT NULL,
    reason              text        NOT NULL,
    supporting_event_id bigint      NOT NULL,   -- dlr.events.id (no FK, as message_status)
    rules_version       text        NOT NULL,
    previous_status     text,                   -- NULL for a message's first status
    previous_is_final   boolean,
    previous_reason     text,
    PRIMARY KEY (position, changed_at)
);
-- A message's changes in order: the writers' epoch lookup and `dlrfeed show`-style histories.
CREATE INDEX status_changes_message_idx ON dlr.status_changes (login, message_id, position);

-- Durable named cursors (`--consumer NAME`): where each consumer has got to.
CREATE TABLE dlr.change_cursors (
    consumer   text        PRIMARY KEY,
    position   numeric     NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One function for both triggers (a trigger with transition tables has one event; INSERT ...
-- ON CONFLICT DO UPDATE fires both). SECURITY DEFINER: the daemon's role writes the log only
-- through this function, never directly, so it cannot forge or rewrite a change.
CREATE FUNCTION dlr.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dlr.status_changes (
            position, login, message_id, status, is_final, reason, supporting_event_id,
            rules_version)
        SELECT greatest(own_epoch, coalesce(trunc(p.position / 1e19), 0)) * 1e19
                   + nextval('dlr.status_changes_tick'),
               n.login, n.message_id, n.status, n.is_final, n.reason, n.supporting_event_id,
               n.rules_version
        FROM new_rows AS n
        LEFT JOIN LATERAL (
            SELECT max(c.position) AS position FROM dlr.status_changes AS c
            WHERE c.login = n.login AND c.message_id = n.message_id
        ) AS p ON true;
    ELSE
        -- Only real changes: a rewrite that keeps status, finality and reason writes nothing.
        INSERT INTO dlr.status_changes (
            position, login, message_id, status, is_final, reason, supporting_event_id,
            rules_version, previous_status, previous_is_final, previous_reason)
        SELECT greatest(own_epoch, coalesce(trunc(p.position / 1e19), 0)) * 1e19
                   + nextval('dlr.status_changes_tick'),
               n.login, n.message_id, n.status, n.is_final, n.reason, n.supporting_event_id,
               n.rules_version, o.status, o.is_final, o.reason
        FROM new_rows AS n
        JOIN old_rows AS o USING (login, message_id)
        LEFT JOIN LATERAL (
            SELECT max(c.position) AS position FROM dlr.status_changes AS c
            WHERE c.login = n.login AND c.message_id = n.message_id
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

CREATE TRIGGER message_status_changes_insert
    AFTER INSERT ON dlr.message_status
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_status_changes();
CREATE TRIGGER message_status_changes_update
    AFTER UPDATE ON dlr.message_status
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.record_status_changes();

-- The statuses already stored become each message's first change, so a new consumer that
-- reads from 0 sees every message's current status (epoch = this migration's transaction).
INSERT INTO dlr.status_changes (
    position, login, message_id, status, is_final, reason, supporting_event_id, rules_version,
    changed_at)
SELECT pg_current_xact_id()::text::numeric * 1e19 + nextval('dlr.status_changes_tick'),
       login, message_id, status, is_final, reason, supporting_event_id, rules_version,
       updated_at
FROM dlr.message_status
ORDER BY updated_at, login, message_id;

DO $grants$
BEGIN
    REVOKE ALL ON dlr.status_changes, dlr.change_cursors FROM PUBLIC;
    REVOKE ALL ON SEQUENCE dlr.status_changes_tick FROM PUBLIC;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        -- `dlrfeed changes` without --consumer, and any reporting.
        GRANT SELECT ON dlr.status_changes, dlr.change_cursors TO dlrfeed_reader;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_operator') THEN
        -- `dlrfeed changes --consumer` and `dlrfeed relay` keep their place (a cursor row).
        GRANT INSERT, UPDATE (position, updated_at) ON dlr.change_cursors TO dlrfeed_operator;
    END IF;
END
$grants$;
