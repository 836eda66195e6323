"""The growth benchmark through the daemon: fakegw and `dlrfeed run` in their own processes,
every receipt taking the feed's path into a real PostgreSQL, the report's counts being the
store's."""

from __future__ import annotations

from typing import Any

import asyncpg

from dlrfeed_testing.bench.growth import BATCHES_PER_ROUND, MESSAGES_PER_BATCH, grow
from dlrfeed_testing.pgcluster import PgCluster

ROUND = 2 * MESSAGES_PER_BATCH * BATCHES_PER_ROUND  # about a round's receptions, without repeats


async def test_growth_through_the_daemon_stores_what_it_reports(
    pg_cluster: PgCluster, database_url: str
) -> None:
    reports: list[list[dict[str, Any]]] = []
    await grow(
        pg_cluster,
        database_url,
        receipts=2 * ROUND,
        step=ROUND,
        log=lambda line: None,
        on_step=lambda rows, sizes: reports.append(list(rows)),
        driver_kind="daemon",
    )
    rows = reports[-1]
    assert len(rows) >= 2
    conn = await asyncpg.connect(database_url)
    try:
        outcomes = await _counts(conn, "SELECT outcome, count(*) FROM dlr.receptions GROUP BY 1")
        statuses = await _counts(conn, "SELECT status, count(*) FROM dlr.message_status GROUP BY 1")
        open_exceptions = await conn.fetchval(
            "SELECT count(*) FROM dlr.exceptions WHERE resolved_at IS NULL"
        )
    finally:
        await conn.close()
    # Every receipt handed to the gateway was acked only once stored, and stored once.
    assert sum(outcomes.values()) == rows[-1]["stored"]
    # The ~5 % redeliveries are recognised as repeats, not applied twice.
    assert 0.03 < outcomes["repeat"] / rows[-1]["stored"] < 0.07
    # Results follow progress by a batch: every message but the last batch's is delivered,
    # and the late-recorded ones were correlated when recorded (none left waiting, but the
    # last round's, which are recorded in the round that never comes).
    assert statuses["DELIVERED"] >= 2 * MESSAGES_PER_BATCH * (BATCHES_PER_ROUND - 1)
    assert open_exceptions <= 2 * ROUND * 0.02
    for row in rows:
        assert row["daemon_rss_mb"] > 0
        assert 0 < row["batch_p50_ms"] <= row["batch_p99_ms"]
        assert row["client_cpu_us"] > 0


async def _counts(conn: asyncpg.Connection, query: str) -> dict[str, int]:
    return {str(key): int(count) for key, count in await conn.fetch(query)}
