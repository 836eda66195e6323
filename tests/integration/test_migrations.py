"""Migrations: an empty database migrates to exactly the checked-in schema, idempotently.

The expected schema lives in `test_migrations_schema.txt` beside this file. After a deliberate
schema change, regenerate it with
`DLRFEED_REGEN_SCHEMA=1 pytest tests/integration/test_migrations.py` and review the diff.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store
from dlrfeed.store.migrate import available_migrations, current_version, migrate
from dlrfeed_tools.pgcluster import PgCluster
from support.schema import describe

EXPECTED = Path(__file__).with_name("test_migrations_schema.txt")
_numbers = itertools.count(1)


@pytest.fixture
async def empty_database(pg_cluster: PgCluster) -> AsyncIterator[str]:
    """A database with nothing in it (not copied from the migrated template)."""
    name = f"empty_{os.getpid()}_{next(_numbers)}"
    yield await pg_cluster.create_database(name)
    await pg_cluster.drop_database(name)


async def test_migrating_an_empty_database_gives_exactly_the_expected_schema(
    empty_database: str,
) -> None:
    """STYLE "SQL lives in SQL": the migrations build exactly the checked-in schema."""
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
