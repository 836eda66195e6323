"""The disk floor benchmark: each floor's copy holds exactly the columns it names of what the
store holds, every status where the store's is, and its figures are read off the schemas."""

from __future__ import annotations

import asyncpg

from dlrfeed.store import Store
from dlrfeed_tools.bench.contract_floor import (
    CONTRACT_FLOOR,
    FLOORS,
    LEAN_FLOOR,
    REQUIRED_FLOOR,
    Floor,
    build_floor,
    compare,
    floor_sizes,
)
from dlrfeed_tools.bench.growth_profile import STORED_IN, table_sizes
from dlrfeed_tools.bench.growth_traffic import Traffic, ingest_rounds

# The statuses as stored (under their message row's id), with the key the
# floors keep them by.
_STATUSES_WITH_KEYS = (
    "(SELECT m.login, m.message_id, s.* FROM dlr.statuses AS s"
    " JOIN dlr.messages AS m ON m.id = s.message_ref) AS s"
)


def _columns(floor: Floor) -> dict[str, list[str]]:
    """Each table of the floor and its columns, every one named as in dlr's table."""
    columns = {
        name: [column.strip() for column in table.source.split(",")]
        for name, table in floor.copied.items()
    }
    columns["message_status"] = [c.name for c in floor.status_columns]
    return columns


async def test_each_floor_keeps_its_columns_of_every_row(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    stored = await ingest_rounds(store, Traffic(seed=30), 10_000)
    sizes: dict[str, dict[str, dict[str, int]]] = {}
    for floor in FLOORS:
        await build_floor(database_url, floor)
        for table, names in _columns(floor).items():
            copy = f"{floor.schema}.{table}"
            copied = floor.copied.get(table)
            if copied:
                source = copied.stored_in or f"dlr.{table}"
            elif table == "message_status":
                source = _STATUSES_WITH_KEYS
            else:
                source = f"dlr.{STORED_IN[table]}"
            if not floor.copies_values:
                # Stand-ins of the values' width: the same rows, counted.
                store_rows = await db.fetchval(f"SELECT count(*) FROM {source}")
                floor_rows = await db.fetchval(f"SELECT count(*) FROM {copy}")
                assert floor_rows == store_rows > 0, copy
                continue
            # The floor holds these columns and no other.
            held = await db.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                copy,
            )
            assert [r["attname"] for r in held] == names, copy
            # The store's updated_at also moves when a repeat only counts (no change is
            # written); the floor's is when the status last changed.
            columns = ", ".join(n for n in names if n != "updated_at")
            differing = await db.fetchval(
                f"SELECT count(*) FROM ((SELECT {columns} FROM {source}"
                f" EXCEPT ALL SELECT {columns} FROM {copy})"
                f" UNION ALL (SELECT {columns} FROM {copy}"
                f" EXCEPT ALL SELECT {columns} FROM {source})) AS d"
            )
            assert differing == 0, copy
            assert await db.fetchval(f"SELECT count(*) FROM {copy}") > 0, copy
        sizes[floor.schema] = await floor_sizes(db, floor)

    figures = compare(stored, await table_sizes(db), sizes)
    assert figures["receptions"] == await db.fetchval("SELECT count(*) FROM dlr.receptions")
    contract, required, lean = CONTRACT_FLOOR.schema, REQUIRED_FLOOR.schema, LEAN_FLOOR.schema
    # Each floor holds fewer columns and indexes of the same rows than the store, and the
    # required floor more than the contract's, table by table; the contract floor's receptions
    # are indexed by message id (the store's days and the required floor's by event), so its
    # receptions compare without that index.
    # dlrfeed's change log names each message by its row id, the floors' by the login and
    # message id the public schema names: the store's takes less. So do the events of a
    # recorded message, kept under its row's id.
    named_by_reference = {"receptions", "status_changes", "events"}
    for table, by_table in figures["by_table"].items():
        if table not in named_by_reference:
            assert 0 < by_table[contract] <= by_table[required] < by_table["dlrfeed"], table
    changes = figures["by_table"]["status_changes"]
    assert 0 < changes[contract] <= changes[required]
    assert changes["dlrfeed"] < changes[required]
    events = figures["by_table"]["events"]
    assert 0 < events[contract] <= events[required]
    assert events["dlrfeed"] < events[required]
    receptions = figures["by_table"]["receptions"]
    contract_receptions = figures["relations"][contract]["receptions"]["(table)"]
    assert 0 < contract_receptions < receptions[required]
    # dlrfeed's name their login, message id and level by their event: less
    # than the floors', which hold the columns the public schema names on dlr.receptions.
    assert receptions["dlrfeed"] < receptions[required]
    total = figures["total"]
    assert figures["contract_floor_without_reception_index"] < total[contract]
    assert total[contract] < total[required] < total["dlrfeed"]
    # The lean layout holds the required columns in fewer bytes.
    assert total[lean] < total[required]
