"""`dlrfeed recompute`: stale statuses computed again under the current rules, each change
audited (P8), through the real CLI and a real database."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.store import Store, Submission
from rule_receipts import LOGIN, SUBMITTED, receipt


async def _stale(db: asyncpg.Connection, message_id: str, level: int, **columns: object) -> None:
    """Make a status row look as an older rules version left it: based on the event of
    `level`, with `columns` as that version computed them."""
    await db.execute(
        "UPDATE dlr.message_status SET rules_version = 'rules-1', status = $3, is_final = $4,"
        " conflicts = $5, supporting_event_id = (SELECT id FROM dlr.events"
        "   WHERE message_id = $2 AND level = $6) WHERE login = $1 AND message_id = $2",
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
        await db.execute("DELETE FROM dlr.events WHERE message_id = 'b' AND level = 2")
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
