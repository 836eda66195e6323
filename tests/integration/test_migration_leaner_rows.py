"""Migration 0016 (leaner rows): `show`, the reports and `recompute` read the same answers.

One fixed corpus - first deliveries, repeats, progress updates, a conflict, receipts that wait
for their message and are correlated late, ids correlated through receipt_ids_hex, callbacks,
odd dates and stats, a level the rules never apply - goes into three stores:
- `old`: at the schema before 0016, written whole as before. Its answers are the reference,
  and a copy of it (taken before the migration) is recomputed for the reference recompute.
- `old` again after `dlrfeed migrate`: its rows as they were, read by the new readers.
- `lean`: at the current schema from the start, so most rows defer to their event.
Then more traffic (redeliveries of the old events, new events) goes to both migrated and lean
stores, and their answers are compared again: rows of both forms under one event.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed.store.reports import list_exceptions, message_reports, statistics
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import install_schema_before
from dlrfeed_tools.rule_receipts import LOGIN, SUBMITTED, feed_receipt

LEANER_ROWS = 16  # the migration under test
HEX_LOGIN = "hexco"
# Wall-clock times of the writing transactions, and the transaction id a status's change order
# is kept by (migration 0017): they differ between any two stores.
_WRITER_SPECIFIC = {
    "stored_at",
    "updated_at",
    "opened_at",
    "recorded_at",
    "resolved_at",
    "change_epoch",
}
_AT = time.time() - 3600


def _fed(
    message_id: str, level: int, stat: str, n: int, *, done: str | None = "2611291201", **kw: Any
) -> Receipt:
    return feed_receipt(
        message_id,
        level,
        stat,
        ack_token=f"t{n}",
        received_at=_AT + n,
        done_date=done,
        submit_date="2611291200",
        **kw,
    )


def _callback(message_id: str, level: int, stat: str, n: int) -> Receipt:
    body = json.dumps({"id": message_id, "level": level, "stat": stat, "err": "000"}).encode()
    return feed_receipt(message_id, level, stat, ack_token="", received_at=_AT + n)._replace(
        raw=body, channel="webhook", peer="10.0.0.7:50000"
    )


def corpus() -> tuple[list[Receipt], list[Receipt], list[Receipt]]:
    """(before the messages are recorded, after, later traffic) for LOGIN."""
    early = [
        _fed("w1", 1, "ENROUTE", 1),  # waits for its message, then correlated late
        _fed("w1", 2, "DELIVRD", 2),
        _fed("w1", 2, "DELIVRD", 3, delivery_count=2),  # a repeat while waiting
        _fed("u1", 2, "DELIVRD", 4),  # never recorded: stays uncorrelated
    ]
    live = [
        _fed("a", 1, "ACCEPTD", 10),
        _fed("a", 1, "ENROUTE", 11, done="2611291202"),  # a progress update, own content
        _fed("a", 2, "DELIVRD", 12),
        _fed("a", 2, "DELIVRD", 13, delivery_count=2),  # a repeat
        _fed("b", 2, "DELIVRD", 14),
        _fed("b", 2, "UNDELIV", 15),  # a conflict: same key, other content
        _fed("c", 2, "DELIVRD", 16, done="13/13/13"),  # an unparsed date, flagged
        _fed("c", 2, "DELIVRD", 17, done="13/13/13", delivery_count=3),
        _fed("d", 2, "WEIRD", 18),  # an unrecognised stat
        _fed("e", 0, "DELIVRD", 19),  # a level the rules never apply
        _fed("e", 2, "EXPIRED", 20, done=None, err=None),
        _fed("f", 1, "ENROUTE", 21, text="caf\x00e"),  # a NUL: stored escaped, flagged
        _callback("g", 2, "DELIVRD", 22),
        _callback("g", 2, "DELIVRD", 23),
    ]
    later = [
        _fed("a", 2, "DELIVRD", 30, delivery_count=3),  # repeats of events stored before
        _fed("b", 2, "EXPIRED", 31),
        _fed("f", 1, "ENROUTE", 32, text="caf\x00e", delivery_count=2),
        _fed("h", 2, "DELIVRD", 33),
        _fed("h", 2, "DELIVRD", 34, delivery_count=2),
        _callback("g", 2, "DELIVRD", 35),
    ]
    return early, live, later


def hex_corpus() -> tuple[list[Receipt], list[Receipt]]:
    """HEX_LOGIN's receipts, whose ids correlate as hex (message "26" is receipt "1a" or
    "1A"), and its later traffic."""
    return (
        [
            _fed("1a", 2, "DELIVRD", 40),
            _fed("1A", 2, "DELIVRD", 41, done=None),
            _fed("zz", 1, "X", 42),
        ],
        [_fed("1a", 2, "DELIVRD", 43, delivery_count=2), _fed("1b", 2, "UNDELIV", 44)],
    )


MESSAGE_IDS = ["w1", "u1", "a", "b", "c", "d", "e", "f", "g", "h", "26", "27", "1a", "1A", "zz"]


async def _submissions(store: Store, login: str, ids: Sequence[str]) -> None:
    await store.record_submissions(
        [Submission(login, m, "+34600000001", submitted_at=SUBMITTED) for m in ids]
    )


async def fill(dsn: str) -> None:
    """The corpus, in one order, into the store at `dsn`."""
    early, live, _ = corpus()
    store = await Store.open(dsn, pool_size=1)
    try:
        await store.ingest(LOGIN, early)
        await _submissions(store, LOGIN, ["w1", "a", "b", "c", "d", "e", "f", "g", "h"])
        await store.ingest(LOGIN, live[:7])
        await store.ingest(LOGIN, live[7:])
    finally:
        await store.close()
    hexed = await Store.open(dsn, pool_size=1, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await hexed.ingest(HEX_LOGIN, hex_corpus()[0])
        await _submissions(hexed, HEX_LOGIN, ["26", "27"])
    finally:
        await hexed.close()


async def more_traffic(dsn: str) -> None:
    store = await Store.open(dsn, pool_size=1)
    try:
        await store.ingest(LOGIN, corpus()[2])
    finally:
        await store.close()
    hexed = await Store.open(dsn, pool_size=1, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await hexed.ingest(HEX_LOGIN, hex_corpus()[1])
    finally:
        await hexed.close()


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in _WRITER_SPECIFIC}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


async def answers(dsn: str) -> dict[str, Any]:
    """What `dlrfeed show` (every message of the corpus), `stats` and `exceptions` say."""
    conn = await asyncpg.connect(dsn)
    try:
        found: dict[str, Any] = _timeless(
            {
                "show": {m: await message_reports(conn, m, None) for m in MESSAGE_IDS},
                "stats": [await statistics(conn, login) for login in (None, LOGIN, HEX_LOGIN)],
                "exceptions": await list_exceptions(conn, include_resolved=True, limit=1000),
            }
        )
        return found
    finally:
        await conn.close()


async def recomputed(dsn: str) -> dict[str, Any]:
    """`dlrfeed recompute` of every status, each made stale and wrong first, so that each is
    computed again from its deliveries, replayed: its result, the statuses and the audit."""
    conn = await asyncpg.connect(dsn)
    try:
        # The statuses' table: dlr.message_status itself before migration 0019, its rows table
        # (whose reason may be held by id) after.
        by_id = await conn.fetchval("SELECT to_regclass('dlr.message_status_rows') IS NOT NULL")
        await conn.execute(
            f"UPDATE dlr.message_status{'_rows' if by_id else ''} SET status = 'UNKNOWN',"
            f" reason = 'made wrong by the test'{', reason_id = NULL' if by_id else ''},"
            " repeats = 99"
        )
        for login, options in (
            (LOGIN, IntegrationOptions()),
            (HEX_LOGIN, IntegrationOptions(receipt_ids_hex=True)),
        ):
            store = await Store.open(dsn, pool_size=1, options=options)
            try:
                # Each login's statuses under its own options: only its rows are stale.
                await conn.execute(
                    "UPDATE dlr.message_status SET rules_version = 'rules-0' WHERE login = $1",
                    login,
                )
                result = await store.recompute()
            finally:
                await store.close()
            assert result.examined > 0
        statuses = await conn.fetch("SELECT * FROM dlr.message_status ORDER BY login, message_id")
        audit = await conn.fetch(
            "SELECT login, message_id, old_status, new_status, new_is_final, new_reason,"
            " new_supporting_event_id, why FROM dlr.status_recomputations ORDER BY id"
        )
        done: dict[str, Any] = _timeless(
            {
                "statuses": [dict(r) for r in statuses],
                "audit": [dict(r) for r in audit],
            }
        )
        return done
    finally:
        await conn.close()


async def _deferring_rows(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        receptions = await conn.fetchval("SELECT count(*) FROM dlr.receptions WHERE stat IS NULL")
        events = await conn.fetchval("SELECT count(*) FROM dlr.events WHERE correlation_id IS NULL")
        return int(receptions), int(events)
    finally:
        await conn.close()


async def test_show_reports_and_recompute_read_the_same_before_and_after(
    pg_cluster: PgCluster,
) -> None:
    suffix = os.getpid()
    names = [f"leaner_old_{suffix}", f"leaner_copy_{suffix}", f"leaner_new_{suffix}"]
    old = await pg_cluster.create_database(names[0])
    try:
        conn = await asyncpg.connect(old)
        try:
            await install_schema_before(conn, LEANER_ROWS)
        finally:
            await conn.close()
        await fill(old)
        assert await _deferring_rows(old) == (0, 0)  # written whole, as before 0016
        before = await answers(old)
        # The reference recompute, on a copy of the store as it was before the migration.
        copy = await pg_cluster.create_database(names[1], template=names[0])
        recomputed_before = await recomputed(copy)

        await migrate(old)
        assert await answers(old) == before
        lean = await pg_cluster.create_database(names[2])
        await migrate(lean)
        await fill(lean)
        deferring_receptions, own_ids = await _deferring_rows(lean)
        assert deferring_receptions >= 15  # most rows lean
        assert own_ids >= 10
        assert await answers(lean) == before

        await more_traffic(old)
        await more_traffic(lean)
        assert (await _deferring_rows(old))[0] > 0  # new rows defer, old ones stay whole
        after_more = await answers(old)
        assert await answers(lean) == after_more
        assert after_more != before  # the later traffic is there to be compared

        # Recompute reads every delivery back (the replay of late correlation too).
        assert await recomputed(lean) == await recomputed(old)
        # And on the stores without the later traffic: the same as before the migration.
        for name in names[1:]:
            await pg_cluster.drop_database(name)
        lean = await pg_cluster.create_database(names[2])
        await migrate(lean)
        await fill(lean)
        assert await recomputed(lean) == recomputed_before
    finally:
        for name in names:
            await pg_cluster.drop_database(name)
