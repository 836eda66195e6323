"""`dlrfeed recompute`: stale statuses computed again under the current rules, each change
audited (P8), through the real CLI and a real database."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.store import Store, Submission
from dlrfeed.store.changes import StatusChange, follow_changes
from dlrfeed_tools.rule_receipts import LOGIN, SUBMITTED, receipt


async def _stale(db: asyncpg.Connection, message_id: str, level: int, **columns: object) -> None:
    """Make a status row look as an older rules version left it: based on the event of
    `level`, with `columns` as that version computed them."""
    await db.execute(
        "UPDATE dlr.statuses AS s SET rules_version = 'rules-1', status = $3, is_final = $4,"
        " conflicts = $5, supporting_event_id = (SELECT id FROM dlr.events"
        "   WHERE message_id = $2 AND level = $6)"
        " FROM dlr.messages AS m WHERE m.id = s.message_ref AND m.login = $1"
        " AND m.message_id = $2",
        LOGIN,
        message_id,
        columns["status"],
        columns["is_final"],
        columns["conflicts"],
        level,
    )


async def _prepare(database_url: str) -> asyncpg.Record | None:
    """a: level-1 DELIVRD then level-2 UNDELIV, which an older version took as final and a
    conflict; b: a level-0 DELIVRD it applied; c: already current (returned)."""
    store = await Store.open(database_url)
    try:
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600000001", submitted_at=SUBMITTED) for m in "abc"]
        )
        await store.ingest(LOGIN, [receipt("a", 1, "DELIVRD"), receipt("a", 2, "UNDELIV")])
        await store.ingest(LOGIN, [receipt("b", 2, "DELIVRD"), receipt("b", 0, "DELIVRD")])
        await store.ingest(LOGIN, [receipt("c", 2, "EXPIRED")])
    finally:
        await store.close()
    db = await asyncpg.connect(database_url)
    try:
        await _stale(db, "a", 1, status="DELIVERED", is_final=True, conflicts=1)
        for table in ("event_rows", "message_events"):  # whichever keeps it
            await db.execute(
                f"DELETE FROM dlr.{table} WHERE id IN"
                " (SELECT id FROM dlr.events WHERE message_id = 'b' AND level = 2)"
            )
        await _stale(db, "b", 0, status="DELIVERED", is_final=True, conflicts=0)
        return await db.fetchrow("SELECT * FROM dlr.message_status WHERE message_id = 'c'")
    finally:
        await db.close()


async def _after(database_url: str) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    db = await asyncpg.connect(database_url)
    try:
        statuses = await db.fetch("SELECT * FROM dlr.message_status ORDER BY message_id")
        audit = await db.fetch("SELECT * FROM dlr.status_recomputations ORDER BY message_id")
        return statuses, audit
    finally:
        await db.close()


def test_recompute_rewrites_stale_statuses_and_audits_each_change(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """P8: the stale rows (rules-1) are computed again from their deliveries; each change is in
    the audit trail with before, after and why; a current row is left alone; a second run finds
    nothing stale."""
    current = asyncio.run(_prepare(database_url))
    assert main(["recompute", "--database-url", database_url]) == 0
    assert "recomputed 2 statuses" in capsys.readouterr().out
    statuses, audit = asyncio.run(_after(database_url))
    a, c = statuses
    assert (a["message_id"], c["message_id"]) == ("a", "c")  # b has no applicable receipt
    assert (a["status"], a["is_final"], a["conflicts"], a["rules_version"]) == (
        "UNDELIVERABLE",
        True,
        0,
        RULES_VERSION,
    )
    assert c == current
    assert [(r["message_id"], r["old_status"], r["new_status"]) for r in audit] == [
        ("a", "DELIVERED", "UNDELIVERABLE"),
        ("b", "DELIVERED", None),
    ]
    assert "status 'DELIVERED' -> 'UNDELIVERABLE'" in audit[0]["why"]
    assert "conflicts 1 -> 0" in audit[0]["why"]
    assert "no applicable receipt" in audit[1]["why"]
    assert main(["recompute", "--database-url", database_url]) == 0
    assert "recomputed 0 statuses" in capsys.readouterr().out


async def _log_and_follower(database_url: str) -> tuple[list[asyncpg.Record], list[StatusChange]]:
    """The whole change log, and what a follower from 0 reads of it (until it has b's last)."""
    db = await asyncpg.connect(database_url)
    try:
        log = await db.fetch("SELECT * FROM dlr.status_changes ORDER BY position")
        statuses = await db.fetch("SELECT login, message_id, status FROM dlr.message_status")
    finally:
        await db.close()
    stop = asyncio.Event()
    seen: list[StatusChange] = []
    async with asyncio.timeout(20):
        async for batch in follow_changes(database_url, 0, stop=stop):
            seen.extend(batch)
            if any(c.message_id == "b" and c.status is None for c in seen):
                stop.set()
    last: dict[tuple[str, str], str | None] = {}
    for row in log:
        last[(row["login"], row["message_id"])] = row["status"]
    current = {(r["login"], r["message_id"]): r["status"] for r in statuses}
    # The invariant: every message's last change is its status, or null when it has none.
    assert last == {key: current.get(key) for key in last}
    assert set(current) <= set(last)
    return log, seen


def test_a_status_withdrawn_by_recompute_is_a_change_with_a_null_status(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """b's DELIVERED (applied from a level-0 receipt by an older rules version) is deleted by
    the recompute: the log gets exactly one change with a null status, DELIVERED as the
    previous status and the recompute's why; a follower and `dlrfeed changes --json` see it."""
    asyncio.run(_prepare(database_url))
    assert main(["recompute", "--database-url", database_url]) == 0
    capsys.readouterr()
    log, seen = asyncio.run(_log_and_follower(database_url))
    withdrawn = [r for r in log if r["status"] is None]
    assert len(withdrawn) == 1
    (gone,) = withdrawn
    assert gone["message_id"] == "b"
    assert (gone["previous_status"], gone["previous_is_final"], gone["is_final"]) == (
        "DELIVERED",
        True,
        False,
    )
    assert "no applicable receipt" in gone["reason"]
    assert gone["rules_version"] == RULES_VERSION
    assert [r for r in log if r["message_id"] == "b"][-1] == gone
    followed = [c for c in seen if c.status is None]
    assert [(c.message_id, c.position, c.previous_status) for c in followed] == [
        ("b", int(gone["position"]), "DELIVERED")
    ]
    assert main(["changes", "--database-url", database_url, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    nulls = [line for line in lines if line["status"] is None]
    assert [(n["message_id"], n["previous_status"]) for n in nulls] == [("b", "DELIVERED")]
    assert main(["changes", "--database-url", database_url]) == 0
    assert "DELIVERED -> - (withdrawn)" in capsys.readouterr().out
    # A second run deletes nothing and writes nothing.
    assert main(["recompute", "--database-url", database_url]) == 0
    capsys.readouterr()
    again, _ = asyncio.run(_log_and_follower(database_url))
    assert again == log
