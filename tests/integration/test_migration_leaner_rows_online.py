"""Migration 0016 is online on an installed store: catalog changes only, under brief locks.

On a store of a few thousand receptions at the schema before it (the measurement on a million
is docs/postgresql.md, "Migration 0016", by scripts/bench_migration.py), the migration:
- holds ACCESS EXCLUSIVE on dlr.receptions with its day partitions, dlr.events and
  dlr.receptions_readable only, and nothing on the other tables;
- rewrites no table and rebuilds no index that holds a row (every relation keeps its file but
  the keys of the empty days ahead, rekeyed), so its WAL is a few catalog pages whatever the
  store's size;
- makes an ingest that comes meanwhile wait for its commit only, then go through;
- gives up after its lock_timeout, instead of queueing the ingest behind it indefinitely, when
  a long transaction holds dlr.receptions.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.store import Store
from dlrfeed.store.migrate import available_migrations, current_version, migrate
from dlrfeed_tools.bench.growth_traffic import Traffic
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import apply_measured, install_with_traffic
from dlrfeed_tools.pgcluster import PgCluster

LEANER_ROWS = 16


@pytest.fixture
async def installed_store(pg_cluster: PgCluster) -> AsyncIterator[str]:
    """A store at the schema before 0016 holding ~5,000 receptions of gateway-shaped traffic."""
    name = f"online_{os.getpid()}"
    dsn = await pg_cluster.create_database(name)
    await install_with_traffic(dsn, LEANER_ROWS)
    yield dsn
    await pg_cluster.drop_database(name)


async def test_it_holds_brief_locks_on_three_relations_and_rewrites_nothing(
    installed_store: str,
) -> None:
    conn = await asyncpg.connect(installed_store)
    try:
        partitions = [
            r[0]
            for r in await conn.fetch(
                "SELECT partition_name FROM dlr.day_partitions WHERE parent_table = 'receptions'"
            )
        ]
        holding = {
            p
            for p in partitions
            if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM dlr_partitions.{p})")
        }
        stored = await conn.fetchval("SELECT count(*) FROM dlr.receptions")
    finally:
        await conn.close()
    assert stored > 4000
    assert holding

    cost = await apply_measured(installed_store, LEANER_ROWS)

    conn = await asyncpg.connect(installed_store)
    try:
        assert await current_version(conn) == LEANER_ROWS
    finally:
        await conn.close()
    days = {f"dlr_partitions.{p}" for p in partitions}
    keys = {f"{day}_pkey" for day in days}
    tables = {"dlr.receptions", "dlr.events", "dlr.receptions_readable", *days}
    exclusive = {r for r, modes in cost.locks.items() if "AccessExclusiveLock" in modes}
    assert tables <= exclusive <= tables | keys
    # Nothing else is locked but the version table the migration records itself in, and the
    # keys of the days it looked into (to see whether they hold rows).
    assert set(cost.locks) - exclusive <= {"dlr.schema_version", "dlr.schema_version_pkey"} | keys
    # Rebuilt: only the keys of the days that hold no row (0016 drops the login from them).
    assert set(cost.rewritten) == {
        f"dlr_partitions.{p}_pkey" for p in partitions if p not in holding
    }
    # A few catalog pages: a rewrite of these receptions alone would be megabytes.
    assert cost.wal_bytes < 256 * 1024


async def test_an_ingest_meanwhile_waits_for_the_commit_only(installed_store: str) -> None:
    (migration,) = [m for m in available_migrations() if m.version == LEANER_ROWS]
    traffic = Traffic(seed=8)
    traffic.submissions()
    batch = traffic.batch(0)
    migrating = await asyncpg.connect(installed_store)
    store = await Store.open(installed_store, pool_size=1)
    try:
        async with migrating.transaction():
            await migrating.execute(migration.sql)
            ingest = asyncio.create_task(store.ingest(LOGIN, batch))
            await asyncio.sleep(0.5)
            assert not ingest.done()  # waits behind the migration's locks
            held_from = time.monotonic()
        result = await asyncio.wait_for(ingest, 30)
        waited_after_commit = time.monotonic() - held_from
    finally:
        await store.close()
        await migrating.close()
    assert len(result.outcomes) == len(batch)
    assert waited_after_commit < 10  # went through once the migration committed


async def test_it_gives_up_behind_a_long_transaction_instead_of_queueing_the_ingest(
    installed_store: str,
) -> None:
    holder = await asyncpg.connect(installed_store)
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE dlr.receptions IN ROW EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
                await migrate(installed_store)
            assert time.monotonic() - started < 30
        # Nothing half-applied: run again once the transaction is gone.
        assert await current_version(holder) == LEANER_ROWS - 1
    finally:
        await holder.close()
    applied = await migrate(installed_store)
    assert applied == [m.name for m in available_migrations() if m.version >= LEANER_ROWS]
