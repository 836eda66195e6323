"""Migration 0013 on an installed store: the evidence's days are keyed by event from then on.

A store at the schema before 0013 holds today's receptions under the old key (login,
message_id, id). After `dlrfeed migrate`, that day keeps its key (it holds rows), the empty days
created ahead and the empty default partition take the new key (login, event_id, id), and so
does every day created later. Late correlation and `show` then read a message whose deliveries
lie on one day of each key.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission, queries
from dlrfeed.store.migrate import available_migrations, migrate
from dlrfeed.store.reports import message_reports
from dlrfeed.store.sql import query
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import DAY, install_schema_before, plan_of
from dlrfeed_tools.rule_receipts import feed_receipt

REKEYING = 13  # the migration under test
LATER_COLUMNS_ADDED = (
    "ALTER TABLE dlr.receptions ADD COLUMN channel text NOT NULL DEFAULT 'feed',"
    " ADD COLUMN peer text"
)
LATER_COLUMNS_DROPPED = "ALTER TABLE dlr.receptions DROP COLUMN channel, DROP COLUMN peer"
OLD_KEY = ["login", "message_id", "id"]
NEW_KEY = ["event_id", "id"]  # 0013's (login, event_id, id); the login left it in 0016
PARTITION_KEYS = """
SELECT c.relname, array_agg(a.attname::text ORDER BY k.ordinality) AS columns
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
JOIN pg_constraint AS p ON p.conrelid = c.oid AND p.contype = 'p'
CROSS JOIN LATERAL unnest(p.conkey) WITH ORDINALITY AS k(attnum, ordinality)
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE i.inhparent = coalesce(to_regclass('dlr.reception_rows'), 'dlr.receptions'::regclass)
GROUP BY c.relname
"""


@pytest.fixture
async def store_before_rekeying(pg_cluster: PgCluster) -> AsyncIterator[str]:
    name = f"rekey_{os.getpid()}"
    dsn = await pg_cluster.create_database(name)
    conn = await asyncpg.connect(dsn)
    try:
        await install_schema_before(conn, REKEYING)
    finally:
        await conn.close()
    yield dsn
    await pg_cluster.drop_database(name)


def _receipt(message_id: str, level: int, received_at: float) -> Receipt:
    stat = "ENROUTE" if level == 1 else "DELIVRD"
    return feed_receipt(
        message_id, level, stat, ack_token=f"t-{message_id}-{level}", received_at=received_at
    )


async def _keys(dsn: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["relname"]: list(r["columns"]) for r in await conn.fetch(PARTITION_KEYS)}
    finally:
        await conn.close()


async def test_days_holding_rows_keep_their_key_and_the_readers_use_both(
    store_before_rekeying: str,
) -> None:
    dsn = store_before_rekeying
    now = time.time()
    # The days, from one reading of the clock (the fixture's partitions start at its today).
    start_of_day = datetime.fromtimestamp(now, UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    tomorrow_noon = (start_of_day + DAY).timestamp() + 12 * 3600
    # Before the migration: progress that arrives before its message is recorded. Today's
    # ingest also writes the two columns of 0015 (channel, peer), so the old table has them
    # for its length, and drops them again: what is left is the table as released before 0013.
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(LATER_COLUMNS_ADDED)
        store = await Store.open(dsn, pool_size=1)
        try:
            await store.ingest("acme", [_receipt("early-1", 1, now), _receipt("early-2", 1, now)])
        finally:
            await store.close()
        await conn.execute(LATER_COLUMNS_DROPPED)
    finally:
        await conn.close()

    assert await migrate(dsn) == [m.name for m in available_migrations() if m.version >= REKEYING]
    keys = await _keys(dsn)
    day = start_of_day.strftime("%Y%m%d")
    next_day = (start_of_day + DAY).strftime("%Y%m%d")
    assert keys[f"receptions_{day}"] == OLD_KEY  # holds rows: kept as it was
    assert keys[f"receptions_{next_day}"] == NEW_KEY  # created ahead, empty
    assert keys["receptions_default"] == NEW_KEY
    conn = await asyncpg.connect(dsn)
    try:
        created = await conn.fetch(
            "SELECT dlr.create_reception_partitions($1::timestamptz)", start_of_day + 10 * DAY
        )
        assert created
    finally:
        await conn.close()
    keys = await _keys(dsn)
    assert all(keys[r[0]] == NEW_KEY for r in created)

    store = await Store.open(dsn, pool_size=1)
    try:  # after it: early-2's result lands on a day of the new key, early-3 only there
        await store.ingest(
            "acme",
            [_receipt("early-2", 2, tomorrow_noon), _receipt("early-3", 2, tomorrow_noon)],
        )
        result = await store.record_submissions(
            [Submission("acme", m, "+34600123456") for m in ("early-1", "early-2", "early-3")]
        )
    finally:
        await store.close()
    # Late correlation found every waiting event, on either day.
    assert result.late_correlated_events == 4

    conn = await asyncpg.connect(dsn)
    try:
        (report,) = await message_reports(conn, "early-2", "acme")
        assert report["status"]["status"] == "DELIVERED"
        assert sorted(r["level"] for r in report["receptions"]) == [1, 2]
        # Each day is probed through a key by dlrfeed's readers (`show`, late correlation): no
        # partition is scanned whole. (Since migration 0021 a row may name its key by its event,
        # so they read the table, matching each id as itself or empty.)
        await conn.execute("SET enable_seqscan = off")
        shown, waiting = (
            query("reception_rows").naming(receptions="reception_rows"),
            queries.RECEPTION_STATEMENTS.waiting,
        )
        for plan in (
            await plan_of(
                conn,
                shown.text,
                *shown.bind(logins=["acme"], receipt_ids=["early-2"], event_ids=[1]),
            ),
            await plan_of(
                conn, waiting.text, *waiting.bind(login="acme", correlation_ids=["early-2"])
            ),
        ):
            assert "Seq Scan" not in plan, plan
    finally:
        await conn.close()
