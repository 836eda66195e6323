"""The status-change log against a real PostgreSQL: what is recorded, the gap-free horizon
under racing writers, the follower, named cursors and the effect + cursor transaction."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

import asyncpg
import pytest
import structlog

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission
from dlrfeed.store.changes import (
    FollowTiming,
    StatusChange,
    consume_changes,
    follow_changes,
    load_cursor,
    read_changes,
    save_cursor,
)
from dlrfeed_tools.pgbouncer import PgBouncer
from dlrfeed_tools.pgcluster import PgCluster, free_port, scratch_directory
from dlrfeed_tools.rule_receipts import feed_receipt

LOGIN = "acme"


def receipt(
    message_id: str, level: int = 2, stat: str = "DELIVRD", done_date: str | None = "2611291200"
) -> Receipt:
    """A receipt as the feed adapter builds it, the serialized proto as `raw`."""
    return feed_receipt(
        message_id,
        level,
        stat,
        ack_token=f"tok-{message_id}-{level}",
        received_at=time.time(),
        done_date=done_date,
        submit_date="2611291159",
    )


async def _all_changes(conn: asyncpg.Connection) -> list[StatusChange]:
    """Every exposed change, read page by page the way a consumer does."""
    found: list[StatusChange] = []
    while batch := await read_changes(conn, found[-1].position if found else 0, limit=7):
        found += batch
    return found


async def _held_statuses(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch("SELECT message_id, status FROM dlr.message_status")
    return {r["message_id"]: r["status"] for r in rows}


async def _until(condition: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    """Wait for `condition` with a generous bound (polled: it is a database state)."""
    deadline = time.monotonic() + seconds
    for _ in itertools.count():
        if await condition():
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _record(store: Store, *message_ids: str) -> None:
    await store.record_submissions(
        [Submission(login=LOGIN, message_id=m, destination="+34600000001") for m in message_ids]
    )


async def test_first_status_then_a_real_change_then_repeats_that_write_nothing(
    store: Store, db: asyncpg.Connection
) -> None:
    """One row per real change; the first has no previous status; a repeat writes nothing."""
    await _record(store, "m1")
    await store.ingest(LOGIN, [receipt("m1", level=1, stat="ENROUTE", done_date=None)])
    await store.ingest(LOGIN, [receipt("m1", level=1, stat="ENROUTE", done_date=None)])
    await store.ingest(LOGIN, [receipt("m1")])
    await store.ingest(LOGIN, [receipt("m1"), receipt("m1", level=1, stat="ENROUTE")])
    changes = await _all_changes(db)
    assert [(c.previous_status, c.status, c.is_final) for c in changes] == [
        (None, "ENROUTE", False),
        ("ENROUTE", "DELIVERED", True),
    ]
    assert changes[0].position < changes[1].position
    status = await db.fetchrow(
        "SELECT status, reason, supporting_event_id FROM dlr.message_status WHERE message_id = 'm1'"
    )
    assert status is not None
    assert (changes[-1].status, changes[-1].reason, changes[-1].supporting_event_id) == tuple(
        status.values()
    )
    assert changes[1].previous_reason == changes[0].reason
    assert changes[0].rules_version


async def test_late_correlation_writes_its_change_too(store: Store, db: asyncpg.Connection) -> None:
    """A receipt that waited uncorrelated (P12) is applied by record_submissions: logged."""
    await store.ingest(LOGIN, [receipt("late")])
    assert await _all_changes(db) == []
    await _record(store, "late")
    [change] = await _all_changes(db)
    assert (change.message_id, change.status, change.previous_status) == (
        "late",
        "DELIVERED",
        None,
    )


async def test_a_rewrite_that_keeps_the_status_writes_no_change(
    store: Store, db: asyncpg.Connection
) -> None:
    """Only status, is_final or reason count as a change (counters and timestamps do not), and
    a reason is what it reads, whether a row holds its text or its id (the dictionary full)."""
    await _record(store, "m1")
    await store.ingest(LOGIN, [receipt("m1")])
    await db.execute("UPDATE dlr.statuses SET repeats = repeats + 1, updated_at = now()")
    # The same reason as text, as a row holds it when the dictionary is full.
    await db.execute(
        "UPDATE dlr.statuses SET reason = dlr.reason_text(reason, reason_id), reason_id = NULL"
    )
    await db.execute("UPDATE dlr.statuses SET reason = 'edited by hand', reason_id = NULL")
    changes = await _all_changes(db)
    assert [c.reason for c in changes][1:] == ["edited by hand"]


# -- the horizon ---------------------------------------------------------------------------

_MESSAGE_ROW = """
INSERT INTO dlr.messages (login, message_id, internal_id, destination, destination_raw,
    destination_is_e164)
VALUES ($1, $2, $2, '+34600000000', '+34600000000', true)
ON CONFLICT (login, message_id) DO NOTHING
"""
_STATUS_ROW = """
INSERT INTO dlr.statuses AS s (message_ref, status, is_final, reason, supporting_event_id,
    rules_version)
SELECT m.id, $3, false, $3, 0, 'test' FROM dlr.messages AS m
WHERE m.login = $1 AND m.message_id = $2
ON CONFLICT (message_ref) DO UPDATE SET status = EXCLUDED.status, reason = EXCLUDED.reason
"""


async def _write_status(conn: asyncpg.Connection, login: str, message_id: str, status: str) -> None:
    """The status of `message_id` written by hand (its message recorded first if need be), its
    reason the status's name."""
    await conn.execute(_MESSAGE_ROW, login, message_id)
    await conn.execute(_STATUS_ROW, login, message_id, status)


async def _begin_with_xid(conn: asyncpg.Connection) -> int:
    await conn.execute("BEGIN")
    return int(await conn.fetchval("SELECT pg_current_xact_id()::text::bigint"))


async def test_a_change_committed_later_with_a_smaller_position_is_never_skipped(
    database_url: str, db: asyncpg.Connection
) -> None:
    """The outbox gap, staged with three held transactions: the oldest (A) stays open while
    two newer ones commit; nothing is exposed past A until it commits, and then in an order
    in which nothing already read is preceded by something new."""
    a, b, c = [await asyncpg.connect(database_url) for _ in range(3)]
    try:
        xid_a = await _begin_with_xid(a)
        xid_b = await _begin_with_xid(b)
        xid_c = await _begin_with_xid(c)
        assert xid_a < xid_b < xid_c
        await _write_status(c, LOGIN, "mc", "ENROUTE")
        await c.execute("COMMIT")  # the newest commits first
        seen = await _all_changes(db)
        assert seen == []  # held behind A and B
        await _write_status(b, LOGIN, "mb", "ENROUTE")
        await b.execute("COMMIT")
        assert await _all_changes(db) == []  # still held behind A
        await _write_status(a, LOGIN, "ma", "ENROUTE")
        # A, the oldest, now writes the message C changed: its change must come after C's.
        await _write_status(a, LOGIN, "mc", "DELIVERED")
        await a.execute("COMMIT")
        changes = await _all_changes(db)
    finally:
        for conn in (a, b, c):
            await conn.close()
    assert [(c.message_id, c.status) for c in changes if c.message_id == "mc"] == [
        ("mc", "ENROUTE"),
        ("mc", "DELIVERED"),
    ]
    assert {c.message_id for c in changes} == {"ma", "mb", "mc"}
    assert [c.position for c in changes] == sorted({c.position for c in changes})


async def test_three_racing_writers_and_a_follower_see_every_change_once_in_order(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Three writer connections change overlapping messages in transactions of random length
    (seeded), some held open while others commit; a follower started before them must see
    exactly the changes a full re-read sees, each once, positions strictly increasing, and
    per message a chain in which each change starts from the previous one's status."""
    rng = random.Random(17)
    messages = [f"r{i}" for i in range(12)]
    statuses = ["ACCEPTED", "ENROUTE", "DELIVERED", "UNDELIVERABLE"]
    stop = asyncio.Event()
    followed: list[StatusChange] = []

    async def follower() -> None:
        timing = FollowTiming(listen_poll=0.5, fallback_poll=0.05, held_back_retry=0.01)
        async for batch in follow_changes(database_url, 0, limit=5, stop=stop, timing=timing):
            followed.extend(batch)

    async def writer(seed: int) -> None:
        local = random.Random(seed)
        conn = await asyncpg.connect(database_url)
        try:
            for _ in range(40):
                async with conn.transaction():
                    await conn.execute("SELECT pg_current_xact_id()")  # take an xid early
                    await asyncio.sleep(local.random() * 0.01)
                    for message_id in sorted(local.sample(messages, 3)):
                        await _write_status(conn, LOGIN, message_id, local.choice(statuses))
                    await asyncio.sleep(local.random() * 0.01)
        finally:
            await conn.close()

    following = asyncio.create_task(follower(), name="follower")
    await asyncio.gather(*(writer(rng.randrange(1 << 30)) for _ in range(3)))
    reread = await _all_changes(db)

    async def caught_up() -> bool:
        return len(followed) >= len(reread)

    await _until(caught_up)
    stop.set()
    await following
    assert followed == reread
    positions = [c.position for c in followed]
    assert positions == sorted(set(positions))
    last: dict[str, StatusChange] = {}
    for change in followed:
        before = last.get(change.message_id)
        assert change.previous_status == (before.status if before else None), change
        last[change.message_id] = change
    held = await _held_statuses(db)
    assert {m: c.status for m, c in last.items()} == held


async def test_three_racing_stores_nothing_missed_or_repeated(database_url: str) -> None:
    """Three Store instances ingest overlapping receipts at once (P16 row locks, real rules):
    the log holds one change chain per message ending at its status."""
    message_ids = [f"s{i}" for i in range(60)]
    stores = [await Store.open(database_url, pool_size=1) for _ in range(3)]
    try:
        await _record(stores[0], *message_ids)
        rng = random.Random(3)
        work = [
            receipt(m, level=level, stat=stat, done_date=done)
            for m in message_ids
            for level, stat, done in ((1, "ENROUTE", "2611291200"), (2, "DELIVRD", "2611291201"))
        ]

        async def ingest(store: Store, share: list[Receipt]) -> None:
            for start in range(0, len(share), 10):
                await store.ingest(LOGIN, share[start : start + 10])

        await asyncio.gather(
            *(ingest(s, rng.sample(work, len(work))) for s in stores)  # each its own order
        )
    finally:
        for store in stores:
            await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        changes = await _all_changes(conn)
        held = await _held_statuses(conn)
    finally:
        await conn.close()
    last: dict[str, StatusChange] = {}
    for change in changes:
        before = last.get(change.message_id)
        assert change.previous_status == (before.status if before else None)
        last[change.message_id] = change
    assert {m: c.status for m, c in last.items()} == held
    assert set(held) == set(message_ids)


# -- cursors and the effect + cursor transaction -------------------------------------------


async def test_named_cursor_moves_forward_only(db: asyncpg.Connection) -> None:
    assert await load_cursor(db, "billing") == 0
    await save_cursor(db, "billing", 50)
    await save_cursor(db, "billing", 20)
    assert await load_cursor(db, "billing") == 50


async def test_effect_and_cursor_commit_together_exactly_once(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """docs/changes.md pattern: a consumer writing to the same PostgreSQL. A handler that
    fails after writing its effect leaves neither effect nor cursor; two instances of the
    consumer racing each apply disjoint batches; every change takes effect exactly once."""
    await db.execute(
        "CREATE TABLE public.billing (position numeric PRIMARY KEY, message_id text, status text)"
    )
    ids = [f"b{i}" for i in range(30)]
    await _record(store, *ids)
    await store.ingest(LOGIN, [receipt(m) for m in ids])

    async def bill(conn: asyncpg.Connection, changes: Sequence[StatusChange]) -> None:
        await conn.executemany(
            "INSERT INTO public.billing VALUES ($1, $2, $3)",
            [(c.position, c.message_id, c.status) for c in changes],
        )

    async def crash_after_effect(conn: asyncpg.Connection, changes: Sequence[StatusChange]) -> None:
        await bill(conn, changes)
        raise RuntimeError("consumer crashed before its commit")

    with pytest.raises(RuntimeError):
        await consume_changes(db, "billing", crash_after_effect, limit=5)
    assert await db.fetchval("SELECT count(*) FROM public.billing") == 0
    assert await load_cursor(db, "billing") == 0

    async def instance() -> int:
        conn = await asyncpg.connect(database_url)
        try:
            handled = 0
            while n := await consume_changes(conn, "billing", bill, limit=4):
                handled += n
            return handled
        finally:
            await conn.close()

    counts = await asyncio.gather(instance(), instance())
    assert sum(counts) == 30
    billed = await db.fetch("SELECT position, message_id FROM public.billing ORDER BY position")
    assert sorted(r["message_id"] for r in billed) == sorted(ids)
    assert await load_cursor(db, "billing") == int(billed[-1]["position"])


# -- following -------------------------------------------------------------------------------


_FOLLOWER_WAITING = """
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
               AND state = 'idle' AND query LIKE '%position >= pg_snapshot_xmin%')
"""


async def test_follower_is_woken_by_the_commit_not_by_its_poll(
    store: Store, database_url: str
) -> None:
    """With a 60 s safety poll, only NOTIFY can deliver a commit within the bound; the
    latency is printed (measured, not asserted: docs/changes.md quotes it)."""
    await _record(store, "w1")
    stop = asyncio.Event()
    got: list[tuple[float, StatusChange]] = []
    ready, arrived = asyncio.Event(), asyncio.Event()

    async def follower() -> None:
        timing = FollowTiming(listen_poll=60, fallback_poll=60)
        ready.set()
        async for batch in follow_changes(database_url, 0, stop=stop, timing=timing):
            got.extend((time.perf_counter(), c) for c in batch)
            arrived.set()

    task = asyncio.create_task(follower(), name="follower")
    await ready.wait()
    probe = await asyncpg.connect(database_url)
    try:  # until the follower has read, found nothing, and waits (its last query is idle)

        async def waiting() -> bool:
            return bool(await probe.fetchval(_FOLLOWER_WAITING))

        await _until(waiting)
    finally:
        await probe.close()
    started = time.perf_counter()
    await store.ingest(LOGIN, [receipt("w1")])
    committed = time.perf_counter()
    async with asyncio.timeout(20):
        await arrived.wait()
    stop.set()
    await task
    print(
        f"ingest call -> follower: {1000 * (got[0][0] - started):.1f} ms, of which after the "
        f"ingest returned: {1000 * (got[0][0] - committed):.1f} ms"
    )
    assert got[0][1].message_id == "w1"


# -- the command -------------------------------------------------------------------------------


def _changes_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlrfeed.cli", "changes", "--database-url", database_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")},
    )


async def test_changes_command_after_limit_json_and_a_named_consumer(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    """`dlrfeed changes`: JSON lines with the contract's keys; --limit, --after; --consumer
    resumes where the last run of that consumer stopped and records its place."""
    await _record(store, "c1", "c2", "c3")
    for message_id in ("c1", "c2", "c3"):
        await store.ingest(LOGIN, [receipt(message_id)])
    full = _changes_cli(database_url, "--json")
    assert full.returncode == 0, full.stderr
    lines = [json.loads(line) for line in full.stdout.splitlines()]
    assert [line["message_id"] for line in lines] == ["c1", "c2", "c3"]
    assert set(lines[0]) >= {
        "position", "login", "message_id", "status", "is_final", "previous_status", "reason",
        "changed_at",
    }  # fmt: skip
    limited = _changes_cli(database_url, "--json", "--limit", "2").stdout.splitlines()
    assert [json.loads(line) for line in limited] == lines[:2]
    after = _changes_cli(database_url, "--json", "--after", str(lines[0]["position"]))
    assert [json.loads(line) for line in after.stdout.splitlines()] == lines[1:]
    first = _changes_cli(database_url, "--consumer", "ops", "--limit", "2").stdout.splitlines()
    assert len(first) == 2
    assert "-> DELIVERED (final)" in first[0]
    rest = _changes_cli(database_url, "--json", "--consumer", "ops").stdout.splitlines()
    assert [json.loads(line) for line in rest] == lines[2:]
    assert await load_cursor(db, "ops") == lines[-1]["position"]


async def test_changes_on_a_database_never_migrated_is_one_line_exit_78(
    pg_cluster: PgCluster,
) -> None:
    dsn = await pg_cluster.create_database(f"unmigrated_{os.getpid()}")
    try:
        result = _changes_cli(dsn)
    finally:
        await pg_cluster.drop_database(f"unmigrated_{os.getpid()}")
    assert result.returncode == 78
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("dlrfeed: database schema is at version 0, this dlrfeed needs ")
    assert line.endswith(": run `dlrfeed migrate`")


# -- through a transaction pooler --------------------------------------------------------------


@pytest.fixture
def transaction_pooler(pg_cluster: PgCluster, database_url: str) -> Iterator[str]:
    """PgBouncer in transaction mode in front of the test database; yields its DSN."""
    pooler = PgBouncer(scratch_directory("pgbouncer"), free_port(), pg_cluster.port, pool_size=2)
    pooler.start()
    try:
        yield pooler.dsn_for(database_url.rsplit("/", 1)[1])
    finally:
        pooler.stop()
        shutil.rmtree(pooler.root, ignore_errors=True)


async def test_follower_through_a_transaction_pooler_polls_and_says_so_once(
    store: Store, transaction_pooler: str
) -> None:
    """Through PgBouncer in transaction mode LISTEN cannot deliver: the follower logs one
    `changes_listen_unavailable` line, polls, and still sees every commit."""
    await _record(store, "p1", "p2")
    stop = asyncio.Event()
    got: list[StatusChange] = []
    arrived = asyncio.Event()

    async def follower() -> None:
        timing = FollowTiming(listen_poll=60, fallback_poll=0.05)
        async for batch in follow_changes(transaction_pooler, 0, stop=stop, timing=timing):
            got.extend(batch)
            if len(got) >= 2:
                arrived.set()

    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(follower(), name="follower")
        await store.ingest(LOGIN, [receipt("p1")])
        await asyncio.sleep(0.3)
        await store.ingest(LOGIN, [receipt("p2")])
        async with asyncio.timeout(30):
            await arrived.wait()
        stop.set()
        await task
    assert [c.message_id for c in got] == ["p1", "p2"]
    unavailable = [e for e in logs if e["event"] == "changes_listen_unavailable"]
    assert len(unavailable) == 1
    assert unavailable[0]["mode"] == "polling"


# -- a status withdrawn ------------------------------------------------------------------------


async def test_a_deleted_status_is_one_change_with_a_null_status_in_the_messages_order(
    database_url: str, db: asyncpg.Connection
) -> None:
    """A DELETE of status rows writes one change per row: status null,
    is_final false, the deleted status as previous; outside a recompute the reason is the
    fixed text and the rules version the row's. Its position follows the message's previous
    change even when the deleting transaction's id is older (the epoch is raised), and the
    message's last change is its status, or null when it has none."""
    await _write_status(db, LOGIN, "d1", "ENROUTE")
    await _write_status(db, LOGIN, "d2", "ACCEPTED")
    old = await asyncpg.connect(database_url)
    try:
        old_xid = await _begin_with_xid(old)  # an id older than the next change's
        await _write_status(db, LOGIN, "d1", "DELIVERED")
        await old.execute(
            "DELETE FROM dlr.statuses AS s USING dlr.messages AS m WHERE m.id = s.message_ref"
            " AND m.login = $1 AND m.message_id = ANY($2::text[])",
            LOGIN,
            ["d1", "d2"],
        )
        await old.execute("COMMIT")
    finally:
        await old.close()
    await db.execute(  # no row
        "DELETE FROM dlr.statuses AS s USING dlr.messages AS m"
        " WHERE m.id = s.message_ref AND m.message_id = 'none'"
    )
    changes = await _all_changes(db)
    withdrawn = sorted((c for c in changes if c.status is None), key=lambda c: c.message_id)
    assert [(c.message_id, c.previous_status, c.previous_reason) for c in withdrawn] == [
        ("d1", "DELIVERED", "DELIVERED"),
        ("d2", "ACCEPTED", "ACCEPTED"),
    ]
    for change in withdrawn:
        assert change.is_final is False
        assert change.reason == "withdrawn: no computed status any more"
        assert change.rules_version == "test"
        assert change.supporting_event_id == 0
    d1 = [c for c in changes if c.message_id == "d1"]
    assert [c.status for c in d1] == ["ENROUTE", "DELIVERED", None]
    assert d1[-1].position // 10**19 > old_xid  # raised to the DELIVERED change's epoch
    await _write_status(db, LOGIN, "d1", "DELIVERED")  # a status again: a first change
    changes = await _all_changes(db)
    assert (changes[-1].message_id, changes[-1].previous_status) == ("d1", None)
    last = {c.message_id: c.status for c in changes}
    held = await _held_statuses(db)
    assert last == {m: held.get(m) for m in last}
    assert set(held) <= set(last)


async def test_a_first_status_after_a_withdrawal_follows_it_even_from_an_older_transaction(
    database_url: str, db: asyncpg.Connection
) -> None:
    """A message withdrawn (its status row deleted) and given a status again by a transaction
    whose id is older than the withdrawal's: the new first change still comes after the
    withdrawal (its epoch is taken from the log's withdrawals)."""
    await _write_status(db, LOGIN, "w1", "ENROUTE")
    old = await asyncpg.connect(database_url)
    try:
        old_xid = await _begin_with_xid(old)  # older than the withdrawal's
        await db.execute(
            "DELETE FROM dlr.statuses AS s USING dlr.messages AS m"
            " WHERE m.id = s.message_ref AND m.message_id = 'w1'"
        )
        await _write_status(old, LOGIN, "w1", "DELIVERED")
        await old.execute("COMMIT")
    finally:
        await old.close()
    w1 = [c for c in await _all_changes(db) if c.message_id == "w1"]
    assert [(c.status, c.previous_status) for c in w1] == [
        ("ENROUTE", None),
        (None, "ENROUTE"),
        ("DELIVERED", None),
    ]
    assert w1[-1].position // 10**19 > old_xid  # raised to the withdrawal's epoch


async def test_a_writers_search_path_cannot_bend_a_changes_position(
    database_url: str, db: asyncpg.Connection
) -> None:
    """A writer session that shadows `text` with a temporary type (searched before pg_catalog)
    still writes each change at or above its own transaction id (the row trigger keeping the
    change epoch names every type by its schema)."""
    await _write_status(db, LOGIN, "t1", "ENROUTE")
    writer = await asyncpg.connect(database_url)
    try:
        xid = await _begin_with_xid(writer)  # before the type that would bend this too
        await writer.execute("CREATE DOMAIN pg_temp.text AS varchar(1)")
        await _write_status(writer, LOGIN, "t1", "DELIVERED")
        await _write_status(writer, LOGIN, "t2", "ENROUTE")
        await writer.execute("COMMIT")
    finally:
        await writer.close()
    changes = await _all_changes(db)
    written = [
        c for c in changes if (c.message_id, c.status) in {("t1", "DELIVERED"), ("t2", "ENROUTE")}
    ]
    assert len(written) == 2
    assert all(c.position // 10**19 >= xid for c in written)
    assert [c.status for c in changes if c.message_id == "t1"] == ["ENROUTE", "DELIVERED"]


async def test_a_correction_of_the_reason_alone_is_marked_and_billed_never(
    store: Store, db: asyncpg.Connection
) -> None:
    """P23: a final whose reason alone is rewritten (here: a status row in an older rules
    version's wording, then recomputed) gives changes marked `reason_only`; the billing consumer
    of docs/changes.md bills the message once."""
    await store.record_submissions([Submission(LOGIN, "m", "+34600000001")])
    await store.ingest(LOGIN, [receipt("m")])
    await db.execute(
        "UPDATE dlr.statuses SET reason = reason_text || '; it supersedes an UNKNOWN result', "
        "reason_id = NULL, rules_version = 'rules-2' "
        "FROM (SELECT dlr.reason_text(reason, reason_id) AS reason_text FROM dlr.statuses) AS r"
    )
    assert (await store.recompute()).changed == 1
    found = await _all_changes(db)
    assert [(c.previous_status, c.status, c.reason_only) for c in found] == [
        (None, "DELIVERED", False),
        ("DELIVERED", "DELIVERED", True),
        ("DELIVERED", "DELIVERED", True),
    ]
    assert found[-1].reason == found[0].reason
    assert [json.loads(json.dumps(c.to_json()))["reason_only"] for c in found] == [
        False,
        True,
        True,
    ]
    assert [billing_kind(c) for c in found] == ["final", None, None]


def billing_kind(c: StatusChange) -> str | None:
    """The billing consumer of docs/changes.md, as written there."""
    if c.is_final and not c.previous_is_final:
        return "final"
    if c.is_final and c.status != c.previous_status:
        return "corrected"
    if c.status is None and c.previous_is_final:
        return "withdrawn"
    return None
