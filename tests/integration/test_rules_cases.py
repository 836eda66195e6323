"""Each rule of docs/rules.md that a real-world receipt exercises, through the real store.

One test per case: the computed status must not depend on the path the receipts took (P19),
level decides the kind (F4, F13), and nothing is reduced or ordered without a basis.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import asyncpg
import pytest

from dlrfeed.commands.show import render
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.status import Outcome
from dlrfeed.store import Store, Submission
from dlrfeed.store.reports import connect, message_reports, statistics
from dlrfeed_tools.rule_receipts import LOGIN, SUBMITTED, receipt


async def record(store: Store, *message_ids: str) -> None:
    await store.record_submissions(
        [Submission(LOGIN, m, "+34600000001", submitted_at=SUBMITTED) for m in message_ids]
    )


async def status(db: asyncpg.Connection, message_id: str) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT s.*, r.stat AS basis_reception_stat, r.done_date_raw AS basis_reception_done "
        "FROM dlr.message_status AS s "
        "LEFT JOIN dlr.receptions_readable AS r"
        " ON r.login = s.login AND r.id = s.supporting_reception_id "
        "WHERE s.login = $1 AND s.message_id = $2",
        LOGIN,
        message_id,
    )


async def exceptions(db: asyncpg.Connection, message_id: str) -> list[tuple[str, str | None]]:
    rows = await db.fetch(
        "SELECT kind, details FROM dlr.exceptions WHERE message_id = $1 AND resolved_at IS NULL "
        "ORDER BY id",
        message_id,
    )
    return [(r["kind"], json.loads(r["details"]).get("cause")) for r in rows]


async def test_late_correlation_applies_a_batch_in_arrival_order_not_key_order(
    store: Store, db: asyncpg.Connection
) -> None:
    """One batch [level-2 UNDELIV, level-1 DELIVRD]: the same status whether the message was
    recorded before its receipts or after them."""
    await record(store, "before")
    for message_id in ("before", "after"):
        await store.ingest(
            LOGIN, [receipt(message_id, 2, "UNDELIV"), receipt(message_id, 1, "DELIVRD")]
        )
    await record(store, "after")
    for message_id in ("before", "after"):
        row = await status(db, message_id)
        assert row is not None
        assert (row["status"], row["is_final"], row["conflicts"]) == ("UNDELIVERABLE", True, 0)


async def test_a_level_1_final_stat_is_progress_and_the_level_2_result_is_the_result(
    store: Store, db: asyncpg.Connection
) -> None:
    """F4/F13: a level-1 DELIVRD is a flagged progress observation, never final; the level-2
    result that follows is applied, not a conflict."""
    await record(store, "m")
    first = await store.ingest(LOGIN, [receipt("m", 1, "DELIVRD")])
    assert first.outcomes == [Outcome.APPLIED]
    row = await status(db, "m")
    assert row is not None
    assert not row["is_final"]
    assert await exceptions(db, "m") == [("malformed", None)]
    flags = await db.fetchval("SELECT flags FROM dlr.events WHERE message_id = 'm'")
    assert "level_stat_mismatch" in flags
    second = await store.ingest(LOGIN, [receipt("m", 2, "UNDELIV", done_date="2611291210")])
    assert second.outcomes == [Outcome.APPLIED]
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["is_final"], row["conflicts"]) == ("UNDELIVERABLE", True, 0)


async def test_a_level_2_progress_is_not_outranked_by_a_later_level_1(
    store: Store, db: asyncpg.Connection
) -> None:
    """F13: between progress events level counts: a level-2 ENROUTE stays under a later
    level-1 ACCEPTD, even one with a later reported time."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "ENROUTE", done_date="2611291201")])
    later = await store.ingest(LOGIN, [receipt("m", 1, "ACCEPTD", done_date="2611291230")])
    assert later.outcomes == [Outcome.LATE_PROGRESS]
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["basis_level"], row["is_final"]) == ("ENROUTE", 2, False)


@pytest.mark.parametrize("level", [0, 3, 7])
async def test_a_level_outside_1_and_2_is_kept_flagged_and_never_applied(
    store: Store, db: asyncpg.Connection, level: int
) -> None:
    """F4: level 0 (protobuf's missing field), 3 or 7 with DELIVRD: kept, `malformed`, no
    status."""
    await record(store, "m")
    result = await store.ingest(LOGIN, [receipt("m", level, "DELIVRD")])
    assert result.outcomes == [Outcome.UNEXPECTED_LEVEL]
    assert await status(db, "m") is None
    assert await exceptions(db, "m") == [("malformed", None)]
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 1


@pytest.mark.parametrize("order", [("UNKNOWN", "DELIVRD"), ("DELIVRD", "UNKNOWN")])
async def test_the_superseding_option_works_under_one_key_in_either_order(
    database_url: str, db: asyncpg.Connection, order: tuple[str, str]
) -> None:
    """P18 option: the gateway's UNKNOWN and the network's DELIVRD share the key (id, 2); with
    deadline_unknown_superseded the network result holds in either order, no conflict; a
    redelivery of either is a repeat."""
    store = await Store.open(
        database_url, options=IntegrationOptions(deadline_unknown_superseded=True)
    )
    try:
        await record(store, "m")
        outcomes = []
        for stat in (*order, order[0]):
            outcomes += (await store.ingest(LOGIN, [receipt("m", 2, stat)])).outcomes
    finally:
        await store.close()
    second = Outcome.APPLIED if order[1] == "DELIVRD" else Outcome.SUPERSEDED
    assert outcomes == [Outcome.APPLIED, second, Outcome.REPEAT]
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["deadline_superseded"], row["conflicts"], row["repeats"]) == (
        "DELIVERED",
        True,
        0,
        1,
    )
    assert await exceptions(db, "m") == []


async def test_a_second_different_record_is_kept_and_flagged_an_identical_one_is_a_no_op(
    store: Store, db: asyncpg.Connection
) -> None:
    """P12: another destination and internal id for a recorded message id is evidence: a
    `second_record` exception, once however often it is recorded; an identical re-record
    changes nothing. Within one chunk the first record is the one recorded."""
    first = Submission(LOGIN, "m", "+34600000001", internal_id="i-1", submitted_at=SUBMITTED)
    other = Submission(LOGIN, "m", "+34600000002", internal_id="i-2", submitted_at=SUBMITTED)
    await store.record_submissions([first])
    await store.record_submissions([first])
    assert await exceptions(db, "m") == []
    for _ in range(2):
        result = await store.record_submissions([other])
        assert result.recorded == 0
    [row] = await db.fetch("SELECT details FROM dlr.exceptions WHERE kind = 'second_record'")
    details = json.loads(row["details"])
    assert details["differs_in"] == ["internal_id", "destination_raw"]
    assert details["second_record"]["internal_id"] == "i-2"
    assert details["recorded_internal_id"] == "i-1"
    both = [
        Submission(LOGIN, "n", "+34600000001", internal_id="n-1"),
        Submission(LOGIN, "n", "+34600000003", internal_id="n-2"),
    ]
    await store.record_submissions(both)
    assert await db.fetchval("SELECT internal_id FROM dlr.messages WHERE message_id = 'n'") == (
        "n-1"
    )
    assert await exceptions(db, "n") == [("second_record", "second_record")]


@pytest.mark.parametrize(
    ("first_done", "second_done"), [("2611291201", "2611291201"), ("2611291201", None)]
)
async def test_progress_events_without_an_order_keep_the_first_arrived_and_flag_the_tie(
    store: Store, db: asyncpg.Connection, first_done: str, second_done: str | None
) -> None:
    """P19: equal reported times, or one missing: no basis to order them, so the first arrived
    stays (not a hash, not the dated one), and the tie is flagged - in either order."""
    await record(store, "ab", "ba")
    for message_id, stats in (("ab", ("ENROUTE", "ACCEPTD")), ("ba", ("ACCEPTD", "ENROUTE"))):
        await store.ingest(LOGIN, [receipt(message_id, 1, stats[0], first_done)])
        await store.ingest(LOGIN, [receipt(message_id, 1, stats[1], second_done)])
        row = await status(db, message_id)
        assert row is not None
        assert (row["basis_stat"], row["conflicts"]) == (stats[0], 0)
        assert "arrival_order_tie" in row["flags"]


async def test_a_corroborating_undated_result_does_not_displace_the_dated_one(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Two receipt ids of one message (receipt_ids_hex) both report DELIVRD, the second
    without a date: the dated one stays the basis and the message stays in latency stats."""
    store = await Store.open(database_url, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await store.record_submissions(
            [Submission(LOGIN, "27", "+34600000001", submitted_at=SUBMITTED)]
        )
        await store.ingest(LOGIN, [receipt("1B", 2, "DELIVRD", "2611291201")])
        result = await store.ingest(LOGIN, [receipt("1b", 2, "DELIVRD", None)])
    finally:
        await store.close()
    assert result.outcomes == [Outcome.CORROBORATED]
    row = await status(db, "27")
    assert row is not None
    assert row["basis_done_at"] == datetime(2026, 11, 29, 12, 1, tzinfo=UTC)
    assert row["basis_reception_done"] == "2611291201"


async def test_an_unknown_result_is_described_as_reported_not_as_the_deadline(
    store: Store, db: asyncpg.Connection
) -> None:
    """The reason says what was reported: an UNKNOWN is not claimed to be the gateway's
    deadline receipt (an SMSC may report UNKNOWN too)."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "UNKNOWN", err=None)])
    row = await status(db, "m")
    assert row is not None
    assert "UNKNOWN" in row["reason"]
    assert "deadline" not in row["reason"]


@pytest.mark.parametrize("done_date", ["2611291100", "2611301400"])
async def test_an_implausible_reported_time_is_flagged_and_left_out_of_latency(
    store: Store, db: asyncpg.Connection, database_url: str, done_date: str
) -> None:
    """P19: a done date an hour before the submission, or more than a day after the receipt
    was received: kept raw, flagged, not the status' time, and no (negative) latency."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD", done_date)])
    row = await status(db, "m")
    assert row is not None
    assert row["status"] == "DELIVERED"
    assert row["basis_done_at"] is None
    assert "done_date_implausible" in row["flags"]
    assert await db.fetchval("SELECT done_date_raw FROM dlr.receptions_readable") == done_date
    conn = await connect(database_url)
    try:
        report = await statistics(conn, None)
    finally:
        await conn.close()
    assert report["dlr_latency_seconds"]["samples"] == 0


async def test_a_level_1_receipt_resent_with_new_done_dates_is_a_progress_update(
    store: Store, db: asyncpg.Connection
) -> None:
    """P14: an SMSC re-sending ENROUTE with a new done date each time: progress updates,
    counted, the newest is the status; no conflict, no investigation item."""
    await record(store, "m")
    outcomes = []
    for done in ("2611291210", "2611291230", "2611291220"):
        outcomes += (await store.ingest(LOGIN, [receipt("m", 1, "ENROUTE", done)])).outcomes
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.LATE_PROGRESS]
    row = await status(db, "m")
    assert row is not None
    assert (row["conflicts"], row["progress_events"], row["basis_reception_done"]) == (
        0,
        3,
        "2611291230",
    )
    assert await exceptions(db, "m") == []
    assert await db.fetchval(
        "SELECT (times_received, conflicting_receptions, coalesce(cardinality(updates), 0)) "
        "FROM dlr.events WHERE message_id = 'm'"
    ) == (3, 0, 2)


async def test_a_late_correlated_message_keeps_its_late_progress_marks_in_show(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """P20: a result then a progress receipt, both before the message was recorded: `show`
    still tells the late progress receipt, and the status' own flags."""
    await store.ingest(
        LOGIN,
        [receipt("m", 2, "DELIVRD"), receipt("m", 1, "ENROUTE")],
    )
    await record(store, "m")
    conn = await connect(database_url)
    try:
        [report] = await message_reports(conn, "m", LOGIN)
    finally:
        await conn.close()
    text = render(report)
    assert "late progress receipts: 1" in text
    await store.ingest(LOGIN, [receipt("t", 1, "ENROUTE", None)])
    await record(store, "t")
    await store.ingest(LOGIN, [receipt("t", 1, "ACCEPTD", "2611291205")])
    conn = await connect(database_url)
    try:
        [report] = await message_reports(conn, "t", LOGIN)
    finally:
        await conn.close()
    assert "could not be ordered by reported time" in render(report)
