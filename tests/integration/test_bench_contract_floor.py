"""The disk floor benchmark: each floor's copy holds exactly the columns it names of what the
store holds, every status where the store's is, and its figures are read off the schemas."""

from __future__ import annotations

import asyncpg

from dlrfeed.store import Store
from dlrfeed_testing.bench.contract_floor import (
    CONTRACT_FLOOR,
    FLOORS,
    REQUIRED_FLOOR,
    Floor,
    build_floor,
    compare,
    floor_sizes,
)
from dlrfeed_testing.bench.growth_profile import table_sizes
from dlrfeed_testing.bench.growth_traffic import Traffic, ingest_rounds


def _columns(floor: Floor) -> dict[str, str]:
    """Each table's columns in the floor, as a select list of dlr's table of the same name."""
    columns = {name: table.source for name, table in floor.copied.items()}
    # The floor's updated_at is when the status last changed: the store's is written with it.
    columns["message_status"] = ", ".join(
        name for name, _, _ in floor.status_columns if name != "updated_at"
    )
    return columns


async def test_each_floor_keeps_its_columns_of_every_row(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    stored = await ingest_rounds(store, Traffic(seed=30), 10_000)
    sizes = {}
    for floor in FLOORS:
        await build_floor(database_url, floor)
        for table, columns in _columns(floor).items():
            copy = f"{floor.schema}.{table}"
            differing = await db.fetchval(
                f"SELECT count(*) FROM ((SELECT {columns} FROM dlr.{table}"
                f" EXCEPT ALL SELECT {columns} FROM {copy})"
                f" UNION ALL (SELECT {columns} FROM {copy}"
                f" EXCEPT ALL SELECT {columns} FROM dlr.{table})) AS d"
            )
            assert differing == 0, copy
            assert await db.fetchval(f"SELECT count(*) FROM {copy}") > 0, copy
        sizes[floor.schema] = await floor_sizes(db, floor)

    figures = compare(stored, await table_sizes(db), sizes)
    assert figures["receptions"] == await db.fetchval("SELECT count(*) FROM dlr.receptions")
    contract, required = CONTRACT_FLOOR.schema, REQUIRED_FLOOR.schema
    # Each floor holds fewer columns and indexes of the same rows than the store, and the
    # required floor more than the contract's, table by table; the contract floor's receptions
    # are indexed by message id (the store's days and the required floor's by event), so its
    # receptions compare without that index.
    for table, by_table in figures["by_table"].items():
        if table != "receptions":
            assert 0 < by_table[contract] <= by_table[required] < by_table["dlrfeed"], table
    receptions = figures["by_table"]["receptions"]
    assert 0 < figures["relations"][contract]["receptions"] < receptions[required]
    assert receptions[required] < receptions["dlrfeed"]
    total = figures["total"]
    assert figures["contract_floor_without_reception_index"] < total[contract]
    assert total[contract] < total[required] < total["dlrfeed"]
