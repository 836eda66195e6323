"""A PostgreSQL outage mid-run — real server stopped and started again — and a
schema changed under the running daemon."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    assert_ledger_matches_store,
    drained,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.pgcluster import PgCluster


async def test_database_outage_stops_reading_releases_and_resumes(
    pg_cluster: PgCluster, database_url: str
) -> None:
    """While the DB is down nothing is acked and readers stop taking receipts; after
    --release-after the streams close so the gateway releases everything (F7); when the DB
    is back the daemon resumes by itself, and the ledger and the store agree."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(2000, prefix="a"))
        daemon = Daemon(
            settings_for(
                gateway.target, database_url, "--mode", "subscribe", "--release-after", "2"
            )
        )
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")
            await wait_until(lambda: drained(gateway), 30, "the first backlog to drain")
            # "fast": clients are cut mid-transaction; the test cluster runs synchronous_commit=off,
            # so an "immediate" stop would also forget acknowledged commits (not an outage).
            await asyncio.to_thread(pg_cluster.stop, "fast")
            try:
                await gateway.inject(LOGIN, receipt_bodies(2000, prefix="b"))
                acked_at_outage = gateway.stats(LOGIN)["acked"]

                async def released() -> bool:
                    stats = gateway.stats(LOGIN)
                    return stats["in_flight"] == 0 and stats["released_on_stream_end"] > 0

                await wait_until(released, 20, "the streams to be released (F7)")
                await asyncio.sleep(1.0)
                stats = gateway.stats(LOGIN)
                assert stats["acked"] == acked_at_outage, "acked while the store was down"
                assert stats["in_flight"] == 0, "receipts held while the store was down"
                assert not task.done(), "the daemon must not exit on a database outage"
            finally:
                await asyncio.to_thread(pg_cluster.start)
            await wait_until(lambda: drained(gateway), 60, "the backlog to drain after the outage")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
        events = [entry["event"] for entry in logs]
        assert "store_unavailable" in events
        assert "streams_released" in events
        assert "store_available" in events
        await assert_ledger_matches_store(gateway, database_url)
        assert gateway.stats(LOGIN)["acked"] == 4000


async def test_pull_readers_keep_what_they_pulled_through_an_outage_past_release_after(
    pg_cluster: PgCluster, database_url: str
) -> None:
    """F6: no call gives a lease back, so a Pull reader keeps the receipts it pulled when the
    outage outlasts --release-after, pulls nothing more while the store is down, and stores
    and acks them once it is back: the queue drains long before their lease would end (the
    lease is 120 s here), with nothing redelivered."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(2000, prefix="a"))
        daemon = Daemon(
            settings_for(gateway.target, database_url, "--mode", "pull", "--release-after", "2")
        )
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")
            await wait_until(lambda: drained(gateway), 30, "the first backlog to drain")
            await asyncio.to_thread(pg_cluster.stop, "fast")
            try:
                await gateway.inject(LOGIN, receipt_bodies(4000, prefix="b"))

                async def released() -> bool:
                    return any(entry["event"] == "streams_released" for entry in logs)

                await wait_until(released, 30, "the outage to outlast --release-after")
                held = gateway.stats(LOGIN)["in_flight"]
                await asyncio.sleep(1.0)
                stats = gateway.stats(LOGIN)
                assert held > 0, "the readers pulled nothing before the store went down"
                assert stats["in_flight"] == held, "pulled or gave back while the store was down"
                assert stats["queued"] > 0, "pulled receipts the store could not take"
                assert stats["acked"] == 2000, "acked while the store was down"
            finally:
                await asyncio.to_thread(pg_cluster.start)
            await wait_until(lambda: drained(gateway), 40, "the backlog to drain after the outage")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
        events = [entry["event"] for entry in logs]
        assert "pulled_receipts_kept" in events
        assert "batch_released" not in events
        stats = gateway.stats(LOGIN)
        assert stats["redelivered"] == 0
        assert stats["lease_expired"] == 0
        assert stats["acked"] == 6000
        await assert_ledger_matches_store(gateway, database_url)


async def test_schema_changed_under_the_running_daemon_stops_it_acking_nothing(
    database_url: str,
) -> None:
    """A migration run while the daemon is up (here: a column renamed): the daemon stops with
    exit 78 and one line naming `dlrfeed migrate`, instead of keeping every receipt as
    "unstorable" evidence; nothing was acked, so the gateway still holds every receipt."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "ALTER TABLE dlr.reception_rows RENAME COLUMN outcome TO outcome_renamed"
        )
    finally:
        await conn.close()
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(50))
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", "pull"))
        with pytest.raises(SchemaOutOfDateError) as caught:
            await asyncio.wait_for(daemon.run(), 30)
        assert caught.value.exit_code == 78
        stats = gateway.stats(LOGIN)
        assert stats["acked"] == 0
        assert stats["queued"] + stats["in_flight"] == 50
