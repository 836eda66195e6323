-- Forgetting old messages (`dlrfeed maintain --forget-after-days N`, docs/retention.md). The
-- evidence and the change log leave by whole days; a message's record, status and events have
-- public unique keys and cannot be partitioned by time, so they leave row by row, a whole
-- message at a time, once every delivery of it has left with the evidence. Only the schema
-- owner deletes rows (0002). Two things in the schema let it forget:
--
-- 1. Forgetting is not a withdrawal. Deleting a status row writes a "withdrawn" change (0012)
--    so that a consumer hears a status is gone. A forgotten message's changes left with the
--    change log's days before it (the forgetting age is longer than the retention), and a relay
--    must not post a withdrawal for each. So the delete trigger does not fire in a transaction
--    that says it forgets (dlr.forgetting()); only the schema owner's can say so, and `dlrfeed
--    recompute`'s deletes are still withdrawals.
-- 2. Where the pass got to. It reads messages in the order they were recorded (dlr.messages.id)
--    and keeps its position here, just before the first message it kept, so that a run does not
--    read again through the index entries of the messages forgotten before it.

CREATE FUNCTION dlr.forgetting() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('dlrfeed.forgetting', true), '') = 'on'
       AND pg_has_role(session_user,
                       (SELECT nspowner FROM pg_namespace WHERE nspname = 'dlr'), 'USAGE')
$$;
COMMENT ON FUNCTION dlr.forgetting() IS
    'true in a transaction of the schema owner that forgets old messages (set_config of'
    ' dlrfeed.forgetting, local to it): their statuses go without a withdrawn change';

DROP TRIGGER message_status_changes_delete ON dlr.message_status;
CREATE TRIGGER message_status_changes_delete
    AFTER DELETE ON dlr.message_status
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT WHEN (NOT dlr.forgetting())
    EXECUTE FUNCTION dlr.record_status_changes();

CREATE TABLE dlr.forgetting_position (
    only_row         boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    after_id         bigint      NOT NULL,      -- dlr.messages.id: every message up to it was looked at
    updated_at       timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON dlr.forgetting_position FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.forgetting_position TO dlrfeed_reader;
    END IF;
END
$grants$;
