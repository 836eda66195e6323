"""Migration 0024: the events of a message recorded after it are kept under its row's id, and
every reader reads the same answers.

- On an installed store it is catalog changes only: a brief lock on the events and the
  exceptions, nothing rewritten, a few kB of WAL; every stored event stays where it was.
- One traffic goes to two stores at the schema before it: one migrated halfway, one at the end.
  Every event, reception, status and `dlrfeed show` reads the same in both (the same event ids
  too: they are drawn in arrival order whichever table keeps each), though the first keeps its
  events in both tables.
- An event that arrives before its message is kept by its key, and recording the message moves
  it - the same row, the same id - under the message, where its redelivery is a repeat; a
  message recorded by a plain INSERT does the same (the move is a trigger's).
- An exception still names a stored event only (the trigger that replaced the foreign key).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import current_version
from dlrfeed.store.transactions import write_transaction
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    assert_online,
    install_migrating_halfway,
    install_with_traffic,
    receptions_read,
    shown_read,
    statuses_read,
)
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import receipt

EVENTS_BY_MESSAGE = 24
# The events kept in each table.
_KINDS = """
SELECT (SELECT count(*) FROM dlr.event_rows) AS by_key,
       (SELECT count(*) FROM dlr.message_events) AS by_message
"""
# The times a store takes from its clock differ between any two stores.
_CLOCK_TIMES = {"first_received_at", "last_received_at"}


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"events_by_message_{os.getpid()}_{n}" for n in range(2)]
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
    return int(row["by_key"]), int(row["by_message"])


async def _events_read(dsn: str) -> list[dict[str, Any]]:
    """Every event as dlr.events shows it, in id order, without its clock times."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT * FROM dlr.events ORDER BY id")
    finally:
        await conn.close()
    return [{k: v for k, v in r.items() if k not in _CLOCK_TIMES} for r in rows]


async def test_it_changes_the_catalog_only_under_a_brief_lock(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, EVENTS_BY_MESSAGE)
    before = await _events_read(dsn)
    cost = await apply_measured(dsn, EVENTS_BY_MESSAGE)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == EVENTS_BY_MESSAGE
    finally:
        await conn.close()
    assert len(before) > 1_000
    assert await _kinds(dsn) == (len(before), 0)
    assert await _events_read(dsn) == before
    assert_online(
        cost,
        exclusive="dlr.events",
        read=("dlr.reception_rows",),  # its views are made anew
        untouched=("dlr.statuses", "dlr.status_change_rows"),
    )
    assert "AccessExclusiveLock" in cost.locks["dlr.exceptions"]
    # Recording waits (the messages' new trigger); the ingest's row locks do not.
    assert cost.locks["dlr.messages"] <= {"ShareRowExclusiveLock", "AccessShareLock"}


async def test_a_store_migrated_halfway_reads_the_same_answers(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, EVENTS_BY_MESSAGE)
    await install_migrating_halfway(at_the_end, EVENTS_BY_MESSAGE, migrate_at=None)
    events = await _events_read(halfway)
    assert len(events) > 1_000
    assert events == await _events_read(at_the_end)
    assert await receptions_read(halfway) == await receptions_read(at_the_end)
    statuses = await statuses_read(halfway)
    assert statuses == await statuses_read(at_the_end)
    sample = [s["message_id"] for s in statuses[:: len(statuses) // 20]]
    assert await shown_read(halfway, sample) == await shown_read(at_the_end, sample)
    by_key, by_message = await _kinds(halfway)
    assert by_key > 0
    assert by_message > 0
    assert by_key + by_message == len(events)
    assert await _kinds(at_the_end) == (len(events), 0)


async def test_recording_a_message_moves_its_early_event_under_it(
    store: Store, db: asyncpg.Connection
) -> None:
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt("early", now)])
    event_id = await db.fetchval("SELECT id FROM dlr.event_rows WHERE message_id = 'early'")

    result = await store.record_submissions([Submission(LOGIN, "early", "+34600000001")])
    await store.ingest(LOGIN, [receipt("early", now + 1)])  # its redelivery

    assert result.late_correlated_events == 1
    assert await db.fetchval("SELECT count(*) FROM dlr.event_rows") == 0
    moved = await db.fetchrow(
        "SELECT e.id, e.times_received, m.message_id FROM dlr.message_events AS e"
        " JOIN dlr.messages AS m ON m.id = e.message_ref"
    )
    assert moved is not None
    assert tuple(moved) == (event_id, 2, "early")
    outcomes = await db.fetch("SELECT outcome FROM dlr.receptions ORDER BY id")
    assert [r[0] for r in outcomes][-1] == "repeat"
    status = await db.fetchval("SELECT status FROM dlr.message_status WHERE message_id = 'early'")
    assert status == "DELIVERED"


async def test_a_message_recorded_by_any_writer_takes_its_early_events(
    store: Store, db: asyncpg.Connection
) -> None:
    """The move is the database's (a trigger of dlr.messages), not only this Store's: a message
    recorded by a plain INSERT - a dlrfeed from before the migration, an operator - takes its
    early events as well, so a later redelivery still finds its event."""
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt("by-hand", now)])
    await db.execute(
        "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
        " destination_raw, destination_is_e164) VALUES ($1, 'by-hand', 'i', '+1', '+1', true)",
        LOGIN,
    )
    await store.ingest(LOGIN, [receipt("by-hand", now + 1)])
    rows = await db.fetch("SELECT times_received FROM dlr.events WHERE message_id = 'by-hand'")
    assert [r[0] for r in rows] == [2]
    assert await db.fetchval("SELECT count(*) FROM dlr.message_events") == 1


async def test_recording_probes_the_early_events_once_per_message_whatever_the_statistics(
    store: Store, db: asyncpg.Connection
) -> None:
    """dlr.event_rows churns (each early event is inserted, then moved), so its statistics can
    say it is nearly empty while it holds many waiting events. Recording a chunk of messages
    still probes its key once per message (migration 0025), not once per message and waiting
    event, and moves exactly the early events of the messages recorded."""
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt(f"gone-{n}", now) for n in range(300)])
    await store.record_submissions(
        [Submission(LOGIN, f"gone-{n}", "+34600000001") for n in range(300)]
    )
    await db.execute("ANALYZE dlr.event_rows")  # every row it held was moved: "empty"
    await store.ingest(LOGIN, [receipt(f"early-{n}", now) for n in range(200)])
    recorded = [f"early-{n}" for n in range(0, 200, 2)] + [f"new-{n}" for n in range(400)]
    async with write_transaction(db):
        await db.execute(
            "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
            " destination_raw, destination_is_e164)"
            " SELECT $1, m, m, '+1', '+1', true FROM unnest($2::text[]) AS m",
            LOGIN,
            recorded,
        )
        probes = await db.fetchval(
            "SELECT pg_stat_get_xact_numscans('dlr.events_login_message_id_level_key'::regclass)"
        )
    assert probes == len(recorded)
    kinds = await db.fetchrow(_KINDS)
    assert kinds is not None
    assert tuple(kinds) == (100, 300 + 100)


async def test_an_exception_names_a_stored_event_only(db: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.exceptions.ForeignKeyViolationError):
        await db.execute(
            "INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id)"
            " VALUES ('conflict', $1, 'nowhere', '{}', 424242)",
            LOGIN,
        )
