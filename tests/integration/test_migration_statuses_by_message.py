"""Migration 0020: each status is kept under its message row's id, and reads the same answers.

- On an installed store it is catalog changes only: a brief lock on the statuses, no table
  rewritten, a few kB of WAL; every stored status stays where it is.
- One traffic (progress, results, repeats, late correlation) goes to two stores at the schema
  before it: one migrated halfway through, one at the end. Every status, every change and
  every `dlrfeed show` reads the same in both, field for field, though the first keeps its
  statuses in two tables: what readers see does not depend on when the store was migrated.
- Each message's status lives in one table, chosen by when the message was recorded, and
  UPDATE and DELETE through the view reach it there with their changes logged.
- A dlrfeed from before it stops at its next status write with nothing committed.
- A message's id, which its status is now kept under, never changes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store, queries
from dlrfeed.store.migrate import current_version, migrate
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

STATUSES_BY_MESSAGE = 20
# Each table's statuses by message, with the message row's id.
_PLACED = """
SELECT 'statuses' AS held_in, m.id, m.message_id FROM dlr.statuses AS s
JOIN dlr.messages AS m ON m.id = s.message_ref
UNION ALL
SELECT 'earlier_statuses', m.id, m.message_id FROM dlr.earlier_statuses AS s
JOIN dlr.messages AS m ON m.login = s.login AND m.message_id = s.message_id
"""


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"statuses_by_message_{os.getpid()}_{n}" for n in range(2)]
    dsns = [await pg_cluster.create_database(name) for name in names]
    yield dsns
    for name in names:
        await pg_cluster.drop_database(name)


async def test_it_changes_the_catalog_only_under_a_brief_lock(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, STATUSES_BY_MESSAGE)
    cost = await apply_measured(dsn, STATUSES_BY_MESSAGE)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == STATUSES_BY_MESSAGE
        # Every stored status stays where it was; the next message recorded is the first
        # whose status goes to dlr.statuses.
        assert await conn.fetchval("SELECT count(*) FROM dlr.statuses") == 0
        assert await conn.fetchval("SELECT count(*) FROM dlr.earlier_statuses") > 1_000
        assert await conn.fetchval("SELECT dlr.statuses_first_message()") == 1 + (
            await conn.fetchval("SELECT max(id) FROM dlr.messages")
        )
    finally:
        await conn.close()
    # Relations as named before the commit: the statuses' table, renamed by the migration,
    # still dlr.message_status_rows.
    assert "AccessExclusiveLock" in cost.locks["dlr.message_status_rows"]
    # The message rows get a trigger (their id never changes): a lock that the ingest's row
    # locks pass and recording waits for until the commit.
    assert "ShareRowExclusiveLock" in cost.locks["dlr.messages"]
    assert not cost.locks["dlr.messages"] & {"ExclusiveLock", "AccessExclusiveLock"}
    untouched = {"dlr.events", "dlr.receptions", "dlr.status_change_rows"}
    assert not untouched & set(cost.locks)
    assert cost.rewritten == []
    assert cost.wal_bytes < 1024 * 1024


async def test_a_store_migrated_halfway_reads_the_same_answers(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, STATUSES_BY_MESSAGE)
    await install_migrating_halfway(at_the_end, STATUSES_BY_MESSAGE, migrate_at=None)
    statuses = await statuses_read(halfway)
    assert len(statuses) > 1_000
    assert statuses == await statuses_read(at_the_end)
    assert by_message(await changes_read(halfway)) == by_message(await changes_read(at_the_end))
    sample = [s["message_id"] for s in statuses[:: len(statuses) // 20]]
    assert await shown_read(halfway, sample) == await shown_read(at_the_end, sample)
    conn = await asyncpg.connect(halfway)
    try:
        placed = await conn.fetch(_PLACED)
        first = await conn.fetchval("SELECT dlr.statuses_first_message()")
    finally:
        await conn.close()
    # Both tables hold statuses, each message's in one, chosen by when it was recorded.
    held_in = {r["held_in"] for r in placed}
    assert held_in == {"statuses", "earlier_statuses"}
    assert len({r["message_id"] for r in placed}) == len(placed) == len(statuses)
    for r in placed:
        assert (r["held_in"] == "statuses") == (r["id"] >= first), dict(r)


async def test_update_and_delete_through_the_view_reach_either_table(
    databases: list[str],
) -> None:
    """As before the migration, the schema's owner may correct or withdraw a status through
    the view: the row changes in whichever table holds it, one logged change per status."""
    dsn = databases[0]
    await install_migrating_halfway(dsn, STATUSES_BY_MESSAGE)
    conn = await asyncpg.connect(dsn)
    try:
        placed = await conn.fetch(_PLACED)
        chosen = {
            table: next(r["message_id"] for r in placed if r["held_in"] == table)
            for table in ("statuses", "earlier_statuses")
        }
        before = len(await changes_read(dsn))
        for message_id in chosen.values():
            await conn.execute(
                "UPDATE dlr.message_status SET status = 'UNKNOWN', reason = 'checked by hand'"
                " WHERE login = $1 AND message_id = $2",
                LOGIN,
                message_id,
            )
        shown = await conn.fetch(
            "SELECT message_id, status, reason FROM dlr.message_status"
            " WHERE message_id = ANY($1::text[])",
            list(chosen.values()),
        )
        assert {tuple(r) for r in shown} == {
            (m, "UNKNOWN", "checked by hand") for m in chosen.values()
        }
        with pytest.raises(asyncpg.RaiseError, match="stays with its message"):
            await conn.execute(
                "UPDATE dlr.message_status SET message_id = 'another' WHERE message_id = $1",
                chosen["statuses"],
            )
        deleted = await conn.execute(
            "DELETE FROM dlr.message_status WHERE message_id = ANY($1::text[])",
            list(chosen.values()),
        )
        assert deleted == "DELETE 2"
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM dlr.message_status WHERE message_id = ANY($1::text[])",
                list(chosen.values()),
            )
            == 0
        )
    finally:
        await conn.close()
    logged = (await changes_read(dsn))[before:]
    assert sorted((c["message_id"], c["status"] or "") for c in logged) == sorted(
        [(m, "UNKNOWN") for m in chosen.values()] + [(m, "") for m in chosen.values()]
    )


async def test_a_store_opened_before_it_stops_with_nothing_written(
    databases: list[str],
) -> None:
    """A Store that still writes statuses to the table renamed stops as for any schema change
    under it (the daemon exits 78) and commits nothing of the batch."""
    raised, added = await ingest_after_migrating(databases[0], STATUSES_BY_MESSAGE)
    assert isinstance(raised, SchemaOutOfDateError)
    assert "schema changed" in str(raised)
    assert added == 0


async def test_a_message_id_never_changes(database_url: str, db: asyncpg.Connection) -> None:
    """Its status is kept under it; the writer's UPDATE on it is for the row lock alone."""
    await db.execute(
        "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
        " destination_raw, destination_is_e164) VALUES ('l', 'm', 'i', 'd', 'd', false)"
    )
    # An identity column is only ever redrawn from its sequence; that is refused too.
    with pytest.raises(asyncpg.RaiseError, match="does not change"):
        await db.execute("UPDATE dlr.messages SET id = DEFAULT")
    assert await db.fetchval("SELECT id FROM dlr.messages FOR NO KEY UPDATE") == 1


async def test_only_a_store_migrated_with_messages_writes_both_tables(
    databases: list[str], database_url: str
) -> None:
    """A store created at 0020 or later keeps every status in dlr.statuses, and its writes
    leave the empty dlr.earlier_statuses (and its triggers) alone; a store migrated with
    messages recorded writes both."""
    await install_with_traffic(databases[0], STATUSES_BY_MESSAGE)
    await migrate(databases[0])
    for dsn, both in ((databases[0], True), (database_url, False)):
        store = await Store.open(dsn, pool_size=1)
        try:
            writes_both = store.writes.statuses is queries.STATUS_WRITES
        finally:
            await store.close()
        assert writes_both == both, dsn


async def test_an_update_through_the_view_keeps_a_write_committed_meanwhile(
    database_url: str, db: asyncpg.Connection, store: Store
) -> None:
    """The owner's UPDATE through the view waits for the message row's lock, as every status
    write does, and changes only the columns it set: what an ingest committed meanwhile stays."""
    traffic = Traffic(seed=9)
    await store.record_submissions(traffic.submissions())
    await store.ingest(LOGIN, traffic.batch(0))
    message_id = await db.fetchval("SELECT min(message_id) FROM dlr.message_status")
    ingest = await asyncpg.connect(database_url)
    try:
        await ingest.execute("BEGIN")
        ref = await ingest.fetchval(
            "SELECT id FROM dlr.messages WHERE login = $1 AND message_id = $2 FOR NO KEY UPDATE",
            LOGIN,
            message_id,
        )
        await ingest.execute("UPDATE dlr.statuses SET repeats = 99 WHERE message_ref = $1", ref)
        correcting = asyncio.create_task(
            db.execute(
                "UPDATE dlr.message_status SET status = 'UNKNOWN'"
                " WHERE login = $1 AND message_id = $2",
                LOGIN,
                message_id,
            )
        )
        await asyncio.sleep(0.2)
        assert not correcting.done()  # waiting for the message row's lock
        await ingest.execute("COMMIT")
        assert await correcting == "UPDATE 1"
    finally:
        await ingest.close()
    row = await db.fetchrow(
        "SELECT status, repeats FROM dlr.message_status WHERE login = $1 AND message_id = $2",
        LOGIN,
        message_id,
    )
    assert row is not None
    assert (row["status"], row["repeats"]) == ("UNKNOWN", 99)
