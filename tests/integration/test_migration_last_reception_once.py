"""Migration 0023: an event's last reception time is kept only when it is not its first.

- On an installed store it is a catalog change only: a brief lock on the events, nothing
  rewritten; every stored event keeps both times.
- In a store migrated halfway through a traffic, every event shows as its last reception time
  the newest of its deliveries, whichever kind of row it is, and `dlrfeed show` says so.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dlrfeed.store import Store
from dlrfeed.store.reports import message_reports
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    assert_online,
    install_migrating_halfway,
    install_with_traffic,
)
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import receipt

LAST_RECEPTION_ONCE = 23
_ROUNDING = timedelta(microseconds=1)
# Each event's last reception time as readers take it, beside its deliveries' newest.
_SHOWN_AND_NEWEST = """
SELECT e.id, e.last_received_at IS NULL AS once,
       coalesce(e.last_received_at, e.first_received_at) AS shown, max(r.received_at) AS newest
FROM dlr.events AS e
JOIN dlr.receptions AS r ON r.event_id = e.id
GROUP BY e.id, e.last_received_at, e.first_received_at  -- a view's: no key to group by (0024)
"""


@pytest.fixture
async def database(pg_cluster: PgCluster) -> AsyncIterator[str]:
    name = f"last_reception_{os.getpid()}"
    yield await pg_cluster.create_database(name)
    await pg_cluster.drop_database(name)


async def test_it_changes_the_catalog_only_under_a_brief_lock(database: str) -> None:
    await install_with_traffic(database, LAST_RECEPTION_ONCE)
    cost = await apply_measured(database, LAST_RECEPTION_ONCE)
    assert_online(cost, exclusive="dlr.events", untouched=("dlr.reception_rows", "dlr.statuses"))
    conn = await asyncpg.connect(database)
    try:
        assert await conn.fetchval("SELECT count(*) FROM dlr.events") > 1_000
        assert not await conn.fetchval(
            "SELECT count(*) FROM dlr.events WHERE last_received_at IS NULL"
        )
    finally:
        await conn.close()


async def test_every_event_shows_its_newest_delivery_either_way(database: str) -> None:
    await install_migrating_halfway(database, LAST_RECEPTION_ONCE)
    conn = await asyncpg.connect(database)
    try:
        rows = await conn.fetch(_SHOWN_AND_NEWEST)
    finally:
        await conn.close()
    assert len(rows) > 1_000
    assert {r["once"] for r in rows} == {True, False}
    # The events' times come from the receipt's float seconds by to_timestamp, the
    # receptions' by the COPY's microseconds: the two may round a microsecond apart.
    assert [r["id"] for r in rows if abs(r["shown"] - r["newest"]) > _ROUNDING] == []


async def test_a_later_delivery_is_the_last_one_shown(store: Store, db: asyncpg.Connection) -> None:
    first = datetime(2026, 12, 1, 10, tzinfo=UTC)
    await store.ingest(LOGIN, [receipt("once", first.timestamp())])
    await store.ingest(LOGIN, [receipt("twice", first.timestamp())])
    # A redelivery received at the same time changes nothing; a later one is the last.
    await store.ingest(LOGIN, [receipt("once", first.timestamp(), delivery_count=2)])
    later = first + timedelta(minutes=5)
    await store.ingest(LOGIN, [receipt("twice", later.timestamp(), delivery_count=2)])
    stored = {
        r["message_id"]: r["last_received_at"]
        for r in await db.fetch("SELECT message_id, last_received_at FROM dlr.events")
    }
    assert stored == {"once": None, "twice": later}
    for message_id, last in (("once", first), ("twice", later)):
        (report,) = await message_reports(db, message_id, LOGIN)
        (event,) = report["events"]
        assert (event["first_received_at"], event["last_received_at"]) == (
            first.isoformat(),
            last.isoformat(),
        )
