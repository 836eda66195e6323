"""Forgetting old messages (`dlrfeed maintain --forget-after-days`) against the
real server: a message goes whole - record, status, events - once nothing of it happened since
the cutoff, with no change written for its status; a message with something recent, one being
written, and one an open exception refers to are kept (a closed one goes with it); a receipt for
a forgotten message is kept as uncorrelated, never applied to a half-remembered state (P12); the
pass resumes where it kept a message back."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import asyncpg
import pytest

from dlrfeed.daemon.app import Daemon
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import ConfigError
from dlrfeed.store import Store, Submission
from dlrfeed.store.retention import Forgotten, RetentionPolicy, forget
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.retention_support import DAY, drop_days_before, today
from dlrfeed_tools.rule_receipts import feed_receipt
from support.console import dlrfeed

# Recorded (and so ordered by dlr.messages.id) in the order of their names.
OLD, RECENT, INVESTIGATED, SILENT = "a-old", "b-recent", "c-investigated", "d-silent"
LATE = "e-late"  # its receipt came first; recorded after, correlated late
UNCORRELATED_ID = "z-never-recorded"


def _receipt(message_id: str, level: int, stat: str, received_at: float, tag: str = "1") -> Receipt:
    return feed_receipt(
        message_id, level, stat, ack_token=f"{message_id}.{level}.{tag}", received_at=received_at
    )


async def _store_of_five(database_url: str) -> None:
    """OLD delivered today; RECENT with its result five days ahead; INVESTIGATED with two
    different results (a conflict: an open exception); SILENT recorded, never a receipt; LATE
    delivered before it was recorded (its `uncorrelated` exception resolved by late
    correlation); and an event of a message never recorded (its exception open)."""
    now = today().timestamp() + 3600
    later = (today() + 5 * DAY).timestamp() + 3600
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600123456") for m in (OLD, RECENT, INVESTIGATED, SILENT)]
        )
        result = await store.ingest(
            LOGIN,
            [
                _receipt(OLD, 1, "ENROUTE", now),
                _receipt(OLD, 2, "DELIVRD", now),
                _receipt(RECENT, 1, "ENROUTE", now),
                _receipt(INVESTIGATED, 2, "DELIVRD", now),
                _receipt(UNCORRELATED_ID, 2, "DELIVRD", now),
                _receipt(LATE, 2, "DELIVRD", now),
            ],
        )
        assert result.outcomes[-2:] == [Outcome.UNCORRELATED, Outcome.UNCORRELATED]
        late = await store.record_submissions([Submission(LOGIN, LATE, "+34600123456")])
        assert late.late_correlated_events == 1
        conflict = await store.ingest(
            LOGIN,
            [_receipt(RECENT, 2, "DELIVRD", later), _receipt(INVESTIGATED, 2, "UNDELIV", now, "2")],
        )
        assert conflict.outcomes[1] is Outcome.CONFLICT
    finally:
        await store.close()


async def _forget(db: asyncpg.Connection, cutoff: datetime) -> Forgotten:
    """Forget as `maintain` does, after the retention's drops: no delivery or change older
    than the cutoff is left."""
    await drop_days_before(db, cutoff)
    return await forget(db, cutoff)


async def _present(db: asyncpg.Connection) -> dict[str, set[str]]:
    return {
        table: {r[0] for r in await db.fetch(f"SELECT message_id FROM dlr.{table}")}
        for table in ("messages", "message_status", "events")
    }


async def test_old_messages_go_whole_and_the_rest_stay(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _store_of_five(database_url)
    forgotten = await _forget(db, today() + 3 * DAY)
    assert forgotten == Forgotten(
        messages=3, statuses=2, events=3, closed_exceptions=1, kept_for_open_exceptions=1
    )
    present = await _present(db)
    assert present["messages"] == {RECENT, INVESTIGATED}
    assert present["message_status"] == {RECENT, INVESTIGATED}
    assert present["events"] == {RECENT, INVESTIGATED, UNCORRELATED_ID}
    # LATE's closed investigation went with it; the open ones stay.
    open_or_not = await db.fetch("SELECT message_id, resolved_at IS NULL FROM dlr.exceptions")
    assert sorted(tuple(r) for r in open_or_not) == [
        (INVESTIGATED, True),
        (UNCORRELATED_ID, True),
    ]
    # Forgetting is not a withdrawal: no change written (the retention had emptied the log).
    assert await db.fetchval("SELECT count(*) FROM dlr.status_changes") == 0
    # The pass holds its place just before the message it kept as recent.
    recent_id = await db.fetchval("SELECT id FROM dlr.messages WHERE message_id = $1", RECENT)
    assert await db.fetchval("SELECT after_id FROM dlr.forgetting_position") == recent_id - 1

    # Once RECENT is old too, the next pass takes it; INVESTIGATED stays for its operator, and
    # the pass holds its place before it.
    again = await _forget(db, today() + 7 * DAY)
    assert again == Forgotten(messages=1, statuses=1, events=2, kept_for_open_exceptions=1)
    assert (await _present(db))["messages"] == {INVESTIGATED}
    investigated_id = await db.fetchval("SELECT id FROM dlr.messages")
    assert await db.fetchval("SELECT after_id FROM dlr.forgetting_position") == investigated_id - 1

    # Resolved, its investigation goes with it at the next run.
    await db.execute(
        "UPDATE dlr.exceptions SET resolved_at = now(), resolution = 'checked'"
        " WHERE message_id = $1",
        INVESTIGATED,
    )
    last = await _forget(db, today() + 7 * DAY)
    assert last == Forgotten(messages=1, statuses=1, events=1, closed_exceptions=1)
    assert (await _present(db))["messages"] == set()


async def test_a_receipt_for_a_forgotten_message_is_kept_as_uncorrelated(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _store_of_five(database_url)
    await _forget(db, today() + 3 * DAY)
    store = await Store.open(database_url, pool_size=1)
    try:
        late = _receipt(OLD, 2, "DELIVRD", (today() + 4 * DAY).timestamp(), "late")
        result = await store.ingest(LOGIN, [late])
    finally:
        await store.close()
    assert result.outcomes == [Outcome.UNCORRELATED]
    assert await db.fetchval(
        "SELECT count(*) FROM dlr.exceptions WHERE message_id = $1 AND kind = 'uncorrelated'"
        " AND resolved_at IS NULL",
        OLD,
    )
    assert (
        await db.fetchval("SELECT count(*) FROM dlr.message_status WHERE message_id = $1", OLD) == 0
    )


async def test_a_message_being_written_is_skipped_and_taken_next_time(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _store_of_five(database_url)
    writer = await asyncpg.connect(database_url)
    try:
        # The lock ingest, late correlation and recompute take before they write a status.
        transaction = writer.transaction()
        await transaction.start()
        await writer.execute(
            "SELECT 1 FROM dlr.messages WHERE message_id = $1 FOR NO KEY UPDATE", OLD
        )
        busy = await _forget(db, today() + 3 * DAY)
        await transaction.commit()
    finally:
        await writer.close()
    assert busy.messages == 2  # SILENT and LATE
    assert OLD in (await _present(db))["messages"]
    assert (await _forget(db, today() + 3 * DAY)).messages == 1
    assert OLD not in (await _present(db))["messages"]


async def test_a_status_deleted_otherwise_is_still_a_withdrawal(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _store_of_five(database_url)
    await db.execute(
        "DELETE FROM dlr.statuses AS s USING dlr.messages AS m"
        " WHERE m.id = s.message_ref AND m.message_id = $1",
        OLD,
    )
    withdrawn = await db.fetchrow(
        "SELECT status, previous_status FROM dlr.status_changes WHERE message_id = $1"
        " ORDER BY position DESC LIMIT 1",
        OLD,
    )
    assert withdrawn is not None
    assert (withdrawn["status"], withdrawn["previous_status"]) == (None, "DELIVERED")


@pytest.mark.parametrize(("retention_days", "forget_after_days"), [(None, 30), (30, 30), (30, 10)])
def test_messages_are_never_forgotten_while_their_evidence_is_kept(
    retention_days: int | None, forget_after_days: int
) -> None:
    with pytest.raises(ConfigError, match="--forget-after-days"):
        RetentionPolicy(retention_days=retention_days, forget_after_days=forget_after_days)


async def test_maintain_forgets_and_says_so(database_url: str, db: asyncpg.Connection) -> None:
    ten_days_ago = (today() - 10 * DAY).timestamp()
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions([Submission(LOGIN, OLD, "+34600123456")])
        await store.ingest(LOGIN, [_receipt(OLD, 2, "DELIVRD", ten_days_ago)])
    finally:
        await store.close()
    # As if recorded and delivered ten days ago (the status keeps its content: no change).
    await db.execute("UPDATE dlr.messages SET recorded_at = now() - interval '10 days'")
    await db.execute("UPDATE dlr.statuses SET updated_at = now() - interval '10 days'")
    # Its delivery and its changes went with their days, as the retention drops them (the
    # first partitions, which hold everything before today, drop once today is past the
    # retention).
    await drop_days_before(db, today())
    done = await asyncio.to_thread(
        dlrfeed, "maintain", "--database-url", database_url, "--retention-days", "2",
        "--redelivery-horizon-days", "1", "--forget-after-days", "3", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["forgotten"] == {
        "messages": 1,
        "statuses": 1,
        "events": 1,
        "closed_exceptions": 0,
        "kept_for_open_exceptions": 0,
        "kept_for_evidence": 0,
        "kept_for_changes": 0,
    }
    assert await db.fetchval("SELECT count(*) FROM dlr.messages") == 0


async def test_forgetting_while_the_daemon_ingests_leaves_no_message_half_forgotten(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Every message is old for the pass (its cutoff is tomorrow) while the daemon writes the
    receipts of the same messages: whatever the interleaving, each message is either whole or
    gone, and each receipt is stored - applied to a message that was there, or kept as
    uncorrelated for one that was not."""
    bodies = receipt_bodies(6000, prefix="f")
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600123456") for m in sorted({b["id"] for b in bodies})]
        )
    finally:
        await store.close()
    tomorrow = today() + DAY
    forgotten = Forgotten()
    async with running_gateway() as gateway:
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", "pull"))
        task = asyncio.create_task(daemon.run(), name="daemon-under-test")
        try:
            # The newest messages' receipts first: the ingest walks down the ids while the pass
            # walks up (in the order the messages were recorded), so the two meet on the same
            # messages, and past the meeting point each finds the other's work done.
            await gateway.inject(LOGIN, bodies[::-1])

            async def ingesting() -> bool:
                return int(await db.fetchval("SELECT count(*) FROM dlr.receptions")) > 500

            async def drained() -> bool:
                stats = gateway.stats(LOGIN)
                return stats["queued"] == 0 and stats["in_flight"] == 0

            await wait_until(ingesting, 60, "the daemon to be ingesting")
            # Small batches, so that the pass and the ingest take turns on the same messages.
            while not await drained():
                forgotten.messages += (await forget(db, tomorrow, batch=20)).messages
            await wait_until(drained, 120, "the queue to drain")
        finally:
            daemon.stop()
            code = await asyncio.wait_for(task, 30)
    assert code == 0
    assert forgotten.messages > 0
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == len(bodies)
    # No status outlives its message.
    assert not await db.fetchval(
        "SELECT count(*) FROM dlr.message_status AS s WHERE NOT EXISTS (SELECT 1 FROM"
        " dlr.messages AS m WHERE m.login = s.login AND m.message_id = s.message_id)"
    )
    # An event with no message is one a receipt brought after its message was forgotten: it
    # waits in the investigation queue, as any receipt of an unknown message does.
    assert not await db.fetchval(
        "SELECT count(*) FROM dlr.events AS e"
        " WHERE NOT EXISTS (SELECT 1 FROM dlr.messages AS m"
        "                   WHERE m.login = e.login"
        "                     AND m.message_id = coalesce(e.correlation_id, e.message_id))"
        "   AND NOT EXISTS (SELECT 1 FROM dlr.exceptions AS x WHERE x.event_id = e.id"
        "                   AND x.kind = 'uncorrelated' AND x.resolved_at IS NULL)"
    )
    assert not await db.fetchval("SELECT count(*) FROM dlr.status_changes WHERE status IS NULL")
