"""Migration 0010 on an installed store: a million receptions move to the partitioned layout.

The store is built at the schema before 0010 and filled set-based (no daemon: the point is the
migration's cost on a populated table, not the ingest). `dlrfeed migrate` must keep every row,
byte for byte, without copying the table: the old table becomes the first partition, with its
index, and the next receptions land in the partitions of their days.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.store import Store
from dlrfeed.store.migrate import available_migrations, current_version, migrate
from dlrfeed.store.sql import query
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.retention_support import install_schema_before, plan_of, receipt

PARTITIONING = 10  # the migration under test
RECEPTIONS = 1_000_000
_numbers = itertools.count(1)
DIGEST = "SELECT count(*), sum(id), sum(length(payload)) FROM dlr.receptions"


@pytest.fixture
async def installed_store(pg_cluster: PgCluster) -> AsyncIterator[str]:
    """A database at the last schema before 0010, holding RECEPTIONS receptions of 30 days."""
    name = f"installed_{os.getpid()}_{next(_numbers)}"
    dsn = await pg_cluster.create_database(name)
    conn = await asyncpg.connect(dsn)
    try:
        await install_schema_before(conn, PARTITIONING)
        # ~300-byte receipts with random-looking ids, received over the last 30 days.
        await conn.execute(
            """
            INSERT INTO dlr.receptions (id, login, message_id, level, stat, err, delivery_count,
                received_at, payload, outcome, event_id, parser_version)
            SELECT g, 'acme', md5(g::text), 1 + g % 2, 'DELIVRD', '000', 1,
                   now() - (g % 2592000) * interval '1 s',
                   convert_to(repeat(md5(g::text), 8), 'UTF8'), 'applied', g, 'p1'
            FROM generate_series(1, $1::int) AS g
            """,
            RECEPTIONS,
        )
        await conn.execute("SELECT setval('dlr.receptions_id_seq', $1)", RECEPTIONS)
    finally:
        await conn.close()
    yield dsn
    await pg_cluster.drop_database(name)


@pytest.mark.slow  # 40-80 s on a shared machine, most of it filling the million rows
async def test_a_populated_store_migrates_in_place_keeping_every_row(installed_store: str) -> None:
    conn = await asyncpg.connect(installed_store)
    try:
        before = await conn.fetchrow(DIGEST)
        table_file = await conn.fetchval("SELECT pg_relation_filenode('dlr.receptions')")
        started = time.monotonic()
        applied = await migrate(installed_store)
        elapsed = time.monotonic() - started
        assert applied == [m.name for m in available_migrations() if m.version >= PARTITIONING]
        assert await current_version(conn) == available_migrations()[-1].version
        assert before is not None
        assert await conn.fetchrow(DIGEST) == before
        assert before[0] == RECEPTIONS
        first = await conn.fetchrow(
            "SELECT partition_name, lower_bound, upper_bound FROM dlr.day_partitions"
            " WHERE parent_table = 'reception_rows' AND lower_bound IS NULL AND NOT is_default"
        )
        assert first is not None
        assert first["partition_name"].startswith("receptions_before_")
        moved = await conn.fetchval(
            f"SELECT count(*) FROM dlr_partitions.{first['partition_name']}"
        )
        assert moved == RECEPTIONS
        # In place: the first partition is the very file the table was, not a copy of it.
        assert table_file == await conn.fetchval(
            "SELECT pg_relation_filenode($1::regclass)",
            f"dlr_partitions.{first['partition_name']}",
        )
        # `show` still finds a message's receptions by the index, in the old table too. It
        # names the message id and the event ids (sql/reports.sql, reception_rows): the days
        # created since 0016 are keyed (event_id, id).
        shown = query("reception_rows").naming(receptions="reception_rows")
        plan = await plan_of(
            conn,
            shown.text,
            *shown.bind(
                logins=["acme"], receipt_ids=["c4ca4238a0b923820dcc509a6f75849b"], event_ids=[1, 2]
            ),
        )
        assert "Seq Scan on receptions" not in plan, plan
        print(f"migration 0010 of {RECEPTIONS} receptions: {elapsed:.1f} s wall")
    finally:
        await conn.close()

    store = await Store.open(installed_store, pool_size=1)
    try:  # the daemon's next batch lands after the old rows, ids from the same sequence
        await store.ingest("acme", [receipt("after-migration", time.time())])
    finally:
        await store.close()
    conn = await asyncpg.connect(installed_store)
    try:
        assert await conn.fetchval("SELECT count(*) FROM dlr.receptions") == RECEPTIONS + 1
        assert await conn.fetchval("SELECT min(id) FROM dlr.receptions WHERE message_id = $1",
                                   "after-migration") > RECEPTIONS  # fmt: skip
    finally:
        await conn.close()
