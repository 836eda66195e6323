"""The paths around the live ingest against the real server: retention, late correlation,
recompute and option changes leave every status, counter, open exception and the change log as
the live path has them (P21, P22, P23)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.domain.status import Outcome
from dlrfeed.store import Store, Submission
from dlrfeed.store.retention import RetentionPolicy, maintain
from dlrfeed_tools.daemon_harness import wait_until
from dlrfeed_tools.retention_support import DAY, today
from dlrfeed_tools.rule_receipts import SUBMITTED, feed_receipt
from support.console import dlrfeed

LOGIN = "acme"
OTHER = "other"  # the same traffic under another login: the live path's answer to compare with
SUPERSEDED = IntegrationOptions(deadline_unknown_superseded=True)


def _at(days: int, minutes: int = 60) -> float:
    return (today() + days * DAY + timedelta(minutes=minutes)).timestamp()


def _receipt(
    message_id: str, level: int, stat: str, days: int, tag: str, err: str = "000"
) -> Receipt:
    return feed_receipt(
        message_id,
        level,
        stat,
        ack_token=f"{message_id}.{tag}",
        received_at=_at(days),
        err=err,
        done_date=(SUBMITTED + timedelta(minutes=5)).strftime("%y%m%d%H%M"),
    )


async def _record(store: Store, login: str, *message_ids: str) -> int:
    result = await store.record_submissions(
        [Submission(login, m, "+34600000001", submitted_at=SUBMITTED) for m in message_ids]
    )
    return result.late_correlated_events


async def _statuses(db: asyncpg.Connection, login: str = LOGIN) -> dict[str, dict[str, Any]]:
    """Every status of `login`, its basis named by its event's level (ids differ by login)."""
    rows = await db.fetch(
        "SELECT s.*, e.level AS basis_event_level FROM dlr.message_status AS s"
        " JOIN dlr.events AS e ON e.id = s.supporting_event_id"
        " WHERE s.login = $1 ORDER BY s.message_id",
        login,
    )
    return {
        r["message_id"]: {
            k: v
            for k, v in dict(r).items()
            if k
            not in {
                "login",
                "supporting_event_id",
                "supporting_reception_id",
                "updated_at",
                "change_epoch",
                "message_ref",
            }
        }
        for r in rows
    }


async def _changes(db: asyncpg.Connection) -> list[tuple[str, str | None, str | None]]:
    rows = await db.fetch(
        "SELECT message_id, previous_status, status FROM dlr.status_changes ORDER BY position"
    )
    return [(r["message_id"], r["previous_status"], r["status"]) for r in rows]


async def _events(db: asyncpg.Connection, login: str = LOGIN) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT message_id, level, times_received, conflicting_receptions,"
        " coalesce(updates, '{}') AS updates FROM dlr.events WHERE login = $1"
        " ORDER BY message_id, level",
        login,
    )
    return [tuple(r) for r in rows]


async def _open_exceptions(db: asyncpg.Connection, login: str = LOGIN) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT kind, message_id, details FROM dlr.exceptions"
        " WHERE login = $1 AND resolved_at IS NULL ORDER BY message_id, kind, id",
        login,
    )
    return [(r["kind"], r["message_id"], json.loads(r["details"]).get("cause")) for r in rows]


async def _retire_the_first_day(database_url: str) -> None:
    """`maintain --retention-days 7` twenty days on: the day of the first receipts is gone."""
    report = await maintain(
        database_url, RetentionPolicy(retention_days=7), now=today() + 20 * DAY + DAY / 2
    )
    assert f"receptions_{today():%Y%m%d}" in report.dropped


@pytest.mark.parametrize("recorded", ["before", "after_retention"])
@pytest.mark.parametrize("conflicting", [False, True], ids=["final", "final_then_conflict"])
async def test_retention_then_recompute_keeps_each_final_and_its_counters(
    database_url: str, db: asyncpg.Connection, recorded: str, conflicting: bool
) -> None:
    """P21: DELIVRD (and its repeat) on day 0, with `conflicting` an UNDELIV of the same key on
    day 18; the message recorded before them, or only after day 0 was retired (then correlated
    late from what its events keep). A recompute after a rules-version bump, and `--all`, leave
    the status, counters, open exceptions and the change log as they were; a redelivery is a
    repeat that changes nothing."""
    await maintain(database_url, RetentionPolicy(days_ahead=25))
    store = await Store.open(database_url, pool_size=1)
    try:
        if recorded == "before":
            await _record(store, LOGIN, "m")
        await store.ingest(LOGIN, [_receipt("m", 2, "DELIVRD", 0, "1")])
        await store.ingest(LOGIN, [_receipt("m", 2, "DELIVRD", 0, "2")])
        if conflicting:
            await store.ingest(LOGIN, [_receipt("m", 2, "UNDELIV", 18, "3", err="001")])
        await _retire_the_first_day(database_url)
        if recorded == "after_retention":
            assert await _record(store, LOGIN, "m") == 1
        (status,) = (await _statuses(db)).values()
        assert (status["status"], status["is_final"]) == ("DELIVERED", True)
        assert (status["repeats"], status["conflicts"]) == (1, int(conflicting))
        changes = await _changes(db)
        exceptions = await _open_exceptions(db)
        await db.execute("UPDATE dlr.statuses SET rules_version = 'rules-0'")
        kept = await _statuses(db)

        await store.recompute()
        await store.recompute(every=True)

        assert await _statuses(db) == kept
        assert await _changes(db) == changes
        assert await _open_exceptions(db) == exceptions
        again = await store.ingest(LOGIN, [_receipt("m", 2, "DELIVRD", 21, "4")])
        assert again.outcomes == [Outcome.REPEAT]
        (status,) = (await _statuses(db)).values()
        assert (status["status"], status["repeats"]) == ("DELIVERED", 2)
        assert await _changes(db) == changes
    finally:
        await store.close()


async def test_a_recompute_leaves_a_status_whose_evidence_was_retired_and_says_so(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P21: the statuses left as they were because their evidence was retired are counted."""
    await maintain(database_url, RetentionPolicy(days_ahead=25))
    store = await Store.open(database_url, pool_size=1)
    try:
        await _record(store, LOGIN, "old", "new")
        await store.ingest(LOGIN, [_receipt("old", 2, "DELIVRD", 0, "1")])
        await store.ingest(LOGIN, [_receipt("old", 2, "DELIVRD", 0, "2")])  # a repeat
        await store.ingest(LOGIN, [_receipt("new", 2, "DELIVRD", 19, "1")])
        await _retire_the_first_day(database_url)
        result = await store.recompute(every=True)
    finally:
        await store.close()
    assert (result.examined, result.changed, result.evidence_retired) == (2, 0, 1)


async def test_a_message_recorded_after_its_first_conflict_retired_is_recorded(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P21: a conflicting content whose first delivery left with its day, redelivered on a
    day still kept, stays one open conflict when its message is recorded late: the replay
    meets the open exception retention kept, and the recording goes through."""
    await maintain(database_url, RetentionPolicy(days_ahead=25))
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.ingest(LOGIN, [_receipt("m", 2, "DELIVRD", 0, "1")])
        await store.ingest(LOGIN, [_receipt("m", 2, "UNDELIV", 0, "2", err="001")])
        await store.ingest(LOGIN, [_receipt("m", 2, "UNDELIV", 18, "3", err="001")])
        await _retire_the_first_day(database_url)
        assert await _record(store, LOGIN, "m") == 1
    finally:
        await store.close()
    status = await db.fetchrow(
        "SELECT status, conflicts, repeats FROM dlr.message_status WHERE message_id = 'm'"
    )
    assert status is not None
    assert tuple(status) == ("DELIVERED", 1, 1)
    open_conflicts = await db.fetchval(
        "SELECT count(*) FROM dlr.exceptions WHERE kind = 'conflict' AND resolved_at IS NULL"
    )
    assert open_conflicts == 1


async def _traffic(store: Store, login: str) -> None:
    """A deadline UNKNOWN after DELIVRD (a, one key), DELIVRD after UNKNOWN (b), each
    redelivered; c a plain final."""
    await _record(store, login, "a", "b", "c")
    await store.ingest(login, [_receipt("a", 2, "DELIVRD", 0, "1")])
    await store.ingest(login, [_receipt("a", 2, "UNKNOWN", 0, "2", err="999")])
    await store.ingest(login, [_receipt("b", 2, "UNKNOWN", 0, "1", err="999")])
    await store.ingest(login, [_receipt("b", 2, "DELIVRD", 0, "2")])
    await store.ingest(login, [_receipt("c", 2, "DELIVRD", 0, "1")])
    await store.ingest(
        login, [_receipt("a", 2, "UNKNOWN", 0, "3", err="999"), _receipt("b", 2, "DELIVRD", 0, "3")]
    )


@pytest.mark.parametrize("switched_to", [SUPERSEDED, IntegrationOptions()], ids=["on", "off"])
async def test_switching_an_option_makes_statuses_stale_and_recompute_writes_what_live_would(
    database_url: str, db: asyncpg.Connection, switched_to: IntegrationOptions
) -> None:
    """P22: traffic ingested under one setting of deadline_unknown_superseded, the option
    switched and a plain `recompute` run: statuses, events' counters and accepted contents,
    and open exceptions are those the live path writes for the same traffic under the new
    setting (login OTHER), and a later redelivery has the same outcome on both."""
    before = IntegrationOptions() if switched_to == SUPERSEDED else SUPERSEDED
    old = await Store.open(database_url, pool_size=1, options=before)
    try:
        await _traffic(old, LOGIN)
    finally:
        await old.close()
    new = await Store.open(database_url, pool_size=1, options=switched_to)
    try:
        await _traffic(new, OTHER)
        result = await new.recompute()
        assert result.examined == 3
        assert await _statuses(db, LOGIN) == await _statuses(db, OTHER)
        assert await _events(db, LOGIN) == await _events(db, OTHER)
        assert await _open_exceptions(db, LOGIN) == [
            (k, m, c) for k, m, c in await _open_exceptions(db, OTHER)
        ]
        assert (await new.recompute()).examined == 0
        later = [
            (
                await new.ingest(
                    login,
                    [
                        _receipt("a", 2, "UNKNOWN", 1, "4", err="999"),
                        _receipt("b", 2, "DELIVRD", 1, "4"),
                    ],
                )
            ).outcomes
            for login in (LOGIN, OTHER)
        ]
        assert later[0] == later[1]
        assert await _statuses(db, LOGIN) == await _statuses(db, OTHER)
        assert await _events(db, LOGIN) == await _events(db, OTHER)
    finally:
        await new.close()


async def test_recompute_all_rewrites_nothing_of_an_unchanged_status(
    store: Store, db: asyncpg.Connection
) -> None:
    """A status the rules compute the same is not written at all (its row version, updated_at
    and the change log stay); a stale one that computes the same gets only its rules version."""
    await _record(store, LOGIN, "a", "b")
    await store.ingest(
        LOGIN, [_receipt("a", 2, "DELIVRD", 0, "1"), _receipt("b", 1, "ENROUTE", 0, "1")]
    )
    query = (
        "SELECT m.message_id, s.xmin::text, s.updated_at, s.rules_version"
        " FROM dlr.statuses AS s JOIN dlr.messages AS m ON m.id = s.message_ref"
    )
    before = {r[0]: tuple(r) for r in await db.fetch(query)}
    changes = await _changes(db)
    result = await store.recompute(every=True)
    assert (result.examined, result.changed) == (2, 0)
    assert {r[0]: tuple(r) for r in await db.fetch(query)} == before
    await db.execute(
        "UPDATE dlr.statuses AS s SET rules_version = 'rules-0' FROM dlr.messages AS m"
        " WHERE m.id = s.message_ref AND m.message_id = 'a'"
    )
    stale = await db.fetchrow(query + " WHERE m.message_id = 'a'")
    assert (await store.recompute()).examined == 1
    after = await db.fetchrow(query + " WHERE m.message_id = 'a'")
    assert stale is not None
    assert after is not None
    assert (after["updated_at"], after["rules_version"]) == (stale["updated_at"], RULES_VERSION)
    assert await _changes(db) == changes


async def _waiting_for_a_lock(db: asyncpg.Connection) -> bool:
    """Whether a session of the test's database waits for a lock (the command, for ours)."""
    return bool(
        await db.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    )


async def _stale_traffic(database_url: str, count: int) -> dict[str, dict[str, Any]]:
    """`count` messages with a final each, their statuses made stale and wrong (a conflict too
    many): what a recompute must bring back, returned."""
    store = await Store.open(database_url, pool_size=1)
    try:
        ids = [f"m{n:05}" for n in range(count)]
        await _record(store, LOGIN, *ids)
        for start in range(0, count, 500):
            await store.ingest(
                LOGIN, [_receipt(m, 2, "DELIVRD", 0, "1") for m in ids[start : start + 500]]
            )
    finally:
        await store.close()
    db = await asyncpg.connect(database_url)
    try:
        right = await _statuses(db)
        await db.execute(
            "UPDATE dlr.statuses SET rules_version = 'rules-0', conflicts = conflicts + 1"
        )
        return right
    finally:
        await db.close()


@pytest.mark.timeout(300)  # two recompute processes and their start-ups, on busy cores
@pytest.mark.parametrize("every", [False, True], ids=["stale", "all"])
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
async def test_an_interrupted_recompute_run_again_ends_as_one_run(
    database_url: str, db: asyncpg.Connection, every: bool, signal_number: int
) -> None:
    """`dlrfeed recompute` as a process, stopped by a signal while a chunk waits for a message
    a writer holds (after it reported progress as JSON lines), then run again: the statuses
    are those one whole run writes, each change audited once."""
    right = await _stale_traffic(database_url, 1000)
    argv = [sys.executable, "-m", "dlrfeed.cli", "recompute", "--database-url", database_url,
            "--progress-every", "0", *(["--all"] if every else [])]  # fmt: skip
    held = db.transaction()
    await held.start()
    await db.execute("SELECT 1 FROM dlr.messages WHERE message_id = 'm00700' FOR UPDATE")
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    async with asyncio.timeout(60):
        first = json.loads(await process.stderr.readline())
        await wait_until(lambda: _waiting_for_a_lock(db), 60, "the command to wait for the lock")
        process.send_signal(signal_number)
        await process.wait()
    await held.rollback()
    assert (first["progress"], first["total"], first["unit"]) == ("recompute", 1000, "statuses")
    assert process.returncode != 0
    stale = await db.fetchval(
        "SELECT count(*) FROM dlr.message_status WHERE rules_version = 'rules-0'"
    )
    assert 0 < stale < 1000  # stopped half way: the chunks before the held one committed
    again = await asyncio.to_thread(dlrfeed, *argv[3:])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stderr.splitlines()[-1])["finished"] is True
    assert await _statuses(db) == right
    audited = await db.fetchval(
        "SELECT count(DISTINCT message_id) = count(*) FROM dlr.status_recomputations"
    )
    assert audited
    assert await db.fetchval("SELECT count(*) FROM dlr.status_recomputations") == 1000


async def test_an_interrupted_record_submissions_run_again_ends_as_one_run(
    database_url: str, db: asyncpg.Connection, tmp_path: Any
) -> None:
    """`dlrfeed record-submissions` of a file as a process: JSON progress lines (bytes of the
    file), stopped by SIGTERM while a batch waits for an id another recorder holds, then run
    again: every message recorded once, the receipts waiting for them correlated late."""
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.ingest(LOGIN, [_receipt(f"m{n:05}", 2, "DELIVRD", 0, "1") for n in range(3000)])
    finally:
        await store.close()
    sent = tmp_path / "sent.jsonl"
    sent.write_text(
        "".join(
            json.dumps({"login": LOGIN, "message_id": f"m{n:05}", "destination": "+34600000001"})
            + "\n"
            for n in range(3000)
        )
    )
    argv = [sys.executable, "-m", "dlrfeed.cli", "record-submissions", str(sent),
            "--database-url", database_url, "--progress-every", "0"]  # fmt: skip
    held = db.transaction()
    await held.start()
    await db.execute(  # the lock a recorder of m02500 takes (sql/ingest.sql, lock_correlation_ids)
        "SELECT pg_advisory_xact_lock(6581362, hashtext($1 || chr(31) || 'm02500'))", LOGIN
    )
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    async with asyncio.timeout(60):
        first = json.loads(await process.stderr.readline())
        await wait_until(lambda: _waiting_for_a_lock(db), 60, "the command to wait for the lock")
        process.send_signal(signal.SIGTERM)
        await process.wait()
    await held.rollback()
    assert (first["progress"], first["unit"], first["total"]) == (
        "record-submissions",
        "bytes",
        sent.stat().st_size,
    )
    assert 0 < await db.fetchval("SELECT count(*) FROM dlr.messages") < 3000
    again = await asyncio.to_thread(dlrfeed, *argv[3:])
    assert again.returncode == 0, again.stderr
    last = json.loads(again.stderr.splitlines()[-1])
    assert (last["finished"], last["done"]) == (True, sent.stat().st_size)
    assert await db.fetchval("SELECT count(*) FROM dlr.messages") == 3000
    statuses = await _statuses(db)
    assert len(statuses) == 3000
    assert {s["status"] for s in statuses.values()} == {"DELIVERED"}
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions WHERE resolved_at IS NULL") == 0
