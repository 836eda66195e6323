-- dlrfeed database roles (docs/security.md). Run ONCE per cluster, as a superuser or a role
-- with CREATEROLE, connected to the dlrfeed database, BEFORE the first `dlrfeed migrate`:
--
--     psql -v ON_ERROR_STOP=1 -d dlrfeed -f sql/roles.sql
--
-- Roles are cluster-wide objects, so `dlrfeed migrate` never creates them; the schema's grants
-- (the last section of src/dlrfeed/store/migrations/0001_baseline.sql) give each group exactly
-- what it needs on schema `dlr` when the groups exist.
-- Idempotent: running it again changes nothing.
--
-- Four NOLOGIN group roles; give each login (person or service) membership of one of them:
--   dlrfeed_owner     owns schema dlr; `dlrfeed migrate` runs as a member (DDL, everything)
--   dlrfeed_writer    `dlrfeed run` and `dlrfeed record-submissions`: appends receptions,
--                     never rewrites them (no UPDATE/DELETE/TRUNCATE on dlr.receptions, no DDL)
--   dlrfeed_reader    `dlrfeed show`, `exceptions`, `stats` and reporting: SELECT only
--   dlrfeed_operator  a reader that may also resolve exceptions (`dlrfeed exceptions --resolve`):
--                     UPDATE of dlr.exceptions(resolved_at, resolution) and nothing else

DO $roles$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['dlrfeed_owner', 'dlrfeed_writer', 'dlrfeed_reader',
                                'dlrfeed_operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', name);
        END IF;
    END LOOP;
END
$roles$;

-- An operator is a reader with a few more grants (the schema's grants).
GRANT dlrfeed_reader TO dlrfeed_operator;

-- The owner creates schema dlr in this database; nobody else may create anything in it.
DO $db$
BEGIN
    EXECUTE format('GRANT CREATE, CONNECT ON DATABASE %I TO dlrfeed_owner', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO dlrfeed_writer, dlrfeed_reader',
                   current_database());
END
$db$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Example logins (uncomment, choose passwords out of band, e.g. \password in psql):
--   CREATE ROLE dlrfeed_migrate LOGIN IN ROLE dlrfeed_owner;
--   ALTER ROLE dlrfeed_migrate SET role = 'dlrfeed_owner';   -- objects owned by the group
--   CREATE ROLE dlrfeed_daemon  LOGIN IN ROLE dlrfeed_writer;
--   CREATE ROLE dlrfeed_report  LOGIN IN ROLE dlrfeed_reader;
--   CREATE ROLE alice           LOGIN IN ROLE dlrfeed_operator;
