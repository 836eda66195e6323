"""The contract floor benchmark: its copy holds exactly the public columns of what the store
holds, every status where the store's is, and its figures are read off both schemas."""

from __future__ import annotations

import asyncpg

from dlrfeed.store import Store
from dlrfeed_testing.bench.contract_floor import FLOOR_SCHEMA, build_floor, compare, floor_sizes
from dlrfeed_testing.bench.growth_profile import table_sizes
from dlrfeed_testing.bench.growth_traffic import Traffic, ingest_rounds

# A row of each table as the floor keeps it, on both sides: the same rows, in any order.
_SAME_ROWS = {
    "messages": "login, message_id, internal_id, destination, submitted_at",
    "events": "login, message_id, level, stat, status, times_received",
    "receptions": "login, message_id, level, delivery_count, received_at, payload, channel",
    "message_status": "login, message_id, status, is_final, reason",
    "status_changes": "position, login, message_id, status, is_final, reason, previous_status",
    "exceptions": "kind, login, message_id, details, opened_at, resolved_at",
}


async def test_the_floor_keeps_the_public_columns_of_every_row(
    store: Store, db: asyncpg.Connection
) -> None:
    stored = await ingest_rounds(store, Traffic(seed=30), 10_000)
    await build_floor(db)
    for table, columns in _SAME_ROWS.items():
        differing = await db.fetchval(
            f"SELECT count(*) FROM ((SELECT {columns} FROM dlr.{table}"
            f" EXCEPT ALL SELECT {columns} FROM {FLOOR_SCHEMA}.{table})"
            f" UNION ALL (SELECT {columns} FROM {FLOOR_SCHEMA}.{table}"
            f" EXCEPT ALL SELECT {columns} FROM dlr.{table})) AS d"
        )
        assert differing == 0, table
        assert await db.fetchval(f"SELECT count(*) FROM {FLOOR_SCHEMA}.{table}") > 0, table

    figures = compare(stored, await table_sizes(db), await floor_sizes(db))
    assert figures["receptions"] == await db.fetchval("SELECT count(*) FROM dlr.receptions")
    # The floor holds fewer columns and indexes of the same rows, so it is smaller table by
    # table; its receptions' index (by message id, where dlrfeed's days are keyed by event) is
    # counted beside its receptions, and part of its total.
    for table in _SAME_ROWS.keys() - {"receptions"}:
        by_table = figures["by_table"][table]
        assert 0 < by_table["floor"] < by_table["dlrfeed"], table
    floor_receptions = figures["floor_relations"]["receptions"]
    assert 0 < floor_receptions < figures["by_table"]["receptions"]["dlrfeed"]
    assert 0 < figures["floor_without_reception_index"] < figures["floor_total"]
    assert figures["floor_total"] < figures["dlrfeed_total"]
