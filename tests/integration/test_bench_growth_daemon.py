"""The growth benchmark through the daemon: fakegw and `dlrfeed run` in their own processes,
every receipt taking the feed's path into a real PostgreSQL, the report's counts being the
store's."""

from __future__ import annotations

import os
from typing import Any

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed_tools.bench.growth import grow
from dlrfeed_tools.bench.growth_traffic import BATCHES_PER_ROUND, MESSAGES_PER_BATCH
from dlrfeed_tools.bench.sender_time import SenderClock, sender_dsn
from dlrfeed_tools.pgcluster import PgCluster

ROUND = 2 * MESSAGES_PER_BATCH * BATCHES_PER_ROUND  # about a round's receptions, without repeats


async def test_growth_through_the_daemon_stores_what_it_reports(
    pg_cluster: PgCluster, database_url: str
) -> None:
    reports: list[list[dict[str, Any]]] = []
    profiles: list[dict[str, dict[str, float]]] = []

    def on_step(
        rows: list[dict[str, Any]],
        sizes: dict[str, dict[str, int]],
        row_bytes: dict[str, dict[str, float]],
    ) -> None:
        reports.append(list(rows))
        profiles.append(row_bytes)

    await grow(
        pg_cluster,
        database_url,
        receipts=2 * ROUND,
        step=ROUND,
        log=lambda line: None,
        on_step=on_step,
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
    conn = await asyncpg.connect(database_url)
    try:
        await _check_row_profile(conn, profiles[-1], rows[-1]["stored"])
    finally:
        await conn.close()
    for row in rows:
        assert row["daemon_rss_mb"] > 0
        assert 0 < row["batch_p50_ms"] <= row["batch_p99_ms"]
        assert row["client_cpu_us"] > 0
        # The slowest record_submissions of the step, profiled: its own CPU, the others' and
        # the idle time of the CPUs meanwhile are measured, and its own CPU cannot be more
        # than two processes' (the bench and its backend) worth of its wall time.
        slowest = row["submissions_max_ms"]
        assert 0 < row["submissions_max_cpu_ms"] <= 2 * slowest
        assert row["submissions_max_others_cpu_ms"] >= 0
        assert row["submissions_max_idle_ms"] >= 0
        # ...and sampled: every sample is labelled, the shares add up to the whole.
        assert sum(row["submissions_max_waits"].values()) == pytest.approx(1, abs=0.03)


_NOT_COLUMNS = ("row", "rows_per_reception")


async def _check_row_profile(
    conn: asyncpg.Connection, profile: dict[str, dict[str, float]], stored: int
) -> None:
    """The row profile, from a sample of each table, measures what the rows hold: the traffic's
    ids are 36-character UUIDs (37 bytes with their length byte) wherever they are stored, the
    evidence's payload is the receipt's bytes as the whole table holds them (a 4-byte length
    before them), and a row is at least its columns plus its tuple header and line pointer."""
    for table in ("receptions", "events", "messages", "message_status", "status_changes"):
        columns = {k: v for k, v in profile[table].items() if k not in _NOT_COLUMNS}
        # A status, a change and an event of a recorded message name their message by its
        # row's id; a reception names its key by its event (no message id of its own, or one
        # stored empty).
        if table == "receptions":
            assert columns.get("message_id", 1.0) == 1.0, columns
        else:
            key = {
                "message_status": ("message_ref", 8.0),
                "status_changes": ("message_ref", 8.0),
                "events": ("message_ref", 8.0),
            }.get(table, ("message_id", 37.0))
            assert columns[key[0]] == key[1], table
        assert profile[table]["row"] >= sum(columns.values()) + 24 + 4, table
    receptions = {k: v for k, v in profile["receptions"].items() if k not in _NOT_COLUMNS}
    assert max(receptions, key=receptions.__getitem__) == "payload"
    payload = float(await conn.fetchval("SELECT avg(octet_length(payload)) FROM dlr.receptions"))
    assert receptions["payload"] == pytest.approx(payload + 4, abs=2)
    # Tables this small are sampled whole: their rows per reception are exact.
    # (Of the events, those kept under their message: the others wait for theirs.)
    stored_in = {"events": "message_events"}
    for table in ("receptions", "events", "messages", "message_status", "status_changes"):
        relation = stored_in.get(table, table)
        exact = int(await conn.fetchval(f"SELECT count(*) FROM dlr.{relation}")) / stored
        assert profile[table]["rows_per_reception"] == pytest.approx(exact, abs=0.001), table


async def _counts(conn: asyncpg.Connection, query: str) -> dict[str, int]:
    return {str(key): int(count) for key, count in await conn.fetch(query)}


async def test_the_sender_clock_counts_the_backends_of_the_senders_connections(
    database_url: str,
) -> None:
    store = await Store.open(sender_dsn(database_url), pool_size=2)
    monitor = await asyncpg.connect(database_url)
    try:
        clock = SenderClock(monitor)
        before = await clock.read()
        backends = set(before.run_ns) - {os.getpid()}
        assert backends  # the pool's connection, found by its application_name
        await store.record_submissions(
            [Submission("acme", f"clock-{i}", "+34600123456") for i in range(2_000)]
        )
        after = await clock.read()
        # The inserts ran in a backend of the sender's: its time on a core grew.
        assert any(after.run_ns[pid] > before.run_ns[pid] for pid in backends)
        call = SenderClock.between(before, after)
        assert call.cpu_ms > 0
        # ...and the CPUs' counters saw it (2,000 inserts take more than a clock tick).
        assert after.busy_ticks > before.busy_ticks
    finally:
        await monitor.close()
        await store.close()
