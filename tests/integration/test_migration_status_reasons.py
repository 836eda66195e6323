"""Migration 0019: each status names its reason by id, and reads the same answers.

- On an installed store it is catalog changes only: a brief lock on the statuses, no table
  rewritten, a few kB of WAL.
- One traffic (progress, results, repeats, late correlation) goes to two stores at the schema
  before it: one migrated halfway through, one at the end. Every status, every change and
  every `dlrfeed show` reads the same in both, field for field, though the first stores most
  statuses' reasons by id and no flags as NULL: what readers see does not depend on when the
  store was migrated.
- A status write in a REPEATABLE READ transaction that meets a reason another transaction
  added after its snapshot keeps that text in its row instead of failing to serialize.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store
from dlrfeed.store.migrate import current_version
from dlrfeed_tools.bench.growth_traffic import Traffic
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    by_message,
    changes_read,
    ingest_after_migrating,
    install_migrating_halfway,
    install_with_traffic,
    shown_read,
    statuses_read,
)
from dlrfeed_tools.pgcluster import PgCluster

STATUS_REASONS = 19
# Every status row, in whichever table migration 0020 keeps it.
_STATUS_ROWS = (
    "(SELECT reason, reason_id, flags FROM dlr.statuses"
    " UNION ALL SELECT reason, reason_id, flags FROM dlr.earlier_statuses) AS s"
)


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"status_reasons_{os.getpid()}_{n}" for n in range(2)]
    dsns = [await pg_cluster.create_database(name) for name in names]
    yield dsns
    for name in names:
        await pg_cluster.drop_database(name)


async def test_it_changes_the_catalog_only_under_a_brief_lock(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, STATUS_REASONS)
    cost = await apply_measured(dsn, STATUS_REASONS)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == STATUS_REASONS
        # Every stored status keeps its text until it is next written.
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM dlr.message_status_rows WHERE reason_id IS NOT NULL"
            )
            == 0
        )
    finally:
        await conn.close()
    # Relations as named before the commit: the table, renamed by the migration, still
    # dlr.message_status.
    assert "AccessExclusiveLock" in cost.locks["dlr.message_status"]
    untouched = {"dlr.events", "dlr.receptions", "dlr.messages", "dlr.status_change_rows"}
    assert not untouched & set(cost.locks)
    others = {r for r in cost.locks if not r.startswith("dlr.message_status")}
    assert others <= {"dlr.schema_version", "dlr.schema_version_pkey"}
    assert cost.rewritten == []
    assert cost.wal_bytes < 1024 * 1024


async def test_a_store_migrated_halfway_reads_the_same_answers(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, STATUS_REASONS)
    await install_migrating_halfway(at_the_end, STATUS_REASONS, migrate_at=None)
    statuses = await statuses_read(halfway)
    assert len(statuses) > 1_000
    assert statuses == await statuses_read(at_the_end)
    assert by_message(await changes_read(halfway)) == by_message(await changes_read(at_the_end))
    sample = [s["message_id"] for s in statuses[:: len(statuses) // 20]]
    assert await shown_read(halfway, sample) == await shown_read(at_the_end, sample)
    conn = await asyncpg.connect(halfway)
    try:
        forms = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE reason IS NULL AND reason_id > 0) AS by_id,"
            " count(*) FILTER (WHERE flags IS NULL) AS no_flags, count(*) AS rows"
            f" FROM {_STATUS_ROWS}"
        )
    finally:
        await conn.close()
    # Most statuses were written after the migration (the second round rewrites the first's).
    assert forms is not None
    assert forms["by_id"] > forms["rows"] / 2
    assert forms["no_flags"] > forms["rows"] / 2


async def test_a_store_opened_before_it_stops_with_nothing_written(
    databases: list[str],
) -> None:
    """A Store that still writes statuses to the table, now a view, stops as for any schema
    change under it (the daemon exits 78) and commits nothing of the batch."""
    raised, added = await ingest_after_migrating(databases[0], STATUS_REASONS)
    assert isinstance(raised, SchemaOutOfDateError)
    assert "schema changed" in str(raised)
    assert added == 0


async def test_a_repeatable_read_writer_keeps_a_text_added_after_its_snapshot_in_its_row(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Without the fallback, the dictionary's ON CONFLICT would fail to serialize on the
    other's text. The status writes resolve reasons as here (sql/ingest.sql, upsert_statuses),
    and keep a text with no id in the row."""
    ids = "SELECT reason, id FROM dlr.reason_ids(ARRAY['new wording'])"
    late = await asyncpg.connect(database_url)
    try:
        async with late.transaction(isolation="repeatable_read"):
            await late.fetchval("SELECT 1")  # its snapshot, taken before the other's commit
            assert len(await db.fetch(ids)) == 1
            assert await late.fetch(ids) == []
    finally:
        await late.close()
    assert [tuple(r) for r in await db.fetch(ids)] == [
        ("new wording", await db.fetchval("SELECT max(id) FROM dlr.reasons"))
    ]


async def test_a_traffic_s_statuses_name_a_few_reasons(
    db: asyncpg.Connection, store: Store
) -> None:
    """The traffic's every status written by id, its wordings a handful of dictionary rows."""
    traffic = Traffic(seed=5)
    await store.record_submissions(traffic.submissions())
    for index in range(4):
        await store.ingest(LOGIN, traffic.batch(index))
    forms = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE reason_id IS NULL) AS by_text, count(*) AS rows"
        f" FROM {_STATUS_ROWS}"
    )
    assert forms is not None
    assert forms["rows"] > 100
    assert forms["by_text"] == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.reasons") <= 4


async def test_a_status_names_only_an_id_the_dictionary_gave_and_one_form(
    db: asyncpg.Connection, store: Store
) -> None:
    """An id not yet drawn would make its logged change read whatever text it is given later;
    a text beside an id would hide it."""
    traffic = Traffic(seed=6)
    await store.record_submissions(traffic.submissions())
    await store.ingest(LOGIN, traffic.batch(0))
    with pytest.raises(asyncpg.RaiseError, match="does not hold"):
        await db.execute(
            "UPDATE dlr.statuses SET reason_id = 1 + (SELECT max(id) FROM dlr.reasons)"
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("UPDATE dlr.statuses SET reason = 'and a text'")


async def test_the_dictionary_stops_at_its_bound_whatever_one_call_brings(
    db: asyncpg.Connection,
) -> None:
    await db.execute("SELECT setval('dlr.reasons_id_seq', 99998)")
    added = await db.fetch(
        "SELECT reason, id FROM dlr.reason_ids(ARRAY['a', 'b', 'c', 'd']) ORDER BY id"
    )
    assert [tuple(r) for r in added] == [("a", 99999), ("b", 100000)]
