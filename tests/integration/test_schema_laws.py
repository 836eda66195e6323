"""What the schema itself holds, whoever writes to it (src/dlrfeed/store/migrations/
0001_baseline.sql), against the real server.

- An event that arrives before its message waits in dlr.event_rows; recording the message, by
  any writer, moves it - the same row, the same id - under the message, probing the waiting
  room once per message whatever its statistics say; an exception names a stored event only.
- A message's row id never changes (its status and events are kept under it).
- The reasons: each wording once in a bounded, append-only dictionary; a status names only an
  id it gave, in one form; what the dictionary does not take stays as text in the row.
- The change log: a withdrawal names its message itself; the writers' lookup of a message's
  latest withdrawal is an index probe, however many changes a day holds.
- An event delivered once keeps no last reception time.
- Forgetting waits for every row that names a message by reference (a delivery, a change).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed.store.reports import message_reports
from dlrfeed.store.retention import forget
from dlrfeed.store.transactions import write_transaction
from dlrfeed_tools import rule_receipts
from dlrfeed_tools.bench.growth_traffic import Traffic
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.retention_support import DAY, drop_days_before, plan_of, receipt, today

# The events kept in each table.
_KINDS = """
SELECT (SELECT count(*) FROM dlr.event_rows) AS waiting,
       (SELECT count(*) FROM dlr.message_events) AS by_message
"""


async def test_recording_a_message_moves_its_early_event_under_it(
    store: Store, db: asyncpg.Connection
) -> None:
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt("early", now)])
    event_id = await db.fetchval("SELECT id FROM dlr.event_rows WHERE message_id = 'early'")

    result = await store.record_submissions([Submission(LOGIN, "early", "+34600000001")])
    await store.ingest(LOGIN, [receipt("early", now + 1)])  # its redelivery

    assert result.late_correlated_events == 1
    assert await db.fetchval("SELECT count(*) FROM dlr.event_rows") == 0
    moved = await db.fetchrow(
        "SELECT e.id, e.times_received, e.correlation_id, m.message_id"
        " FROM dlr.message_events AS e JOIN dlr.messages AS m ON m.id = e.message_ref"
    )
    assert moved is not None
    assert tuple(moved) == (event_id, 2, None, "early")
    outcomes = await db.fetch("SELECT outcome FROM dlr.receptions ORDER BY id")
    assert [r[0] for r in outcomes][-1] == "repeat"
    status = await db.fetchval("SELECT status FROM dlr.message_status WHERE message_id = 'early'")
    assert status == "DELIVERED"


async def test_a_message_recorded_by_any_writer_takes_its_early_events(
    store: Store, db: asyncpg.Connection
) -> None:
    """The move is the database's (a trigger of dlr.messages), not only this Store's: a message
    recorded by a plain INSERT takes its early events as well, so a later redelivery still
    finds its event."""
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt("by-hand", now)])
    await db.execute(
        "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
        " destination_raw, destination_is_e164) VALUES ($1, 'by-hand', 'i', '+1', '+1', true)",
        LOGIN,
    )
    await store.ingest(LOGIN, [receipt("by-hand", now + 1)])
    rows = await db.fetch("SELECT times_received FROM dlr.events WHERE message_id = 'by-hand'")
    assert [r[0] for r in rows] == [2]
    assert await db.fetchval("SELECT count(*) FROM dlr.message_events") == 1


async def test_recording_probes_the_early_events_once_per_message_whatever_the_statistics(
    store: Store, db: asyncpg.Connection
) -> None:
    """dlr.event_rows churns (each early event is inserted, then moved), so its statistics can
    say it is nearly empty while it holds many waiting events. Recording a chunk of messages
    still probes its key once per message, not once per message and waiting event, and moves
    exactly the early events of the messages recorded."""
    now = datetime.now(UTC).timestamp()
    await store.ingest(LOGIN, [receipt(f"gone-{n}", now) for n in range(300)])
    await store.record_submissions(
        [Submission(LOGIN, f"gone-{n}", "+34600000001") for n in range(300)]
    )
    await db.execute("ANALYZE dlr.event_rows")  # every row it held was moved: "empty"
    await store.ingest(LOGIN, [receipt(f"early-{n}", now) for n in range(200)])
    recorded = [f"early-{n}" for n in range(0, 200, 2)] + [f"new-{n}" for n in range(400)]
    async with write_transaction(db):
        await db.execute(
            "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
            " destination_raw, destination_is_e164)"
            " SELECT $1, m, m, '+1', '+1', true FROM unnest($2::text[]) AS m",
            LOGIN,
            recorded,
        )
        probes = await db.fetchval(
            "SELECT pg_stat_get_xact_numscans('dlr.events_login_message_id_level_key'::regclass)"
        )
    assert probes == len(recorded)
    kinds = await db.fetchrow(_KINDS)
    assert kinds is not None
    assert tuple(kinds) == (100, 300 + 100)


async def test_an_exception_names_a_stored_event_only(db: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.exceptions.ForeignKeyViolationError):
        await db.execute(
            "INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id)"
            " VALUES ('conflict', $1, 'nowhere', '{}', 424242)",
            LOGIN,
        )


async def test_a_message_id_never_changes(db: asyncpg.Connection) -> None:
    """Its status is kept under it; the writer's UPDATE on it is for the row lock alone."""
    await db.execute(
        "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
        " destination_raw, destination_is_e164) VALUES ('l', 'm', 'i', 'd', 'd', false)"
    )
    # An identity column is only ever redrawn from its sequence; that is refused too.
    with pytest.raises(asyncpg.RaiseError, match="does not change"):
        await db.execute("UPDATE dlr.messages SET id = DEFAULT")
    assert await db.fetchval("SELECT id FROM dlr.messages FOR NO KEY UPDATE") == 1


async def test_an_id_names_its_text_for_good(db: asyncpg.Connection) -> None:
    await db.execute("INSERT INTO dlr.reasons (reason) VALUES ('a reason')")
    for statement in (
        "UPDATE dlr.reasons SET reason = 'another'",
        "DELETE FROM dlr.reasons",
        "TRUNCATE dlr.reasons",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="only grows"):
            await db.execute(statement)
    assert await db.fetchval("SELECT reason FROM dlr.reasons") == "a reason"


async def test_the_dictionary_stops_at_its_bound_whatever_one_call_brings(
    db: asyncpg.Connection,
) -> None:
    await db.execute("SELECT setval('dlr.reasons_id_seq', 99998)")
    added = await db.fetch(
        "SELECT reason, id FROM dlr.reason_ids(ARRAY['a', 'b', 'c', 'd']) ORDER BY id"
    )
    assert [tuple(r) for r in added] == [("a", 99999), ("b", 100000)]


async def test_reasons_the_dictionary_does_not_take_are_kept_in_the_row(
    database_url: str, db: asyncpg.Connection
) -> None:
    long_err = "e" * 1500  # a reason over the dictionary's 1,000 bytes
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600000001") for m in ("long", "short", "closed")]
        )
        await store.ingest(LOGIN, [rule_receipts.receipt("long", 2, "UNDELIV", err=long_err)])
        await store.ingest(LOGIN, [rule_receipts.receipt("short", 2, "UNDELIV", err="001")])
        # A dictionary at its bound takes no new text.
        await db.execute("SELECT setval('dlr.reasons_id_seq', 100000)")
        await store.ingest(LOGIN, [rule_receipts.receipt("closed", 2, "UNDELIV", err="002")])
    finally:
        await store.close()
    stored = {
        r["message_id"]: (r["reason"], r["reason_id"])
        for r in await db.fetch(
            "SELECT m.message_id, c.reason, c.reason_id FROM dlr.status_change_rows AS c"
            " JOIN dlr.messages AS m ON m.id = c.message_ref"
        )
    }
    shown = {
        r["message_id"]: r["reason"]
        for r in await db.fetch("SELECT message_id, reason FROM dlr.status_changes")
    }
    statuses = {
        r["message_id"]: r["reason"]
        for r in await db.fetch("SELECT message_id, reason FROM dlr.message_status")
    }
    assert shown == statuses
    assert long_err in shown["long"]
    assert stored["long"] == (shown["long"], None)
    assert stored["short"][0] is None
    assert stored["short"][1] is not None
    assert stored["closed"] == (shown["closed"], None)


async def test_a_repeatable_read_writer_keeps_a_text_added_after_its_snapshot_in_its_row(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Without the fallback, the dictionary's ON CONFLICT would fail to serialize on the
    other's text. The status writes resolve reasons as here (dlr.reason_ids), and keep a text
    with no id in the row."""
    ids = "SELECT reason, id FROM dlr.reason_ids(ARRAY['new wording'])"
    late = await asyncpg.connect(database_url)
    try:
        async with late.transaction(isolation="repeatable_read"):
            await late.fetchval("SELECT 1")  # its snapshot, taken before the other's commit
            assert len(await db.fetch(ids)) == 1
            assert await late.fetch(ids) == []
    finally:
        await late.close()
    assert [tuple(r) for r in await db.fetch(ids)] == [
        ("new wording", await db.fetchval("SELECT max(id) FROM dlr.reasons"))
    ]


async def test_a_traffic_s_statuses_name_a_few_reasons(
    db: asyncpg.Connection, store: Store
) -> None:
    """The traffic's every status written by id, its wordings a handful of dictionary rows."""
    traffic = Traffic(seed=5)
    await store.record_submissions(traffic.submissions())
    for index in range(4):
        await store.ingest(LOGIN, traffic.batch(index))
    forms = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE reason_id IS NULL) AS by_text, count(*) AS rows"
        " FROM dlr.statuses"
    )
    assert forms is not None
    assert forms["rows"] > 100
    assert forms["by_text"] == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.reasons") <= 4


async def test_a_status_names_only_an_id_the_dictionary_gave_and_one_form(
    db: asyncpg.Connection, store: Store
) -> None:
    """An id not yet drawn would make its logged change read whatever text it is given later;
    a text beside an id would hide it."""
    traffic = Traffic(seed=6)
    await store.record_submissions(traffic.submissions())
    await store.ingest(LOGIN, traffic.batch(0))
    with pytest.raises(asyncpg.RaiseError, match="does not hold"):
        await db.execute(
            "UPDATE dlr.statuses SET reason_id = 1 + (SELECT max(id) FROM dlr.reasons)"
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("UPDATE dlr.statuses SET reason = 'and a text'")


async def test_a_withdrawal_keeps_its_login_and_message_id(
    store: Store, db: asyncpg.Connection
) -> None:
    await store.record_submissions([Submission(LOGIN, "w1", "+34600000001")])
    await store.ingest(LOGIN, [receipt("w1", datetime.now(UTC).timestamp())])
    await db.execute(
        "DELETE FROM dlr.statuses AS s USING dlr.messages AS m"
        " WHERE m.id = s.message_ref AND m.message_id = 'w1'"
    )
    rows = await db.fetch(
        "SELECT status, login, message_id, message_ref FROM dlr.status_change_rows"
        " ORDER BY position"
    )
    ref = await db.fetchval("SELECT id FROM dlr.messages WHERE message_id = 'w1'")
    assert [tuple(r) for r in rows] == [("DELIVERED", None, None, ref), (None, LOGIN, "w1", None)]
    shown = await db.fetch("SELECT status, login, message_id FROM dlr.status_changes")
    assert [tuple(r) for r in shown] == [("DELIVERED", LOGIN, "w1"), (None, LOGIN, "w1")]


async def test_the_withdrawal_lookup_probes_its_index_not_the_days_changes(
    db: asyncpg.Connection,
) -> None:
    """A log of 200,000 changes today, none a withdrawal: the writers' lookup of a message's
    latest withdrawal (dlr.latest_withdrawal) still reads the day's partial index of
    withdrawals, never the day's changes. The changes and the lookup's two hours are at noon,
    so that they lie in today's partition alone at whatever time the test runs (an hour either
    side of midnight would reach into a neighbour day, empty, which a scan reads for nothing)."""
    noon = today() + timedelta(hours=12)
    await db.execute(
        "INSERT INTO dlr.status_change_rows (position, changed_at, login, message_id, status,"
        " is_final, reason, supporting_event_id, rules_version)"
        " SELECT g, $2, $1, md5(g::text), 'ENROUTE', false, 'r', 1, 'v'"
        " FROM generate_series(1, 200000) AS g",
        LOGIN,
        noon,
    )
    await db.execute("ANALYZE dlr.status_change_rows")
    plan = await plan_of(
        db,
        "SELECT max(position) FROM dlr.status_change_rows"
        " WHERE login = $1 AND message_id = 'm10' AND status IS NULL"
        " AND changed_at >= $2 AND changed_at < $3",
        LOGIN,
        noon - timedelta(hours=1),
        noon + timedelta(hours=1),
    )
    assert "Seq Scan" not in plan, plan
    assert "_withdrawn" in plan, plan


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


async def test_forgetting_waits_for_a_change_kept_for_a_consumer(
    store: Store, db: asyncpg.Connection
) -> None:
    """The message's evidence is gone, but the day of its status change is kept (a consumer
    has not read it): the pass keeps the message, and forgets it once that day is dropped."""
    await store.record_submissions([Submission(LOGIN, "m1", "+34600000001")])
    await store.ingest(LOGIN, [receipt("m1", datetime.now(UTC).timestamp())])
    cutoff = today() + 3 * DAY
    await drop_days_before(db, cutoff, ("reception_rows",))

    kept = await forget(db, cutoff)

    assert (kept.messages, kept.kept_for_changes) == (0, 1)
    shown = await db.fetchrow("SELECT login, message_id FROM dlr.status_changes")
    assert shown is not None
    assert tuple(shown) == (LOGIN, "m1")
    await drop_days_before(db, cutoff, ("status_change_rows",))
    assert (await forget(db, cutoff)).messages == 1
