"""Each rule of docs/rules.md that a real-world receipt exercises, through the real store.

One test per case: the computed status must not depend on the path the receipts took (P19),
level decides the kind (F4, F13), and nothing is reduced or ordered without a basis.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from dlrfeed.cli import main
from dlrfeed.commands.show import render
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import ID_MARK, stored_id
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.store import Store, Submission
from dlrfeed.store.reports import connect, message_reports, statistics
from dlrfeed_tools.rule_receipts import LOGIN, RECEIVED, SUBMITTED, feed_receipt, receipt
from support.webhook_harness import running_webhook, url, webhook_settings


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


async def changes(db: asyncpg.Connection, message_id: str) -> list[tuple[str | None, str | None]]:
    """The message's rows of the change log, (previous status, status), in order."""
    rows = await db.fetch(
        "SELECT previous_status, status FROM dlr.status_changes WHERE message_id = $1 "
        "ORDER BY position",
        message_id,
    )
    return [(r["previous_status"], r["status"]) for r in rows]


@pytest.mark.parametrize("first", ["ENROUTE", "ACCEPTD", "delivrd"])
@pytest.mark.parametrize("recorded", ["before", "after"])
async def test_a_level_2_progress_or_unrecognized_stat_leaves_the_result_place_to_the_result(
    store: Store, db: asyncpg.Connection, first: str, recorded: str
) -> None:
    """P14 sharpened: a level-2 ENROUTE, ACCEPTD or unrecognized `delivrd` (06:01), then the
    level-2 DELIVRD (06:05) in another batch: the DELIVRD is the key's result, applied by the
    table - final, no conflict - whether the message was recorded before or after them."""
    if recorded == "before":
        await record(store, "m")
    firsts = await store.ingest(LOGIN, [receipt("m", 2, first, "2611291201")])
    second = await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD", "2611291205")])
    if recorded == "before":
        took = Outcome.UNRECOGNIZED if first == "delivrd" else Outcome.APPLIED
        assert (firsts.outcomes, second.outcomes) == ([took], [Outcome.APPLIED])
    else:
        assert second.outcomes == [Outcome.UNCORRELATED]
        await record(store, "m")
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["is_final"], row["conflicts"], row["basis_stat"]) == (
        "DELIVERED",
        True,
        0,
        "DELIVRD",
    )
    assert row["progress_events"] == (0 if first == "delivrd" else 1)
    kinds = {kind for kind, _ in await exceptions(db, "m")}
    assert "conflict" not in kinds
    assert kinds == ({"unrecognized"} if first == "delivrd" else {"malformed"})
    # The key holds both contents: a redelivery of either is a repeat.
    again = await store.ingest(
        LOGIN, [receipt("m", 2, first, "2611291201"), receipt("m", 2, "DELIVRD", "2611291205")]
    )
    assert again.outcomes == [Outcome.REPEAT, Outcome.REPEAT]


async def test_a_progress_after_the_result_of_one_key_is_late_progress_not_a_conflict(
    store: Store, db: asyncpg.Connection
) -> None:
    """P14: only two applicable results of a key conflict: a level-2 ENROUTE after the key's
    DELIVRD is a (flagged) late progress observation."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD", "2611291205")])
    later = await store.ingest(LOGIN, [receipt("m", 2, "ENROUTE", "2611291201")])
    assert later.outcomes == [Outcome.LATE_PROGRESS]
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["conflicts"], row["progress_events"]) == ("DELIVERED", 0, 1)


def undeliv_by_feed(count: int) -> Receipt:
    return feed_receipt(
        "m",
        2,
        "UNDELIV",
        ack_token=f"t{count}",
        received_at=RECEIVED + count,
        done_date="2611291201",
        delivery_count=count,
    )


async def assert_one_conflict(db: asyncpg.Connection) -> None:
    row = await status(db, "m")
    assert row is not None
    assert (row["status"], row["conflicts"]) == ("DELIVERED", 1)
    assert await exceptions(db, "m") == [("conflict", "same_key_other_content")]
    assert (
        await db.fetchval(
            "SELECT count(*) FROM dlr.receptions WHERE message_id = 'm' AND outcome = 'conflict'"
        )
        == 1
    )


async def test_a_redelivered_conflicting_receipt_is_a_repeat_by_feed_and_by_webhook(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """P14 sharpened, C1: DELIVRD, then one UNDELIV receipt delivered with delivery_count 1,
    2, 3 and once by webhook: one conflict (outcome, counter, open exception), then repeats."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD")])
    outcomes = []
    for count in (1, 2, 3):
        outcomes += (await store.ingest(LOGIN, [undeliv_by_feed(count)])).outcomes
    assert outcomes == [Outcome.CONFLICT, Outcome.REPEAT, Outcome.REPEAT]
    callback = {"id": "m", "level": 2, "stat": "UNDELIV", "err": "000", "done_date": "2611291201"}
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.post(url(service), content=json.dumps(callback).encode())
    assert answer.json() == {"outcome": "repeat"}
    await assert_one_conflict(db)
    row = await status(db, "m")
    assert row is not None
    assert row["repeats"] == 3
    assert await db.fetchval(
        "SELECT (times_received, conflicting_receptions) FROM dlr.events "
        "WHERE message_id = 'm' AND level = 2"
    ) == (4, 1)


async def test_fifty_concurrent_deliveries_of_a_conflicting_receipt_open_one_exception(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P14, C1: the same conflicting UNDELIV ingested 50 times at once on separate connections,
    then posted 50 times at once to the webhook: one conflict, one open exception."""
    store = await Store.open(database_url, pool_size=8)
    try:
        await record(store, "m")
        await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD")])
        results = await asyncio.gather(
            *(store.ingest(LOGIN, [undeliv_by_feed(n)]) for n in range(1, 51))
        )
    finally:
        await store.close()
    assert Counter(o for r in results for o in r.outcomes) == {
        Outcome.CONFLICT: 1,
        Outcome.REPEAT: 49,
    }
    await assert_one_conflict(db)
    callback = {"id": "m", "level": 2, "stat": "UNDELIV", "err": "001"}
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        answers = await asyncio.gather(
            *(client.post(url(service), content=json.dumps(callback).encode()) for _ in range(50))
        )
    assert Counter(a.json()["outcome"] for a in answers) == {"conflict": 1, "repeat": 49}
    assert await exceptions(db, "m") == [("conflict", "same_key_other_content")] * 2


async def test_the_deadline_unknown_after_the_result_emits_no_second_change(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P23: with deadline_unknown_superseded, DELIVRD then the deadline UNKNOWN: one change
    row `- -> DELIVERED`; the status notes that the UNKNOWN was superseded."""
    store = await Store.open(
        database_url, options=IntegrationOptions(deadline_unknown_superseded=True)
    )
    try:
        await record(store, "m", "n")
        await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD")])
        await store.ingest(LOGIN, [receipt("m", 2, "UNKNOWN", err=None)])
        await store.ingest(LOGIN, [receipt("n", 2, "UNKNOWN", err=None)])
        await store.ingest(LOGIN, [receipt("n", 2, "DELIVRD")])
    finally:
        await store.close()
    assert await changes(db, "m") == [(None, "DELIVERED")]
    assert await changes(db, "n") == [(None, "UNKNOWN"), ("UNKNOWN", "DELIVERED")]
    m, n = await status(db, "m"), await status(db, "n")
    assert m is not None
    assert n is not None
    assert m["deadline_superseded"]
    assert n["deadline_superseded"]
    assert m["reason"] == n["reason"]


async def test_corroborating_results_change_nothing_of_the_final(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P18 sharpened, P23: with receipt_ids_hex, `ff`, `FF` and `0ff` all report DELIVRD for
    message 255, each with another err and an earlier done date: one change row, and the
    final keeps the first report's err and basis."""
    store = await Store.open(database_url, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await record(store, "255")
        outcomes = []
        for receipt_id, err, done in (
            ("ff", "000", "2611291203"),
            ("FF", "001", "2611291202"),
            ("0ff", "002", "2611291201"),
        ):
            result = await store.ingest(LOGIN, [receipt(receipt_id, 2, "DELIVRD", done, err)])
            outcomes += result.outcomes
    finally:
        await store.close()
    assert outcomes == [Outcome.APPLIED, Outcome.CORROBORATED, Outcome.CORROBORATED]
    assert await changes(db, "255") == [(None, "DELIVERED")]
    row = await status(db, "255")
    assert row is not None
    assert (row["basis_err"], row["basis_reception_done"]) == ("000", "2611291203")
    assert "err 000" in row["reason"]


@pytest.mark.parametrize("split", [1, 2])
async def test_a_local_time_in_a_dst_gap_is_read_by_one_rule_whatever_the_batch_split(
    database_url: str, db: asyncpg.Connection, split: int
) -> None:
    """P24: in Europe/Berlin 2026-03-29 02:30 does not exist (02:00 -> 03:00): it is read with
    the offset before the jump, 03:30 CEST (01:30 UTC), so it is later than 03:05 CEST (01:05
    UTC); the newer progress is the same in one batch or two."""
    store = await Store.open(
        database_url, options=IntegrationOptions(receipt_timezone="Europe/Berlin")
    )
    try:
        await store.record_submissions(
            [
                Submission(
                    LOGIN, "m", "+34600000001", submitted_at=datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
                )
            ]
        )
        deliveries = [
            receipt("m", 1, "ENROUTE", "2603290230"),
            receipt("m", 1, "ACCEPTD", "2603290305"),
        ]
        for start in range(0, 2, split):
            await store.ingest(LOGIN, deliveries[start : start + split])
        live = await status(db, "m")
        # The replay reads both times back from the store: the same instants, the same status.
        await store.recompute(every=True)
    finally:
        await store.close()
    row = await status(db, "m")
    assert row is not None
    assert live is not None
    for held in (live, row):
        assert (held["status"], held["basis_done_at"]) == (
            "ENROUTE",
            datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        )
        assert "arrival_order_tie" not in (held["flags"] or [])


async def test_a_done_date_inside_the_skew_tolerance_gives_no_negative_latency(
    store: Store, database_url: str
) -> None:
    """P19: a DELIVRD done 5 minutes before the recorded submission is plausible (clock skew):
    it stays a latency sample, clamped to 0 s, never negative."""
    await record(store, "m")
    await store.ingest(LOGIN, [receipt("m", 2, "DELIVRD", "2611291155")])
    conn = await connect(database_url)
    try:
        report = await statistics(conn, None)
    finally:
        await conn.close()
    latency = report["dlr_latency_seconds"]
    assert latency["samples"] == 1
    assert latency["p50"] == 0


CRAFTED_IDS = ["N\x00L", "x" * 600]


async def _ingest_crafted(database_url: str, raw: str) -> tuple[list[Outcome], str]:
    """Messages recorded with the literal ids the altered form of `raw` was or is, then a
    receipt with `raw` itself: its outcomes and its stored id."""
    store = await Store.open(database_url)
    try:
        altered = stored_id(raw)
        digest = altered.rsplit(ID_MARK, 1)[1]
        literals = [altered, altered.replace(ID_MARK, "#"), f"{altered.split(ID_MARK)[0]}#{digest}"]
        await record(store, *literals)
        result = await store.ingest(LOGIN, [receipt(raw, 2, "DELIVRD")])
    finally:
        await store.close()
    return result.outcomes, altered


@pytest.mark.parametrize("raw", CRAFTED_IDS, ids=["nul", "600-chars"])
def test_an_id_kept_altered_never_equals_a_literal_id_and_is_findable(
    database_url: str, capsys: pytest.CaptureFixture[str], raw: str
) -> None:
    """P24: an id with a NUL or over 512 characters is kept altered, with a mark no literal id
    carries: a message recorded with the literal text of the altered form (or of the form the
    alteration used to give) is not its message; `dlrfeed show` finds the receipt by the id
    as received and by its altered form."""
    outcomes, altered = asyncio.run(_ingest_crafted(database_url, raw))
    assert outcomes == [Outcome.UNCORRELATED]

    async def read() -> tuple[int, list[str]]:
        conn = await asyncpg.connect(database_url)
        try:
            statuses = await conn.fetchval("SELECT count(*) FROM dlr.message_status")
            ids = [r[0] for r in await conn.fetch("SELECT message_id FROM dlr.events")]
        finally:
            await conn.close()
        return statuses, ids

    assert asyncio.run(read()) == (0, [altered])
    shown = []
    for asked in ([raw] if "\x00" not in raw else []) + [altered]:
        assert main(["show", asked, "--database-url", database_url, "--json"]) == 0
        shown.append(json.loads(capsys.readouterr().out))
    for document in shown:
        with_events = [r for r in document["reports"] if r["events"]]
        assert [[e["receipt_id"] for e in r["events"]] for r in with_events] == [[altered]]
        assert with_events[0]["message"] is None
        assert with_events[0]["status"] is None
