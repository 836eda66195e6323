"""Deploy safety: `migrate --dry-run` prints what would run and changes nothing, `migrate
--check` tells a pipeline whether the schema is behind, and every command that needs the schema
refuses one newer than it knows, in one line (exit 78) — all as real processes on a real server."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.commands.migrate import CHECK_BEHIND_EXIT
from dlrfeed.store.migrate import available_migrations, expected_version
from dlrfeed_tools.pgcluster import PgCluster
from support.console import dlrfeed
from support.schema import describe

EXPECTED = Path(__file__).with_name("test_migrations_schema.txt")
_numbers = itertools.count(1)
NEWER = expected_version() + 1


def psql(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run a script the way a DBA would: `psql -f -`, stopping at the first error."""
    return subprocess.run(
        ["psql", "--no-psqlrc", "--quiet", "-d", dsn, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
async def empty_database(pg_cluster: PgCluster) -> AsyncIterator[str]:
    """A database with nothing in it (not copied from the migrated template)."""
    name = f"deploy_{os.getpid()}_{next(_numbers)}"
    yield await pg_cluster.create_database(name)
    await pg_cluster.drop_database(name)


async def migrate_by_hand_to(dsn: str, version: int) -> None:
    """A database at an older schema version: the first migrations applied as migrate does."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE SCHEMA dlr; CREATE TABLE dlr.schema_version (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in available_migrations():
            if migration.version > version:
                break
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO dlr.schema_version VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
    finally:
        await conn.close()


async def mark_newer(dsn: str) -> None:
    """What a later dlrfeed's migrate leaves behind: a version this code does not know."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO dlr.schema_version (version, name) VALUES ($1, $2)",
            NEWER,
            f"{NEWER:04d}_from_the_future.sql",
        )
    finally:
        await conn.close()


async def schema_exists(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT to_regnamespace('dlr') IS NOT NULL"))
    finally:
        await conn.close()


async def test_dry_run_on_an_empty_database_changes_nothing_and_its_script_builds_the_schema(
    empty_database: str,
) -> None:
    """The printed plan is the whole story: nothing ran (not even the version table), and the
    plan run by hand through psql builds exactly the schema `migrate` builds."""
    done = await asyncio.to_thread(
        dlrfeed, "migrate", "--dry-run", "--database-url", empty_database
    )
    assert done.returncode == 0, done.stderr
    assert not await schema_exists(empty_database)
    for migration in available_migrations():
        assert f"-- {migration.name}\n" in done.stdout
    ran = await asyncio.to_thread(psql, empty_database, done.stdout)
    assert ran.returncode == 0, ran.stderr
    assert await describe(empty_database) == EXPECTED.read_text()
    # Now current: the plan is empty, and --check agrees.
    again = await asyncio.to_thread(
        dlrfeed, "migrate", "--dry-run", "--database-url", empty_database
    )
    assert again.stdout == f"-- schema dlr is at version {expected_version()}: nothing to run\n"
    check = await asyncio.to_thread(dlrfeed, "migrate", "--check", "--database-url", empty_database)
    assert check.returncode == 0
    assert check.stdout == f"schema dlr at version {expected_version()}: up to date\n"


async def test_dry_run_and_check_on_a_schema_behind_name_only_the_pending_migrations(
    empty_database: str,
) -> None:
    migrations = available_migrations()
    # One migration behind: with the baseline alone, a store that has its version table only.
    behind = migrations[-2].version if len(migrations) > 1 else 0
    await migrate_by_hand_to(empty_database, behind)
    pending = [m.name for m in migrations if m.version > behind]

    check = await asyncio.to_thread(dlrfeed, "migrate", "--check", "--database-url", empty_database)
    assert check.returncode == CHECK_BEHIND_EXIT == 3
    assert check.stdout.splitlines() == [
        f"schema dlr at version {behind}, this dlrfeed needs {expected_version()}: "
        f"{len(pending)} migration(s) pending ({', '.join(pending)}); run `dlrfeed migrate`"
    ]
    plan = await asyncio.to_thread(
        dlrfeed, "migrate", "--dry-run", "--database-url", empty_database
    )
    assert plan.returncode == 0
    named = [line[3:] for line in plan.stdout.splitlines() if line.startswith("-- 0")]
    assert named == pending
    conn = await asyncpg.connect(empty_database)
    try:
        assert (
            await conn.fetchval("SELECT coalesce(max(version), 0) FROM dlr.schema_version")
            == behind
        )
    finally:
        await conn.close()
    ran = await asyncio.to_thread(psql, empty_database, plan.stdout)
    assert ran.returncode == 0, ran.stderr
    assert await describe(empty_database) == EXPECTED.read_text()
    assert (
        await asyncio.to_thread(dlrfeed, "migrate", "--check", "--database-url", empty_database)
    ).returncode == 0


async def test_check_without_a_server_is_not_mistaken_for_pending_migrations() -> None:
    """A pipeline must tell "migrations pending" (3) from "cannot look" (1)."""
    done = await asyncio.to_thread(
        dlrfeed, "migrate", "--check", "--database-url", "postgresql://nobody@127.0.0.1:1/none"
    )
    assert done.returncode == 1
    assert done.stderr.startswith("dlrfeed: cannot reach PostgreSQL")
    assert done.stderr.count("\n") == 1


async def test_every_command_refuses_a_schema_newer_than_it_knows(
    database_url: str, tmp_path: Path
) -> None:
    """A schema migrated by a later dlrfeed: migrate (all three forms), the daemon, the relay,
    maintain and every operator command stop with one line and exit 78 (systemd does not
    restart on it), and nothing is written."""
    await mark_newer(database_url)
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    newer = f"database schema is at version {NEWER}, newer than this dlrfeed "
    commands = {
        "migrate": ["migrate"],
        "migrate --check": ["migrate", "--check"],
        "migrate --dry-run": ["migrate", "--dry-run"],
        "run": ["run", "--gateway", "127.0.0.1:1", "--login", "acme"],
        "record-submissions": ["record-submissions", "-"],
        "recompute": ["recompute"],
        "show": ["show", "m1"],
        "exceptions": ["exceptions"],
        "stats": ["stats"],
        "changes": ["changes"],
        "changes --follow": ["changes", "--follow", "--consumer", "billing"],
        "relay": ["relay", "--url", "http://127.0.0.1:1/hook", "--secret-file", str(secret)],
        "maintain": ["maintain", "--retention-days", "30"],
    }
    line = '{"message_id": "m1", "destination": "+34600000001", "login": "acme"}\n'
    for what, argv in commands.items():
        done = await asyncio.to_thread(
            dlrfeed, *argv, "--database-url", database_url, stdin=line, password="pw"
        )
        assert done.returncode == 78, (what, done.stderr[-800:])
        assert done.stdout == "", what
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"dlrfeed: {newer}"), (what, done.stderr[-800:])
        assert last.endswith("upgrade dlrfeed"), what
        assert "Traceback" not in done.stderr, what
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM dlr.messages") == 0
        assert await conn.fetchval("SELECT count(*) FROM dlr.change_cursors") == 0
        assert await conn.fetchval("SELECT max(version) FROM dlr.schema_version") == NEWER
    finally:
        await conn.close()
