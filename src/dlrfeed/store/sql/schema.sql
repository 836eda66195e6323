-- Schema migrations (dlrfeed.store.migrate). The migrations themselves are the numbered files
-- of dlrfeed/store/migrations/. These statements are written so that a psql script can use
-- them as they are, with psql variables of the same names (`dlrfeed migrate --dry-run`).

-- name: create_schema
-- Before the migrations, so that a database never migrated gets its version table.
CREATE SCHEMA IF NOT EXISTS dlr

-- name: create_version_table
-- The applied migrations, one row each, written in the migration's own transaction.
CREATE TABLE IF NOT EXISTS dlr.schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())

-- name: lock_migrations
-- Every migration step takes this transaction-scoped lock, under a fixed key, so two
-- `dlrfeed migrate` at once serialise (the second then finds nothing left to do).
SELECT pg_advisory_xact_lock(:migration_lock_key)

-- name: lock_migrations_session
-- The same lock for the whole of a psql script of the migrations (`--dry-run`).
SELECT pg_advisory_lock(:migration_lock_key)

-- name: unlock_migrations_session
-- The end of a psql script of the migrations.
SELECT pg_advisory_unlock(:migration_lock_key)

-- name: version_table_exists
-- Whether the database was ever migrated.
SELECT to_regclass('dlr.schema_version') IS NOT NULL

-- name: schema_version
-- The version of the newest migration applied (0: none).
SELECT coalesce(max(version), 0) FROM dlr.schema_version

-- name: record_migration
-- One migration applied, recorded in its own transaction.
INSERT INTO dlr.schema_version (version, name) VALUES (:migration_version, :migration_name)
