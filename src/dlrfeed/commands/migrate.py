"""Create or upgrade the database schema `dlr` (idempotent; safe to run concurrently)."""

from __future__ import annotations

import argparse

import asyncpg
import asyncpg.exceptions

from dlrfeed.config import add_database_url, required
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.migrate import (
    current_version,
    expected_version,
    migrate,
    migration_plan,
    pending_migrations,
    refuse_newer_schema,
)

CHECK_BEHIND_EXIT = 3
"""`migrate --check`: the schema is behind this dlrfeed (migrations pending). Distinct from 1
(PostgreSQL unreachable or refusing), 2 (bad usage) and 78 (schema newer than this dlrfeed)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The database URL (of the owner role, docs/security.md); --dry-run or --check."""
    add_database_url(parser, pooler=False)  # needs no session: runs through a pooler too
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--dry-run",
        action="store_true",
        help="print the SQL that would run (a psql script) and change nothing",
    )
    what.add_argument(
        "--check",
        action="store_true",
        help=f"change nothing; exit {CHECK_BEHIND_EXIT} when migrations are pending, "
        "78 when the schema is newer than this dlrfeed, 0 when it is current",
    )


async def run(args: argparse.Namespace) -> int:
    """Apply the migrations still missing (or, with --dry-run/--check, only look)."""
    database_url = required(args, "database_url")
    try:
        if args.dry_run or args.check:
            version = await _read_version(database_url)
        else:
            applied = await migrate(database_url)
    except (OSError, asyncpg.exceptions.PostgresConnectionError) as exc:
        raise StoreUnavailableError(f"cannot reach PostgreSQL: {exc}") from exc
    except asyncpg.PostgresError as exc:
        # e.g. a refused password or a missing privilege: retrying cannot help.
        raise FatalError(f"migration failed: {exc}") from exc
    if args.dry_run:
        print(migration_plan(version), end="")
        return 0
    if args.check:
        return _check(version)
    for name in applied:
        print(f"applied {name}")
    print(f"schema dlr at version {expected_version()}")
    return 0


async def _read_version(database_url: str) -> int:
    """The schema version, read in a read-only transaction: looking changes nothing."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction(readonly=True):
            return await current_version(conn)
    finally:
        await conn.close()


def _check(version: int) -> int:
    """One line for a deploy pipeline; the exit status says whether `migrate` has work."""
    refuse_newer_schema(version)
    pending = pending_migrations(version)
    if not pending:
        print(f"schema dlr at version {version}: up to date")
        return 0
    names = ", ".join(m.name for m in pending)
    print(
        f"schema dlr at version {version}, this dlrfeed needs {expected_version()}: "
        f"{len(pending)} migration(s) pending ({names}); run `dlrfeed migrate`"
    )
    return CHECK_BEHIND_EXIT
