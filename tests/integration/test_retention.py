"""Retention by whole days (`dlrfeed maintain`) against the real server.

Partitions are created ahead and dropped whole, archived first in a form that loads back; a
retention under the redelivery horizon (F16) is refused; a redelivery whose first delivery's
day was dropped is still a repeat (P14); show, stats and late correlation read across days;
a day is dropped while the daemon ingests, and nothing the daemon was given is lost.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.cli import main as dlrfeed_main
from dlrfeed.daemon.app import Daemon
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import ConfigError, FatalError
from dlrfeed.store import Store, Submission
from dlrfeed.store.reports import message_reports, statistics
from dlrfeed.store.retention import RetentionPolicy, maintain
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.retention_support import DAY, receipt, today

# The content of every reception, in id order (to compare an archive with its source).
ROW_TEXT = "SELECT md5(string_agg(r::text, ',' ORDER BY r.id)) FROM {table} AS r"
# dlr.receptions' columns, in order, as dlr.receptions_readable shows them.
READABLE_COLUMNS = (
    "id, login, message_id, level, stat, err, submit_date_raw, submit_at, done_date_raw,"
    " done_at, delivery_count, received_at, stored_at, payload, flags, outcome, event_id,"
    " parser_version, fingerprint, channel, peer"
)


async def partitions(db: asyncpg.Connection) -> dict[str, tuple[datetime | None, datetime | None]]:
    rows = await db.fetch(
        "SELECT partition_name, lower_bound, upper_bound FROM dlr.day_partitions"
        " WHERE parent_table = 'reception_rows'"
    )
    return {r["partition_name"]: (r["lower_bound"], r["upper_bound"]) for r in rows}


def test_a_retention_shorter_than_the_redelivery_horizon_is_refused_f16() -> None:
    with pytest.raises(ConfigError, match="redelivery horizon of 7 days"):
        RetentionPolicy(retention_days=6)
    with pytest.raises(ConfigError, match="horizon of 30 days"):
        RetentionPolicy(retention_days=14, redelivery_horizon_days=30)
    assert RetentionPolicy(retention_days=7).retention_days == 7


def test_the_command_refuses_it_with_one_line_and_exit_78(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = dlrfeed_main(
        ["maintain", "--database-url", "postgresql://nobody@127.0.0.1:1/x", "--retention-days=3"]
    )
    err = capsys.readouterr().err
    assert code == 78
    assert err.count("\n") == 1
    assert "redelivery horizon" in err


async def test_maintain_creates_days_ahead_once(database_url: str, db: asyncpg.Connection) -> None:
    first = await maintain(database_url, RetentionPolicy(days_ahead=10))
    again = await maintain(database_url, RetentionPolicy(days_ahead=10))
    days = await partitions(db)
    uppers = {upper for _, upper in days.values() if upper is not None}
    assert today() + 11 * DAY in uppers  # today and the 10 days after it
    assert first.created  # the migration made 7 days ahead, 10 asked for
    assert again.created == []
    assert again.dropped == []
    # Every day is one contiguous range: each lower bound is another partition's upper bound.
    lowers = {lower for lower, _ in days.values() if lower is not None}
    assert lowers <= uppers


async def test_old_days_are_archived_dropped_and_load_back(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    store = await Store.open(database_url, pool_size=1)
    old = (today() - 20 * DAY).timestamp() + 3600  # in the first partition (before today)
    now = time.time()
    try:
        await store.record_submissions(
            [Submission(LOGIN, f"m{n}", "+34600000001") for n in range(60)]
        )
        await store.ingest(LOGIN, [receipt(f"m{n}", old) for n in range(40)])
        await store.ingest(LOGIN, [receipt(f"late{n}", old) for n in range(5)])  # uncorrelated
        await store.ingest(LOGIN, [receipt(f"m{n}", now) for n in range(40, 60)])
        first_day = next(n for n in await partitions(db) if n.startswith("receptions_before_"))
        # The day as it reads, each delivery's fields filled in (an archive needs no events).
        source = await db.fetchval(
            ROW_TEXT.format(
                table=f"(SELECT {READABLE_COLUMNS} FROM dlr.receptions_readable"
                f" WHERE id IN (SELECT id FROM dlr_partitions.{first_day}))"
            )
        )
        assert await db.fetchval(
            f"SELECT count(*) FROM dlr_partitions.{first_day} WHERE stat IS NULL"
        ), "rows that defer to their event, filled in by the archive"

        # Seven days from now, with a week's retention: the first partition's day is over.
        report = await maintain(
            database_url,
            RetentionPolicy(retention_days=7),
            archive_dir=tmp_path,
            now=today() + 7 * DAY + timedelta(hours=1),
        )
        dropped = [name for name in report.dropped if name.startswith("receptions_")]
        assert dropped == [first_day]
        archived = [a for a in report.archived if a.partition.startswith("receptions_")]
        assert [a.partition for a in archived] == [first_day]
        assert archived[0].rows == 45
        assert first_day not in await partitions(db)
        assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 20

        # P14: the redelivery of a receipt whose first delivery's day is gone is a repeat.
        again = await store.ingest(LOGIN, [receipt("m3", now, delivery_count=2)])
        assert again.outcomes == [Outcome.REPEAT]
        # Late correlation replays an event's deliveries in their arrival order (P19); the
        # first one's day dropped, the event gives it back (P21): the status is the one the
        # live path computes, the event's exception resolved.
        late = await store.record_submissions([Submission(LOGIN, "late1", "+34600000001")])
        assert late.late_correlated_events == 1
        assert (
            await db.fetchval(
                "SELECT count(*) FROM dlr.exceptions WHERE message_id = 'late1'"
                " AND kind = 'uncorrelated' AND resolved_at IS NULL"
            )
            == 0
        )
        assert (
            await db.fetchval("SELECT status FROM dlr.message_status WHERE message_id = 'late1'")
            == "DELIVERED"
        )
    finally:
        await store.close()

    # show and stats read what is left, across the remaining days.
    reports = await message_reports(db, "m45", None)
    assert [len(r["receptions"]) for r in reports] == [1]
    assert (await message_reports(db, "m3", None))[0]["status"]["status"] == "DELIVERED"
    totals = await statistics(db, LOGIN)
    assert totals["receptions"]["total"] == 21

    manifest = json.loads(archived[0].manifest_file.read_text("utf-8"))
    assert manifest["rows"] == 45
    assert manifest["received_before"] == today().isoformat()
    # Load it back as the manifest says: a table LIKE dlr.receptions, binary COPY in.
    await db.execute(manifest["load_back"][0])
    data = gzip.decompress(archived[0].data_file.read_bytes())
    await db.copy_to_table("restored_receptions", source=io.BytesIO(data), format="binary")
    assert await db.fetchval(ROW_TEXT.format(table="restored_receptions")) == source


async def test_a_day_is_dropped_while_the_daemon_ingests(
    database_url: str, db: asyncpg.Connection
) -> None:
    store = await Store.open(database_url, pool_size=1)
    try:  # a day of old evidence, in the first partition
        old = (today() - 10 * DAY).timestamp()
        await store.ingest(LOGIN, [receipt(f"old{n}", old) for n in range(200)])
    finally:
        await store.close()
    bodies = receipt_bodies(6000, prefix="live")
    async with running_gateway() as gateway:
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", "pull"))
        task = asyncio.create_task(daemon.run(), name="daemon-under-test")
        try:
            await gateway.inject(LOGIN, bodies[:3000])

            async def some_stored() -> bool:
                return int(await db.fetchval("SELECT count(*) FROM dlr.receptions")) > 1000

            await wait_until(some_stored, 60, "the daemon to be ingesting")
            await gateway.inject(LOGIN, bodies[3000:])
            report = await maintain(
                database_url,
                RetentionPolicy(retention_days=7),
                now=today() + 7 * DAY + timedelta(minutes=1),
            )

            async def all_stored() -> bool:
                stats = gateway.stats(LOGIN)
                return stats["queued"] == 0 and stats["in_flight"] == 0

            await wait_until(all_stored, 120, "the queue to drain")
        finally:
            daemon.stop()
            code = await asyncio.wait_for(task, 30)
    assert code == 0
    dropped = [name for name in report.dropped if name.startswith("receptions_")]
    assert len(dropped) == 1
    assert dropped[0].startswith("receptions_before_")
    # Everything the gateway gave was stored and nothing of the old day is left.
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == len(bodies)
    assert await db.fetchval("SELECT count(*) FROM dlr.events") == len(bodies) + 200


async def test_receptions_of_a_missing_day_land_in_the_default_and_move_to_their_day(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Nothing is refused when maintain has not run: the reception waits in the default
    partition, maintain says so, and the procedure of docs/retention.md moves it."""
    store = await Store.open(database_url, pool_size=1)
    try:
        far = (today() + 20 * DAY).timestamp() + 60  # beyond the week the migration created
        result = await store.ingest(LOGIN, [receipt("future", far)])
    finally:
        await store.close()
    assert result.outcomes == [Outcome.UNCORRELATED]
    assert await db.fetchval("SELECT count(*) FROM dlr_partitions.receptions_default") == 1
    with pytest.raises(FatalError, match="receptions_default"):
        await maintain(database_url, RetentionPolicy(days_ahead=30))
    await db.execute(
        """
        BEGIN;
        ALTER TABLE dlr.reception_rows DETACH PARTITION dlr_partitions.receptions_default;
        SELECT dlr.create_reception_partitions(now() + interval '30 days');
        INSERT INTO dlr.reception_rows SELECT * FROM dlr_partitions.receptions_default;
        ALTER TABLE dlr_partitions.receptions_default RENAME TO receptions_default_moved;
        ALTER INDEX dlr_partitions.receptions_default_pkey RENAME TO receptions_default_moved_pkey;
        CREATE TABLE dlr_partitions.receptions_default PARTITION OF dlr.reception_rows DEFAULT;
        ALTER TABLE dlr_partitions.receptions_default
            ADD CONSTRAINT receptions_default_pkey PRIMARY KEY (event_id, id);
        COMMIT;
        DROP TABLE dlr_partitions.receptions_default_moved;
        """
    )
    report = await maintain(database_url, RetentionPolicy(days_ahead=30))
    assert not report.default_partition_holds_rows
    day = (today() + 20 * DAY).strftime("%Y%m%d")
    assert await db.fetchval(f"SELECT count(*) FROM dlr_partitions.receptions_{day}") == 1
