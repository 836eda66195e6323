"""Migration 0017: each message's change order is kept on its status row, and the change log
loses its per-message B-tree.

On a store at the schema before it, holding statuses and their changes:
- it adds `message_status.change_epoch` without rewriting the table, drops the B-tree from
  every day, gives the days the trigger can read a partial index of withdrawals, and locks
  only the two tables, their days and indexes;
- a stored status gets an epoch above every change already written, so a change made after
  the migration, even by a transaction older than the message's last change, follows it;
- the withdrawal lookup of a first status reads that partial index, never a day's changes,
  whatever the planner's estimates.
The order of changes written on the new schema (racing writers, withdrawals, the horizon) is
tests/integration/test_changes.py's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.store.migrate import current_version
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import apply_measured, install_with_traffic
from dlrfeed_tools.pgcluster import PgCluster

CHANGE_EPOCH = 17

_DAY_INDEXES = """
SELECT c.relname AS day, i.relname AS index
FROM pg_inherits AS h
JOIN pg_class AS c ON c.oid = h.inhrelid
JOIN pg_index AS x ON x.indrelid = c.oid AND NOT x.indisprimary
JOIN pg_class AS i ON i.oid = x.indexrelid
WHERE h.inhparent = 'dlr.status_changes'::regclass
"""
_DAYS = "SELECT partition_name FROM dlr.day_partitions WHERE parent_table = 'status_changes'"
_READABLE = " AND (is_default OR upper_bound > now())"
_PAST = " AND upper_bound < now() - interval '2 hours'"
# Blocks of a day of changes and of its indexes fetched so far in this transaction.
_TOUCHED = """
SELECT sum(pg_stat_get_xact_blocks_fetched(oid)) FROM pg_class
WHERE oid = $day OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $day)
"""
_UPDATE = "UPDATE dlr.message_status SET status = $2, reason = $2 WHERE message_id = $1"
# The first partition (every day before the first one created, empty here) made to end a day
# earlier, and that day a partition of its own: so that a day ended long before the migration
# exists at any time of day (the first day created starts at midnight UTC, which an hour or
# two after it is not yet past).
_A_DAY_LONG_PAST = """
DO $days$
DECLARE
    first text;
    bound timestamptz;
BEGIN
    SET LOCAL timezone = 'UTC';
    SELECT partition_name, upper_bound INTO first, bound FROM dlr.day_partitions
    WHERE parent_table = 'status_changes' AND NOT is_default ORDER BY upper_bound LIMIT 1;
    EXECUTE format('ALTER TABLE dlr.status_changes DETACH PARTITION dlr_partitions.%I', first);
    EXECUTE format('DROP TABLE dlr_partitions.%I', first);
    EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_changes'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', first, bound - interval '1 day');
    EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_changes'
                   ' FOR VALUES FROM (%L) TO (%L)',
                   'status_changes_' || to_char(bound - interval '1 day', 'YYYYMMDD'),
                   bound - interval '1 day', bound);
END
$days$
"""


@pytest.fixture
async def installed_store(pg_cluster: PgCluster) -> AsyncIterator[str]:
    """A store at the schema before 0017 holding a few thousand receptions with their
    statuses and changes."""
    name = f"change_epoch_{os.getpid()}"
    dsn = await pg_cluster.create_database(name)
    conn = await asyncpg.connect(dsn)
    try:
        await install_with_traffic(dsn, CHANGE_EPOCH)
        assert not await conn.fetchval(
            "SELECT count(*) FROM dlr.status_changes WHERE changed_at < date_trunc('day', now())"
        )
        await conn.execute(_A_DAY_LONG_PAST)
    finally:
        await conn.close()
    yield dsn
    await pg_cluster.drop_database(name)


async def test_it_adds_the_column_without_a_rewrite_and_swaps_the_day_indexes(
    installed_store: str,
) -> None:
    conn = await asyncpg.connect(installed_store)
    try:
        days = [r[0] for r in await conn.fetch(_DAYS)]
        # Days the trigger can read (ending in the future, or the default) and days it cannot
        # (ended over two hours ago); one ending within the hour around the test is neither.
        readable = {r[0] for r in await conn.fetch(_DAYS + _READABLE)}
        past = {r[0] for r in await conn.fetch(_DAYS + _PAST)}
        before = {(r["day"], r["index"]) for r in await conn.fetch(_DAY_INDEXES)}
        last_epoch = int(await conn.fetchval("SELECT max(position) FROM dlr.status_changes"))
        last_epoch //= 10**19
    finally:
        await conn.close()
    assert {day for day, _index in before} == set(days)  # the B-tree, on every day
    assert readable
    assert past  # the first partition, which holds every day before the first one created

    cost = await apply_measured(installed_store, CHANGE_EPOCH)

    conn = await asyncpg.connect(installed_store)
    try:
        assert await current_version(conn) == CHANGE_EPOCH
        after = {(r["day"], r["index"]) for r in await conn.fetch(_DAY_INDEXES)}
        epochs = await conn.fetchrow(
            "SELECT min(change_epoch) AS low, max(change_epoch) AS high, count(*) AS statuses"
            " FROM dlr.message_status"
        )
        await conn.execute("SELECT dlr.create_status_change_partitions(now() + interval '12 days')")
        later = {(r["day"], r["index"]) for r in await conn.fetch(_DAY_INDEXES)} - after
    finally:
        await conn.close()
    assert {(day, f"{day}_withdrawn") for day in readable} <= after
    assert not {day for day, _index in after} & past
    assert all(index == f"{day}_withdrawn" for day, index in after)
    assert later
    assert all(index == f"{day}_withdrawn" for day, index in later)
    # One constant for every stored row, above every change already written.
    assert epochs is not None
    assert epochs["statuses"] > 1000
    assert epochs["low"] == epochs["high"] > last_epoch

    tables = {"dlr.message_status", "dlr.status_changes"} | {f"dlr_partitions.{d}" for d in days}
    exclusive = {r for r, modes in cost.locks.items() if "AccessExclusiveLock" in modes}
    assert tables <= exclusive
    # Nothing else is locked but those tables' indexes, the view that lists the days (read),
    # and the version table the migration records itself in.
    others = {
        r
        for r in cost.locks
        if not r.split(".")[1].startswith(("status_changes", "message_status"))
    }
    assert others <= {"dlr.day_partitions", "dlr.schema_version", "dlr.schema_version_pkey"}
    assert cost.locks.get("dlr.day_partitions", {"AccessShareLock"}) == {"AccessShareLock"}
    # The only new files are the withdrawals' indexes: no table is rewritten.
    assert set(cost.rewritten) <= {f"dlr_partitions.{day}_withdrawn" for day in days}
    assert cost.wal_bytes < 1024 * 1024


async def test_a_change_after_it_follows_the_messages_earlier_ones_from_an_older_transaction(
    installed_store: str,
) -> None:
    conn = await asyncpg.connect(installed_store)
    old = await asyncpg.connect(installed_store)
    try:
        first = await conn.fetchrow(
            "SELECT message_id, status FROM dlr.message_status ORDER BY message_id LIMIT 1"
        )
        assert first is not None
        message_id, status = first["message_id"], first["status"]
        await old.execute("BEGIN")
        old_xid = int(await old.fetchval("SELECT pg_current_xact_id()::text::bigint"))
        # A newer transaction changes the message before the migration...
        await conn.execute(_UPDATE, message_id, "ACCEPTED")
        await apply_measured(installed_store, CHANGE_EPOCH)
        # ...and the older one changes it after: its change must come last.
        await old.execute(_UPDATE, message_id, "UNDELIVERABLE")
        await old.execute("COMMIT")
        chain = await conn.fetch(
            "SELECT position, status, previous_status FROM dlr.status_changes"
            " WHERE message_id = $1 ORDER BY position",
            message_id,
        )
    finally:
        await old.close()
        await conn.close()
    assert [(r["status"], r["previous_status"]) for r in chain][-2:] == [
        ("ACCEPTED", status),
        ("UNDELIVERABLE", "ACCEPTED"),
    ]
    assert int(chain[-1]["position"]) // 10**19 > old_xid


async def test_the_withdrawal_lookup_reads_its_index_not_the_days_changes(
    installed_store: str,
) -> None:
    await apply_measured(installed_store, CHANGE_EPOCH)
    conn = await asyncpg.connect(installed_store)
    try:
        # A log spread over five days, a fifth of it today, none of it withdrawals: a lookup
        # that walked today's position key backwards, filtering on the message, would read all
        # of today's changes.
        await conn.execute(
            "INSERT INTO dlr.status_changes (position, changed_at, login, message_id, status,"
            " is_final, reason, supporting_event_id, rules_version)"
            " SELECT g, now() - (g % 5) * interval '1 day' + interval '1 minute', $1,"
            " md5(g::text), 'ENROUTE', false, 'r', 1, 'v' FROM generate_series(1, 200000) AS g",
            LOGIN,
        )
        await conn.execute("ANALYZE dlr.status_changes")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        # A first status, whose change looks for a withdrawal of the message: the blocks of
        # today's changes (table and key) its transaction touched, against their ~1,000 pages.
        # The first one in a session plans the trigger's statements: measure the second.
        day = await conn.fetchval(
            "SELECT tableoid FROM dlr.status_changes WHERE message_id = md5('5')"
        )
        touched = _TOUCHED.replace("$day", str(day))
        for message_id in ("a first status", "a second first status"):
            async with conn.transaction():
                before = await conn.fetchval(touched)
                await conn.execute(
                    "INSERT INTO dlr.message_status (login, message_id, status, is_final,"
                    " reason, supporting_event_id, rules_version)"
                    " VALUES ($1, $2, 'ENROUTE', false, 'r', 0, 'v')",
                    LOGIN,
                    message_id,
                )
                blocks = await conn.fetchval(touched) - before
        today_pages = await conn.fetchval("SELECT relpages FROM pg_class WHERE oid = $1", day)
    finally:
        await conn.close()
    assert today_pages > 500
    assert blocks < 20
