"""Migration 0021: a reception names its event's login, message id and level by its event,
and reads the same answers.

- On an installed store it is catalog changes only: a brief lock on the receptions, no day
  rewritten, a few kB of WAL; every stored reception keeps its own key.
- One traffic (progress, results, repeats, late correlation) goes to two stores at the schema
  before it: one migrated halfway through, one at the end. Every reception (as dlr.receptions
  and dlr.receptions_readable show it), status, change and `dlrfeed show` reads the same in
  both, though the first holds rows of both kinds.
- The evidence stays append-only through the view.
- A dlrfeed from before it stops at its next batch with nothing committed.
- Forgetting keeps a message while a reception that names its key by its event is stored.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import current_version
from dlrfeed.store.retention import forget
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    assert_online,
    by_message,
    changes_read,
    ingest_after_migrating,
    install_migrating_halfway,
    install_with_traffic,
    receptions_read,
    shown_read,
    statuses_read,
)
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import receipt

RECEPTION_KEY_FROM_EVENT = 21
# The rows of each kind: holding their own key, or naming it by their event.
_KINDS = """
SELECT count(*) FILTER (WHERE level IS NOT NULL) AS own,
       count(*) FILTER (WHERE level IS NULL AND login = '' AND message_id = '') AS by_event
FROM dlr.reception_rows
"""


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"reception_key_{os.getpid()}_{n}" for n in range(2)]
    dsns = [await pg_cluster.create_database(name) for name in names]
    yield dsns
    for name in names:
        await pg_cluster.drop_database(name)


async def test_it_changes_the_catalog_only_under_a_brief_lock(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, RECEPTION_KEY_FROM_EVENT)
    before = await receptions_read(dsn)
    cost = await apply_measured(dsn, RECEPTION_KEY_FROM_EVENT)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == RECEPTION_KEY_FROM_EVENT
        kinds = await conn.fetchrow(_KINDS)
    finally:
        await conn.close()
    # Every stored reception keeps its own key, and reads as it did.
    assert kinds is not None
    assert (kinds["own"], kinds["by_event"]) == (len(before), 0)
    assert len(before) > 1_000
    assert await receptions_read(dsn) == before
    # Relations as named before the commit: the table, renamed by the migration, still
    # dlr.receptions. The events are only read (the views name them).
    assert_online(
        cost,
        exclusive="dlr.receptions",
        read=("dlr.events",),
        untouched=("dlr.messages", "dlr.statuses", "dlr.status_change_rows"),
    )


async def test_a_store_migrated_halfway_reads_the_same_answers(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, RECEPTION_KEY_FROM_EVENT)
    await install_migrating_halfway(at_the_end, RECEPTION_KEY_FROM_EVENT, migrate_at=None)
    receptions = await receptions_read(halfway)
    assert len(receptions) > 1_000
    assert receptions == await receptions_read(at_the_end)
    readable = await receptions_read(halfway, "dlr.receptions_readable")
    assert readable == await receptions_read(at_the_end, "dlr.receptions_readable")
    assert await statuses_read(halfway) == await statuses_read(at_the_end)
    assert by_message(await changes_read(halfway)) == by_message(await changes_read(at_the_end))
    sample = sorted({r["message_id"] for r in receptions})[::50]
    assert len(sample) > 10
    assert await shown_read(halfway, sample) == await shown_read(at_the_end, sample)
    # The store migrated halfway holds both kinds of row; the other only its own keys (the
    # second round's late correlation replayed rows of both kinds in the first).
    kinds: dict[str, asyncpg.Record] = {}
    for dsn in databases:
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(_KINDS)
        finally:
            await conn.close()
        assert row is not None
        kinds[dsn] = row
    assert kinds[halfway]["own"] > 0
    assert kinds[halfway]["by_event"] > 0
    assert kinds[halfway]["own"] + kinds[halfway]["by_event"] == len(receptions)
    assert (kinds[at_the_end]["own"], kinds[at_the_end]["by_event"]) == (len(receptions), 0)


async def test_the_evidence_stays_append_only_through_the_view(
    store: Store, db: asyncpg.Connection
) -> None:
    """P13, as the table says it."""
    await store.ingest(LOGIN, [receipt("a1", datetime.now(UTC).timestamp())])
    for statement in ("UPDATE dlr.receptions SET stat = 'X'", "DELETE FROM dlr.receptions"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await db.execute(statement)
    row = await db.fetchrow("SELECT login, message_id, level FROM dlr.receptions")
    assert row is not None
    assert tuple(row) == (LOGIN, "a1", 2)
    raw = await db.fetchrow("SELECT login, message_id, level FROM dlr.reception_rows")
    assert raw is not None
    assert tuple(raw) == ("", "", None)


async def test_a_store_opened_before_it_stops_with_nothing_written(
    databases: list[str],
) -> None:
    """A Store that still copies into the table renamed stops as for any schema change under
    it (the daemon exits 78) and commits nothing of the batch."""
    raised, added = await ingest_after_migrating(databases[0], RECEPTION_KEY_FROM_EVENT)
    assert isinstance(raised, SchemaOutOfDateError)
    assert "schema changed" in str(raised)
    assert added == 0


async def test_forgetting_keeps_a_message_whose_deliveries_are_still_stored(
    store: Store, db: asyncpg.Connection
) -> None:
    """A delivery older than the cutoff still stored (the default partition's rows, which the
    retention never drops, or a day it was not asked to drop) keeps its message, whose events
    name its key."""
    old = datetime.now(UTC) - timedelta(days=30)
    await store.record_submissions(
        [Submission(LOGIN, m, "+34600000001") for m in ("kept", "forgotten")]
    )
    await store.ingest(LOGIN, [receipt(m, old.timestamp()) for m in ("kept", "forgotten")])
    # Both messages made old; the delivery of one gone with its day, as the retention drops
    # days before forgetting.
    await db.execute("ALTER TABLE dlr.reception_rows DISABLE TRIGGER USER")
    try:
        await db.execute(
            "DELETE FROM dlr.reception_rows"
            " WHERE event_id IN (SELECT id FROM dlr.events WHERE message_id = 'forgotten')"
        )
    finally:
        await db.execute("ALTER TABLE dlr.reception_rows ENABLE TRIGGER USER")
    await db.execute("UPDATE dlr.messages SET recorded_at = $1", old)
    await db.execute("UPDATE dlr.statuses SET updated_at = $1", old)
    assert await db.fetchval("SELECT count(*) FROM dlr.reception_rows") == 1

    forgotten = await forget(db, datetime.now(UTC) - timedelta(days=10))

    assert (forgotten.messages, forgotten.kept_for_evidence) == (1, 1)
    assert await db.fetchval("SELECT array_agg(message_id) FROM dlr.messages") == ["kept"]
    shown = await db.fetchrow("SELECT login, message_id, level FROM dlr.receptions")
    assert shown is not None
    assert tuple(shown) == (LOGIN, "kept", 2)
