-- Least privilege (docs/security.md): what each dlrfeed group role may do in schema dlr.
-- The roles are cluster-wide and created once by a DBA with sql/roles.sql; where they do not
-- exist (a developer's throwaway database) this migration grants nothing. Every statement is
-- idempotent: when the roles are created after the schema, running this file again as the
-- owner (`psql -d dlrfeed -f .../0002_roles.sql`) applies the grants.
--
-- Nobody but the owner gets DELETE or TRUNCATE on any table, or CREATE on the schema. A later
-- migration that adds a table or column grants on it explicitly (tests/integration/test_roles.py
-- checks that the reader can read every table).

DO $grants$
BEGIN
    -- Only what the owner created is ours to grant; PUBLIC gets nothing in schema dlr.
    REVOKE ALL ON SCHEMA dlr FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA dlr FROM PUBLIC;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA dlr FROM PUBLIC;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        -- `dlrfeed run` (Store.ingest) and `dlrfeed record-submissions`.
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_writer;
        GRANT SELECT ON dlr.schema_version TO dlrfeed_writer;  -- the start-up schema check
        -- P13: receptions are appended, never read back, updated, deleted or truncated.
        GRANT INSERT ON dlr.receptions TO dlrfeed_writer;
        GRANT USAGE ON SEQUENCE dlr.receptions_id_seq TO dlrfeed_writer;
        -- P5: messages are recorded, never changed. Row locks (SELECT ... FOR NO KEY UPDATE,
        -- the P10 correlation lock) require UPDATE on at least one column: the surrogate key
        -- `id`, which nothing references and which can only be redrawn from its identity
        -- sequence, so no recorded fact of a message can be altered.
        GRANT SELECT, INSERT, UPDATE (id) ON dlr.messages TO dlrfeed_writer;
        -- P14: events are inserted once; only their delivery counters move.
        GRANT SELECT, INSERT,
              UPDATE (times_received, conflicting_receptions, last_received_at)
              ON dlr.events TO dlrfeed_writer;
        -- P7: the projection is recomputed and rewritten by the rules (never deleted).
        GRANT SELECT, INSERT, UPDATE ON dlr.message_status TO dlrfeed_writer;
        -- P12/C8: exceptions are opened, and late correlation resolves `uncorrelated` ones.
        GRANT SELECT, INSERT, UPDATE (resolved_at, resolution)
              ON dlr.exceptions TO dlrfeed_writer;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        -- `dlrfeed show`, `exceptions`, `stats` and any reporting: read everything, write nothing.
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_reader;
        GRANT SELECT ON ALL TABLES IN SCHEMA dlr TO dlrfeed_reader;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_operator') THEN
        -- `dlrfeed exceptions --resolve`: close an investigation, nothing else (a member of
        -- dlrfeed_reader for the reads).
        GRANT USAGE ON SCHEMA dlr TO dlrfeed_operator;
        GRANT UPDATE (resolved_at, resolution) ON dlr.exceptions TO dlrfeed_operator;
    END IF;
END
$grants$;
