"""Plans that cannot go bad when the tables grow faster than autovacuum analyzes them.

The first day of an install: a `Store` prepares its statements on an empty database, then drains
a backlog of hundreds of thousands of receipts, then the sending application records 5,000
sent messages. Nothing has analyzed dlr.events in between (autovacuum is switched off on it
here, so the test is what a busy first hour looks like, every time). Late correlation
(`record_submissions`, P10) must still find each waiting event by an index probe per id, never
by reading the table once per id.
"""

from __future__ import annotations

import hashlib
import time

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed_tools.retention_support import receipt

LOGIN = "acme"
BACKLOG = 400_000
SUBMISSIONS = 5_000


def _md5(n: int) -> str:
    """The id the drain gave event n (PostgreSQL's md5(n::text))."""
    return hashlib.md5(str(n).encode(), usedforsecurity=False).hexdigest()


async def _rows_read(db: asyncpg.Connection, other_backend: int) -> int:
    """Rows of dlr.events and dlr.exceptions read so far by sequential scans and fetched by
    index scans, once `other_backend` has flushed its statistics (a backend reports them when
    idle, at most once a second)."""
    deadline = time.monotonic() + 30
    while True:
        await db.execute("SELECT pg_stat_clear_snapshot()")
        idle = await db.fetchval(
            "SELECT state = 'idle' AND state_change < now() - interval '1.5 s'"
            " FROM pg_stat_activity WHERE pid = $1",
            other_backend,
        )
        if idle or time.monotonic() > deadline:
            break
        await db.execute("SELECT pg_sleep(0.2)")
    return int(
        await db.fetchval(
            "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)"
            " FROM pg_stat_user_tables"
            " WHERE schemaname = 'dlr'"
            " AND relname IN ('event_rows', 'message_events', 'exceptions')"
        )
    )


@pytest.mark.parametrize(
    "analyzed",
    [
        pytest.param("dlr.event_rows, dlr.message_events, dlr.exceptions", id="all-analyzed"),
        # A new install's first drain, or autovacuum behind: the open queue has no statistics.
        pytest.param("dlr.event_rows, dlr.message_events", id="exceptions-never-analyzed"),
    ],
)
async def test_late_correlation_after_a_bulk_drain_probes_the_index(
    database_url: str, db: asyncpg.Connection, analyzed: str
) -> None:
    for table in ("event_rows", "message_events", "exceptions"):
        await db.execute(f"ALTER TABLE dlr.{table} SET (autovacuum_enabled = false)")
    store = await Store.open(database_url, pool_size=1)
    try:
        # Day one, empty tables: the statements are prepared and planned (more than the five
        # custom plans after which PostgreSQL may settle on a generic one).
        for n in range(8):
            await store.record_submissions(
                [Submission(LOGIN, f"warm-{n}-{i}", "+34600000001") for i in range(3)]
            )
        # ...and analyzed while they held a few events waiting for their messages (a young
        # store's statistics: three ids, so that an id seems to match a third of the rows).
        await store.ingest(LOGIN, [receipt(f"young-{i}", time.time()) for i in range(3)])
        await db.execute(f"ANALYZE {analyzed}")
        backend = await store._pool.fetchval("SELECT pg_backend_pid()")
        # The drain: BACKLOG events whose messages are not recorded yet (ids like a gateway's,
        # random-looking), each with the delivery that late correlation replays and the
        # `uncorrelated` exception it opened, inserted set-based as the ingest would have left
        # them.
        await db.execute(
            """
            WITH e AS (
                INSERT INTO dlr.event_rows (login, message_id, correlation_id, level, stat, status,
                    fingerprint, parser_version, rules_version, first_received_at,
                    last_received_at)
                SELECT $1, md5(g::text), md5(g::text), 1 + g % 2, 'DELIVRD', 'DELIVERED',
                       md5(g::text || 'f'), 'p', 'r', now(), now()
                FROM generate_series(1, $2::int) AS g
                RETURNING id, login, message_id, level, stat, fingerprint, first_received_at),
            x AS (
                INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id)
                SELECT 'uncorrelated', login, message_id, '{"rule": "P12"}', id FROM e)
            INSERT INTO dlr.reception_rows (delivery_count, received_at, payload, event_id,
                outcome, stat, parser_version, fingerprint)
            SELECT 1, first_received_at, ''::bytea, id,
                   'uncorrelated', stat, 'p', fingerprint
            FROM e
            """,
            LOGIN,
            BACKLOG,
        )
        read_before = await _rows_read(db, backend)
        started = time.monotonic()
        result = await store.record_submissions(
            # Half of them have events waiting (late correlation), half have none yet.
            [
                Submission(LOGIN, _md5(g), "+34600000001")
                for g in range(1, BACKLOG, 2 * BACKLOG // SUBMISSIONS)
            ]
            + [Submission(LOGIN, f"new-{n}", "+34600000001") for n in range(SUBMISSIONS // 2)]
        )
        elapsed = time.monotonic() - started
        read_after = await _rows_read(db, backend)
    finally:
        await store.close()
    assert result.recorded == SUBMISSIONS
    assert result.late_correlated_events == SUBMISSIONS // 2
    # An index probe per id reads the few rows of that id. The plans this guards against read
    # the whole table once per id (2 * 10^9 rows here, minutes of server CPU), or every open
    # exception of the login once per chunk of 500 (a bitmap scan of the partial index).
    assert read_after - read_before < BACKLOG, f"{read_after - read_before} rows read"
    print(f"record_submissions of {SUBMISSIONS} ids after a {BACKLOG} drain: {elapsed:.2f} s")
