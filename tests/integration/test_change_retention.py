"""The status-change log under the evidence's retention (`dlrfeed maintain`) against the real
server.

Maintain creates the log's days ahead and archives and drops its old days with the evidence's;
a day that a durable consumer (dlr.change_cursors) has not read to its end is
refused in one line naming the consumer and its position, unless the consumer is abandoned.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.errors import FatalError
from dlrfeed.store import Store, Submission
from dlrfeed.store.changes import read_changes, save_cursor
from dlrfeed.store.retention import RetentionPolicy, maintain
from dlrfeed_tools.retention_support import (
    DAY,
    receipt,
    today,
)
from support.console import dlrfeed

LOGIN = "acme"
ROW_TEXT = "SELECT md5(string_agg(c::text, ',' ORDER BY c.position)) FROM {table} AS c"


async def change_partitions(db: asyncpg.Connection) -> dict[str, int]:
    """Every partition of the change log (but the default) with its row count."""
    names = [
        r["partition_name"]
        for r in await db.fetch(
            "SELECT partition_name FROM dlr.day_partitions"
            " WHERE parent_table = 'status_change_rows' AND NOT is_default"
        )
    ]
    return {
        name: int(await db.fetchval(f"SELECT count(*) FROM dlr_partitions.{name}"))
        for name in names
    }


async def ten_changes(database_url: str) -> None:
    """Ten messages, each given its final status now: ten changes of today."""
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions(
            [Submission(LOGIN, f"m{n}", "+34600000001") for n in range(10)]
        )
        await store.ingest(LOGIN, [receipt(f"m{n}", time.time()) for n in range(10)])
    finally:
        await store.close()


async def test_the_change_log_is_partitioned_by_day_and_maintain_creates_its_days_ahead(
    database_url: str, db: asyncpg.Connection
) -> None:
    relkind = "SELECT relkind::text FROM pg_class WHERE oid = $1::regclass"
    assert await db.fetchval(relkind, "dlr.status_change_rows") == "p"  # partitioned
    assert await db.fetchval(relkind, "dlr.status_changes") == "v"  # its readers' view
    report = await maintain(database_url, RetentionPolicy(days_ahead=10))
    assert any(name.startswith("status_changes_") for name in report.created)
    uppers = {
        r["upper_bound"]
        for r in await db.fetch(
            "SELECT upper_bound FROM dlr.day_partitions WHERE parent_table = 'status_change_rows'"
        )
    }
    assert today() + 11 * DAY in uppers
    # The triggers of 0009 still write, into the partition of today.
    await ten_changes(database_url)
    counts = await change_partitions(db)
    assert counts[f"status_changes_{today():%Y%m%d}"] == 10
    assert len(await read_changes(db, 0)) == 10


async def test_a_day_a_consumer_has_not_read_is_refused_then_dropped_once_read(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await ten_changes(database_url)
    changes = await read_changes(db, 0)
    source = await db.fetchval(ROW_TEXT.format(table="dlr.status_changes"))
    await save_cursor(db, "billing", changes[4].position)  # read half of today's changes
    await save_cursor(db, "relay", changes[-1].position)  # read all of them
    later = today() + 8 * DAY + timedelta(hours=1)  # a week's retention: today is out
    day = f"status_changes_{today():%Y%m%d}"

    with pytest.raises(FatalError) as refused:
        await maintain(database_url, RetentionPolicy(retention_days=7), archive_dir=tmp_path,
                       now=later)  # fmt: skip
    message = str(refused.value)
    assert "consumer 'billing'" in message
    assert f"position {changes[4].position}" in message
    assert "--abandon-consumer billing" in message
    assert "\n" not in message
    # Neither archived nor dropped: the day is still whole.
    assert sum((await change_partitions(db)).values()) == 10
    assert not await asyncio.to_thread(lambda: list(tmp_path.glob(f"{day}.*")))

    await save_cursor(db, "billing", changes[-1].position)  # it catches up
    report = await maintain(
        database_url, RetentionPolicy(retention_days=7), archive_dir=tmp_path, now=later
    )
    assert day in report.dropped
    assert day not in await change_partitions(db)
    assert await db.fetchval("SELECT count(*) FROM dlr.status_changes") == 0
    (archived,) = [a for a in report.archived if a.partition == day]
    assert archived.rows == 10
    manifest = json.loads(archived.manifest_file.read_text("utf-8"))
    assert manifest["table"] == "dlr.status_changes"
    assert manifest["changed_before"] == (today() + DAY).isoformat()
    await db.execute(manifest["load_back"][0])
    data = gzip.decompress(archived.data_file.read_bytes())
    await db.copy_to_table("restored_status_changes", source=io.BytesIO(data), format="binary")
    assert await db.fetchval(ROW_TEXT.format(table="restored_status_changes")) == source


async def test_an_abandoned_consumer_does_not_hold_the_day_back(
    database_url: str, db: asyncpg.Connection
) -> None:
    await ten_changes(database_url)
    await save_cursor(db, "gone", 0)
    await save_cursor(db, "billing", 0)
    later = today() + 8 * DAY + timedelta(hours=1)
    with pytest.raises(FatalError, match="consumer 'billing'"):
        await maintain(database_url, RetentionPolicy(retention_days=7), now=later,
                       abandoned_consumers=["gone"])  # fmt: skip
    report = await maintain(
        database_url,
        RetentionPolicy(retention_days=7),
        now=later,
        abandoned_consumers=["gone", "billing"],
    )
    assert f"status_changes_{today():%Y%m%d}" in report.dropped
    assert await db.fetchval("SELECT count(*) FROM dlr.status_changes") == 0


async def test_the_command_refuses_in_one_line_naming_the_consumer(
    database_url: str, db: asyncpg.Connection
) -> None:
    """`dlrfeed maintain` as a process, on real time: a day of changes three weeks old, which
    consumer `billing` has not read, is refused until --abandon-consumer billing."""
    old = today() - 21 * DAY
    first = await db.fetchval(
        "SELECT partition_name FROM dlr.day_partitions"
        " WHERE parent_table = 'status_change_rows' AND lower_bound IS NULL"
    )
    # The owner's hands: the first partition ends three weeks ago, one day of changes after it.
    await db.execute(
        f"""
        ALTER TABLE dlr.status_change_rows DETACH PARTITION dlr_partitions.{first};
        DROP TABLE dlr_partitions.{first};
        CREATE TABLE dlr_partitions.status_changes_before_{old:%Y%m%d}
            PARTITION OF dlr.status_change_rows FOR VALUES FROM (MINVALUE) TO ('{old.isoformat()}');
        CREATE TABLE dlr_partitions.status_changes_{old:%Y%m%d}
            PARTITION OF dlr.status_change_rows
            FOR VALUES FROM ('{old.isoformat()}') TO ('{(old + DAY).isoformat()}');
        CREATE TABLE dlr_partitions.status_changes_gap
            PARTITION OF dlr.status_change_rows
            FOR VALUES FROM ('{(old + DAY).isoformat()}') TO ('{today().isoformat()}');
        INSERT INTO dlr.status_change_rows (position, changed_at, login, message_id, status,
            is_final, reason, supporting_event_id, rules_version)
        VALUES (1e19 + 1, '{(old + timedelta(hours=3)).isoformat()}', 'acme', 'old1',
                'DELIVERED', true, 'final', 1, 'r1');
        """
    )
    await save_cursor(db, "billing", 0)
    refused = await asyncio.to_thread(
        dlrfeed, "maintain", "--database-url", database_url, "--retention-days", "7"
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(
        f"dlrfeed: refused to drop dlr_partitions.status_changes_{old:%Y%m%d}: consumer "
        "'billing' has read the change log only up to position 0"
    ), refused.stderr
    assert await db.fetchval("SELECT count(*) FROM dlr.status_changes") == 1

    done = await asyncio.to_thread(
        dlrfeed, "maintain", "--database-url", database_url, "--retention-days", "7",
        "--abandon-consumer", "billing",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"dropped dlr_partitions.status_changes_{old:%Y%m%d}" in done.stdout.splitlines()
    assert await db.fetchval("SELECT count(*) FROM dlr.status_changes") == 0
