"""Migrations: `dlrfeed migrate` builds exactly the schema file, idempotently.

The schema as it stands is one file, `SCHEMA_FILE`: the baseline migration while it is the only
one; from the second migration on, `src/dlrfeed/store/schema.sql`, which every migration keeps
equal to what the migrations build (docs/postgresql.md, "Changing the schema"). The catalog
description of `test_migrations_schema.txt` beside this file shows a change of the schema in a
review diff; after a deliberate change, regenerate it with
`DLRFEED_REGEN_SCHEMA=1 pytest tests/integration/test_migrations.py` and review the diff.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store
from dlrfeed.store.migrate import available_migrations, current_version, migrate
from dlrfeed.store.sql import query
from dlrfeed_tools.migration_probe import apply_measured, install_before
from dlrfeed_tools.pgcluster import PgCluster, server_bindir
from support.schema import describe

EXPECTED = Path(__file__).with_name("test_migrations_schema.txt")
_STORE = Path(str(resources.files("dlrfeed.store")))
BASELINE = _STORE / "migrations" / "0001_baseline.sql"
# The schema as it stands: the baseline until a second migration exists, then this file.
SCHEMA_FILE = BASELINE
_numbers = itertools.count(1)


@pytest.fixture
async def new_database(pg_cluster: PgCluster) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """A factory of databases with nothing in them (not copied from the migrated template)."""
    names: list[str] = []

    async def create() -> str:
        names.append(f"empty_{os.getpid()}_{next(_numbers)}")
        return await pg_cluster.create_database(names[-1])

    yield create
    for name in names:
        await pg_cluster.drop_database(name)


@pytest.fixture
async def empty_database(new_database: Callable[[], Awaitable[str]]) -> str:
    return await new_database()


def _dump(dsn: str) -> str:
    """pg_dump's DDL of schemas dlr and dlr_partitions, comments and grants included."""
    dump = subprocess.run(
        [
            str(server_bindir() / "pg_dump"),
            "--schema-only",
            "-n",
            "dlr",
            "-n",
            "dlr_partitions",
            "--dbname",
            dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # pg_dump 15.14+ brackets its output with a random key.
    return re.sub(r"^\\(un)?restrict \S+$", "", dump, flags=re.MULTILINE)


async def test_migrate_builds_exactly_the_schema_file(
    new_database: Callable[[], Awaitable[str]],
) -> None:
    """The procrastinate habit: `dlrfeed migrate` (every migration, in order) and the schema
    file run once build the same catalog, to the last comment, grant and day partition."""
    migrated, from_file = await new_database(), await new_database()
    await migrate(migrated)
    conn = await asyncpg.connect(from_file)
    try:
        for bootstrap in ("create_schema", "create_version_table"):
            await conn.execute(query(bootstrap).text)
        await conn.execute(SCHEMA_FILE.read_text("utf-8"))
    finally:
        await conn.close()
    assert _dump(migrated) == _dump(from_file)
    assert await describe(migrated) == await describe(from_file)


def test_the_schema_file_follows_the_migrations() -> None:
    """A second migration moves the schema as it stands out of the baseline (which an installed
    store has applied as it was) into src/dlrfeed/store/schema.sql."""
    if len(available_migrations()) > 1:
        assert SCHEMA_FILE == _STORE / "schema.sql"
    assert available_migrations()[0].name == BASELINE.name


async def test_the_migration_probe_applies_a_migration_as_migrate_does(
    empty_database: str,
) -> None:
    """The tooling that measures the next migration's online claim (migration_probe): a store
    as released before a migration, then that migration applied and measured the way `dlrfeed
    migrate` applies it. On the baseline, before which a store is an empty version table."""
    newest = available_migrations()[-1].version
    await install_before(empty_database, newest)
    cost = await apply_measured(empty_database, newest)
    assert cost.rewritten == []  # what existed before (the version table) kept its file
    assert cost.locks["dlr.schema_version"] == {"RowExclusiveLock"}  # its row, written
    assert cost.wal_bytes > 0
    assert cost.statements_ms > 0
    assert await describe(empty_database) == EXPECTED.read_text()


async def test_migrating_an_empty_database_gives_exactly_the_expected_schema(
    empty_database: str,
) -> None:
    """STYLE "SQL lives in SQL": the migrations build exactly the checked-in catalog."""
    applied = await migrate(empty_database)
    assert applied == [m.name for m in available_migrations()]
    described = await describe(empty_database)
    if os.environ.get("DLRFEED_REGEN_SCHEMA"):
        EXPECTED.write_text(described)
    assert described == EXPECTED.read_text()


async def test_migrate_twice_and_concurrently_is_safe(empty_database: str) -> None:
    """`dlrfeed migrate` is idempotent; concurrent runs apply each migration once between them
    (each step takes the lock and reads the version again, so which run applies which step is
    up to the scheduler, never how many times)."""
    runs = await asyncio.gather(*(migrate(empty_database) for _ in range(3)))
    applied = [name for run in runs for name in run]
    assert sorted(applied) == [m.name for m in available_migrations()]
    before = await describe(empty_database)
    assert await migrate(empty_database) == []
    assert await describe(empty_database) == before
    conn = await asyncpg.connect(empty_database)
    try:
        assert await current_version(conn) == available_migrations()[-1].version
        assert await conn.fetchval("SELECT count(*) FROM dlr.schema_version") == len(
            available_migrations()
        )
    finally:
        await conn.close()


async def test_store_refuses_a_stale_schema_naming_the_command(empty_database: str) -> None:
    """A database behind this code is refused with one line naming `dlrfeed migrate`."""
    store = await Store.open(empty_database, pool_size=1)
    try:
        with pytest.raises(SchemaOutOfDateError, match="run `dlrfeed migrate`"):
            await store.check_schema()
        await migrate(empty_database)
        await store.check_schema()
    finally:
        await store.close()
