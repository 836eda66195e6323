"""`Store.record_submissions` in one durable step: a call of many chunks waits for its WAL to be
made durable once (its last chunk's commit), not once per chunk; and each chunk's transaction
holds a bounded number of locks, whatever the size of the call (docs/postgresql.md, "Locks").

The wait is made visible with synchronous replication to a standby that never answers: every
commit that waits for durability then waits there (wait event `SyncRep`) for good, so what was
committed before the wait began is what the call did without waiting."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed.store.recording import record_submissions
from dlrfeed.store.submission import SubmissionResult
from dlrfeed_tools.pgcluster import PgCluster, free_port
from dlrfeed_tools.rule_receipts import feed_receipt

CHUNKS = 6
CHUNK = 500


@pytest.fixture
async def own_dsn() -> AsyncIterator[str]:
    """A migrated database on a durable server of its own (the test changes its settings)."""
    with tempfile.TemporaryDirectory(prefix="dlrfeed-durability-") as root:
        cluster = PgCluster(Path(root), free_port(), fsync=True)  # synchronous_commit on
        cluster.init()
        cluster.start()
        try:
            dsn = await cluster.create_database("recording")
            await migrate(dsn)
            yield dsn
        finally:
            cluster.destroy()


def _submissions(prefix: str, count: int) -> list[Submission]:
    return [Submission("acme", f"{prefix}-{n:06d}", "+34600000000") for n in range(count)]


async def _set_synchronous_standby(admin: asyncpg.Connection, names: str) -> None:
    await admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    await admin.execute("SELECT pg_reload_conf()")


async def test_only_the_last_chunk_of_a_call_waits_for_durability(own_dsn: str) -> None:
    admin = await asyncpg.connect(own_dsn)
    store = await Store.open(own_dsn, pool_size=1)
    recording: asyncio.Task[SubmissionResult] | None = None
    try:
        await _set_synchronous_standby(admin, "a_standby_that_never_answers")
        recording = asyncio.create_task(store.record_submissions(_submissions("m", CHUNKS * CHUNK)))
        for _ in range(1000):
            waiting = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting == 1, "the recorder never waited for durability"
        # The call's first wait is its last chunk's: the chunks before it are committed (a
        # commit waiting for durability is not yet visible, so the last one is not counted).
        # A wait per chunk would stop at the first: 0 visible.
        visible = await admin.fetchval("SELECT count(*) FROM dlr.messages")
        assert visible == (CHUNKS - 1) * CHUNK
        assert not recording.done()
        await _set_synchronous_standby(admin, "")  # the wait ends; so does the call
        result = await asyncio.wait_for(recording, 30)
    finally:
        await _set_synchronous_standby(admin, "")
        if recording is not None and not recording.done():
            recording.cancel()
        await store.close()
        await admin.close()
    assert result.recorded == CHUNKS * CHUNK


async def test_a_chunk_that_changes_statuses_waits_for_durability(own_dsn: str) -> None:
    """P23: a chunk whose late correlation wrote status changes waits for its flush before they
    are visible: a change a consumer read, lost in a crash and written again at another
    position, would reach it twice. Here the first chunk correlates a waiting receipt."""
    admin = await asyncpg.connect(own_dsn)
    store = await Store.open(own_dsn, pool_size=1)
    recording: asyncio.Task[SubmissionResult] | None = None
    try:
        early = feed_receipt("m-000000", 2, "DELIVRD", ack_token="t", received_at=time.time())
        await store.ingest("acme", [early])
        await _set_synchronous_standby(admin, "a_standby_that_never_answers")
        recording = asyncio.create_task(store.record_submissions(_submissions("m", CHUNKS * CHUNK)))
        for _ in range(1000):
            waiting = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting == 1, "the recorder never waited for durability"
        assert await admin.fetchval("SELECT count(*) FROM dlr.messages") == 0
        assert await admin.fetchval("SELECT count(*) FROM dlr.status_changes") == 0
        await _set_synchronous_standby(admin, "")
        result = await asyncio.wait_for(recording, 30)
    finally:
        await _set_synchronous_standby(admin, "")
        if recording is not None and not recording.done():
            recording.cancel()
        await store.close()
        await admin.close()
    assert (result.recorded, result.late_correlated_events) == (CHUNKS * CHUNK, 1)


async def test_a_chunk_holds_its_ids_locks_and_a_few_more_whatever_the_call(
    own_dsn: str,
) -> None:
    """The bound docs/postgresql.md gives: a recorder's transaction holds one advisory lock per
    id of its chunk (500 at most) and a few dozen relation locks, against the shared lock table
    of max_locks_per_transaction x (max_connections + max_prepared_transactions) slots."""
    conn = await asyncpg.connect(own_dsn)
    try:
        async with conn.transaction():  # kept open: the locks are counted before the commit
            await record_submissions(
                conn,
                IntegrationOptions(),
                _submissions("l", CHUNK),
            )
            locks = await conn.fetch(
                "SELECT locktype, count(*) AS n FROM pg_locks"
                " WHERE pid = pg_backend_pid() GROUP BY locktype"
            )
    finally:
        await conn.close()
    held = {row["locktype"]: row["n"] for row in locks}
    assert held["advisory"] == CHUNK
    assert sum(held.values()) - held["advisory"] <= 60, held
