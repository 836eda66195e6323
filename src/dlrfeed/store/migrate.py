"""Schema migrations: ordered SQL files applied once each, under an advisory lock.

`migrations/NNNN_name.sql` files are applied in number order, each in its own transaction
together with its row in `dlr.schema_version`. Two `dlrfeed migrate` running at once are safe:
the second waits on the advisory lock each step takes, then finds nothing left to do.
`migration_plan` spells out, without running anything, the very statements `migrate` would
run (`--dry-run`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store.sql import query

# An arbitrary, fixed key so every dlrfeed process serialises migrations on the same lock.
_MIGRATION_LOCK_KEY = 0x646C7266  # "dlrf"
_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

_BOOTSTRAP = (query("create_schema"), query("create_version_table"))
_LOCK = query("lock_migrations")
_RECORD_MIGRATION = query("record_migration")
_VERSION_TABLE_EXISTS = query("version_table_exists")
_SCHEMA_VERSION = query("schema_version")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    """Every migration shipped with this code, in version order."""
    found: list[Migration] = []
    for entry in resources.files("dlrfeed.store.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    return found


def expected_version() -> int:
    """The schema version this code needs."""
    migrations = available_migrations()
    return migrations[-1].version if migrations else 0


async def current_version(conn: asyncpg.Connection) -> int:
    """The schema version recorded in the database (0 when never migrated)."""
    if not await _VERSION_TABLE_EXISTS.fetchval(conn):
        return 0
    version = await _SCHEMA_VERSION.fetchval(conn)
    return int(version)


async def migrate(dsn: str) -> list[str]:
    """Bring the database at `dsn` up to date; returns the names of the migrations applied.

    Needs no session of its own, so it runs through a transaction pooler too: each step is one
    transaction that takes the migration lock (transaction-scoped) and reads the version again
    under it, and no named prepared statement is used.
    """
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    applied: list[str] = []
    try:
        async with conn.transaction():
            await _LOCK.execute(conn, migration_lock_key=_MIGRATION_LOCK_KEY)
            for statement in _BOOTSTRAP:
                await statement.execute(conn)
            refuse_newer_schema(await current_version(conn))
        for migration in available_migrations():
            async with conn.transaction():
                await _LOCK.execute(conn, migration_lock_key=_MIGRATION_LOCK_KEY)
                if migration.version <= await current_version(conn):
                    continue
                await conn.execute(migration.sql)
                await _RECORD_MIGRATION.execute(
                    conn, migration_version=migration.version, migration_name=migration.name
                )
            applied.append(migration.name)
    finally:
        await conn.close()
    return applied


def pending_migrations(version: int) -> list[Migration]:
    """The migrations a database at schema `version` still needs, in the order they run."""
    return [m for m in available_migrations() if m.version > version]


def migration_plan(version: int) -> str:
    """The SQL `migrate` would run on a database at schema `version`, as one psql script: each
    migration in its transaction with the statement that records it, all under the advisory
    lock `migrate` holds (so a script run by hand and a `migrate` wait for each other); psql
    stops at its first error. An up-to-date database gets a comment saying so.
    """
    refuse_newer_schema(version)
    pending = pending_migrations(version)
    target = expected_version()
    if not pending:
        return f"-- schema dlr is at version {version}: nothing to run\n"
    parts = [
        f"-- dlrfeed migrate: schema dlr from version {version} to {target}, "
        f"{len(pending)} migration(s)",
        "\\set ON_ERROR_STOP on",
        f"\\set migration_lock_key {_MIGRATION_LOCK_KEY}",
        f"{query('lock_migrations_session').source};",
        *(f"{statement.source};" for statement in _BOOTSTRAP),
    ]
    for migration in pending:
        parts += [
            f"\n-- {migration.name}",
            "BEGIN;",
            migration.sql.strip(),
            # The recording statement as `migrate` runs it, its parameters psql variables; in
            # psql quoting '' is one quote, so the name variable holds a SQL literal (file
            # names match _FILE_NAME: nothing else to escape).
            f"\\set migration_version {migration.version}",
            f"\\set migration_name '''{migration.name}'''",
            f"{_RECORD_MIGRATION.source};",
            "COMMIT;",
        ]
    parts.append(f"\n{query('unlock_migrations_session').source};")
    return "\n".join(parts) + "\n"


def refuse_newer_schema(version: int) -> None:
    """Raise SchemaOutOfDateError (exit 78) when a database at schema `version` is ahead of
    this code: nothing here can migrate it back, and code older than its schema may read or
    write what the schema no longer means, so every command refuses it in one line."""
    want = expected_version()
    if version > want:
        raise SchemaOutOfDateError(
            f"database schema is at version {version}, newer than this dlrfeed ({want}): "
            "upgrade dlrfeed"
        )


async def ensure_current(conn: asyncpg.Connection) -> None:
    """Raise SchemaOutOfDateError unless the database is at exactly this code's version."""
    have, want = await current_version(conn), expected_version()
    refuse_newer_schema(have)
    if have < want:
        raise SchemaOutOfDateError(
            f"database schema is at version {have}, this dlrfeed needs {want}: "
            "run `dlrfeed migrate`"
        )
