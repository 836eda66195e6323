"""Migration 0022: a status change names its message by the message row's id, and reads the
same answers.

- On an installed store it is catalog changes only: a brief lock on the change log, nothing
  rewritten, a few kB of WAL; every stored change keeps its login and message id.
- One traffic goes to two stores at the schema before it: one migrated halfway, one at the end.
  Every change (as `dlrfeed changes` and the days' archives show it), status and `dlrfeed show`
  reads the same in both, though the first holds changes of both kinds.
- A withdrawal keeps its login and message id (the trigger finds the latest one by them).
- Forgetting keeps a message while a change of its status may still be stored (a day kept for a
  consumer that has not read it), and forgets it once that day is gone.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import current_version
from dlrfeed.store.retention import forget
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    assert_online,
    by_message,
    changes_read,
    install_migrating_halfway,
    install_with_traffic,
    shown_read,
    statuses_read,
)
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import DAY, drop_days_before, receipt, today

CHANGES_BY_MESSAGE = 22
# The changes of each kind: naming their message by its login and id, or by its row.
_KINDS = """
SELECT count(*) FILTER (WHERE message_ref IS NULL AND login IS NOT NULL) AS by_key,
       count(*) FILTER (WHERE message_ref IS NOT NULL AND login IS NULL
                        AND message_id IS NULL) AS by_row
FROM dlr.status_change_rows
"""


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"changes_by_message_{os.getpid()}_{n}" for n in range(2)]
    dsns = [await pg_cluster.create_database(name) for name in names]
    yield dsns
    for name in names:
        await pg_cluster.drop_database(name)


async def _kinds(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(_KINDS)
    finally:
        await conn.close()
    assert row is not None
    return int(row["by_key"]), int(row["by_row"])


async def test_it_changes_the_catalog_only_under_a_brief_lock(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, CHANGES_BY_MESSAGE)
    before = await changes_read(dsn)
    cost = await apply_measured(dsn, CHANGES_BY_MESSAGE)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == CHANGES_BY_MESSAGE
    finally:
        await conn.close()
    assert len(before) > 1_000
    assert await _kinds(dsn) == (len(before), 0)
    assert await changes_read(dsn) == before
    # The messages are only read (the view names them).
    assert_online(
        cost,
        exclusive="dlr.status_change_rows",
        read=("dlr.messages",),
        untouched=("dlr.events", "dlr.statuses", "dlr.reception_rows"),
    )


async def test_a_store_migrated_halfway_reads_the_same_answers(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, CHANGES_BY_MESSAGE)
    await install_migrating_halfway(at_the_end, CHANGES_BY_MESSAGE, migrate_at=None)
    changes = await changes_read(halfway)
    assert len(changes) > 1_000
    assert by_message(changes) == by_message(await changes_read(at_the_end))
    statuses = await statuses_read(halfway)
    assert statuses == await statuses_read(at_the_end)
    sample = [s["message_id"] for s in statuses[:: len(statuses) // 20]]
    assert await shown_read(halfway, sample) == await shown_read(at_the_end, sample)
    by_key, by_row = await _kinds(halfway)
    assert by_key > 0
    assert by_row > 0
    assert by_key + by_row == len(changes)
    assert await _kinds(at_the_end) == (len(changes), 0)


async def test_a_withdrawal_keeps_its_login_and_message_id(
    store: Store, db: asyncpg.Connection
) -> None:
    await store.record_submissions([Submission(LOGIN, "w1", "+34600000001")])
    await store.ingest(LOGIN, [receipt("w1", datetime.now(UTC).timestamp())])
    await db.execute("DELETE FROM dlr.message_status WHERE message_id = 'w1'")
    rows = await db.fetch(
        "SELECT status, login, message_id, message_ref FROM dlr.status_change_rows"
        " ORDER BY position"
    )
    ref = await db.fetchval("SELECT id FROM dlr.messages WHERE message_id = 'w1'")
    assert [tuple(r) for r in rows] == [("DELIVERED", None, None, ref), (None, LOGIN, "w1", None)]
    shown = await db.fetch("SELECT status, login, message_id FROM dlr.status_changes")
    assert [tuple(r) for r in shown] == [("DELIVERED", LOGIN, "w1"), (None, LOGIN, "w1")]


async def test_forgetting_waits_for_a_change_kept_for_a_consumer(
    store: Store, db: asyncpg.Connection
) -> None:
    """The message's evidence is gone, but the day of its status change is kept (a consumer
    has not read it): the pass keeps the message, and forgets it once that day is dropped."""
    await store.record_submissions([Submission(LOGIN, "m1", "+34600000001")])
    await store.ingest(LOGIN, [receipt("m1", datetime.now(UTC).timestamp())])
    cutoff = today() + 3 * DAY
    await drop_days_before(db, cutoff, ("reception_rows",))

    kept = await forget(db, cutoff)

    assert (kept.messages, kept.kept_for_changes) == (0, 1)
    shown = await db.fetchrow("SELECT login, message_id FROM dlr.status_changes")
    assert shown is not None
    assert tuple(shown) == (LOGIN, "m1")
    await drop_days_before(db, cutoff, ("status_change_rows",))
    assert (await forget(db, cutoff)).messages == 1
