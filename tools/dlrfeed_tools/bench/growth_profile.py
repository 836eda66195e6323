"""What the growth benchmark reads off the server: its CPU, WAL position and checkpoints, the
bytes on disk of each growing table and index (the disk profile), and where a row's bytes go,
column by column, from a sample of each table (the row profile)."""

from __future__ import annotations

import re

import asyncpg

from dlrfeed.store.retention import DAY_PARTITIONED
from dlrfeed_tools.bench.store_ab import cluster_cpu_seconds
from dlrfeed_tools.pgcluster import PgCluster


def server_cpu_seconds(cluster: PgCluster) -> float:
    """CPU (user + system) of the cluster's processes so far: the postmaster, the exited
    children it reaped, and the live ones (backends, checkpointer, WAL writer, autovacuum)."""
    return cluster_cpu_seconds(cluster.datadir)


async def wal_lsn(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def checkpoints(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
    )


GROWING_TABLES = (
    "receptions",
    "events",
    "messages",
    "message_status",
    "status_changes",
    "exceptions",
)
# Where a growing table's rows are stored when its name in dlr is a view of them (migrations
# 0018 to 0020: dlr.status_changes and dlr.message_status show their rows tables with the
# reasons' texts), as retention and the store know them. The reports keep the readers' name;
# sizes and row profiles are the stored table's. The statuses of messages recorded before
# migration 0020 stay in a table of their own (none on a store created since): counted in the
# sizes, not sampled for the row profile.
STORED_IN = {p.table: p.parent for p in DAY_PARTITIONED} | {
    "message_status": "statuses",
    "events": "message_events",
}
ALSO_STORED_IN = {"message_status": "earlier_statuses", "events": "event_rows"}
# A partition's name is its table's with the day (or "_default") after it.
_PARTITION_DAY = re.compile(r"_(before_)?[0-9]{8}|_default")
LINE_POINTER_BYTES = 4  # each row's slot in its page, besides the row itself

# Bytes on disk of each growing table of dlr, summed over its partitions: the table itself
# (heap, TOAST, free-space and visibility maps) and each index, whose per-partition names lose
# their day so that one index of a partitioned table is one line.
SIZES_BY_RELATION = """
WITH tables AS (
    SELECT t.name, ('dlr.' || t.stored_in)::regclass AS relid
    FROM unnest($1::text[], $3::text[]) AS t(name, stored_in)
), parts AS (
    SELECT tables.name, p.relid
    FROM tables, LATERAL pg_partition_tree(tables.relid) AS p
    WHERE p.isleaf
    UNION ALL
    SELECT tables.name, tables.relid
    FROM tables JOIN pg_class AS c ON c.oid = tables.relid
    WHERE c.relkind = 'r'
)
SELECT parts.name AS table_name, '(table)' AS relation, sum(pg_table_size(parts.relid)) AS bytes
FROM parts GROUP BY parts.name
UNION ALL
SELECT parts.name, regexp_replace(c.relname, $2, ''),
       sum(pg_relation_size(c.oid))
FROM parts
JOIN pg_index AS x ON x.indrelid = parts.relid
JOIN pg_class AS c ON c.oid = x.indexrelid
GROUP BY 1, 2
"""

# A guess at the rows of each growing table, summed over its partitions, to size its sample:
# the statistics' live-row counts, which may trail the last commits by far (they are flushed
# and re-estimated lazily), so the profile counts rows from its sample instead.
LIVE_ROWS = """
SELECT relname, n_live_tup
FROM pg_stat_user_tables
WHERE schemaname IN ('dlr', 'dlr_partitions')
"""

# Rows sampled per table for its row profile: whole pages (SYSTEM), each page with the same
# probability, so the sample costs a few thousand page reads at any table size and is the
# same for the same pages (REPEATABLE). Its row count scaled up estimates the table's: exactly
# when the table is small enough to be read whole; on a large one pages hold unequal numbers of
# rows, and it was measured 1-5 % off on a 4.8 M-row table (four seeds, 1 % of its pages).
PROFILE_SAMPLE_ROWS = 50_000


async def table_sizes(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    sizes: dict[str, dict[str, int]] = {}
    pairs = [(t, STORED_IN.get(t, t)) for t in GROWING_TABLES] + list(ALSO_STORED_IN.items())
    rows = await conn.fetch(
        SIZES_BY_RELATION,
        [name for name, _ in pairs],
        _PARTITION_DAY.pattern,
        [stored_in for _, stored_in in pairs],
    )
    for r in rows:
        sizes.setdefault(r["table_name"], {})[r["relation"]] = int(r["bytes"])
    return sizes


async def row_profile(conn: asyncpg.Connection, stored: int) -> dict[str, dict[str, float]]:
    """Where the bytes of each growing table's rows go: per table, its rows per reception
    stored, the mean bytes of a row (PostgreSQL's tuple header and the 4-byte line pointer
    included) and of each of its columns, from a sample of its pages. Names the floor under
    the disk per reception: what a row holds, not only how big each table is."""
    if not stored:
        return {}
    live: dict[str, int] = {}
    shown_as = {
        stored_in: table for table, stored_in in [*STORED_IN.items(), *ALSO_STORED_IN.items()]
    }
    for r in await conn.fetch(LIVE_ROWS):
        # A day's name is its table's with the day after it; the statuses' tables are named
        # apart from their view.
        table = _PARTITION_DAY.sub("", str(r["relname"]))
        table = shown_as.get(table, table)
        live[table] = live.get(table, 0) + int(r["n_live_tup"])
    profile: dict[str, dict[str, float]] = {}
    for table in GROWING_TABLES:
        relation = f"dlr.{STORED_IN.get(table, table)}"
        columns = [
            str(r["attname"])
            for r in await conn.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                relation,
            )
        ]
        percent = min(100.0, 100.0 * PROFILE_SAMPLE_ROWS / max(live.get(table, 0), 1))
        # A NULL takes no bytes of the row (only its bit in the row's null bitmap).
        means = ", ".join(f'avg(coalesce(pg_column_size(t."{c}"), 0))' for c in columns)
        sampled = await conn.fetchrow(
            f"SELECT count(*), avg(pg_column_size(t.*)), {means} FROM {relation} AS t"
            f" TABLESAMPLE SYSTEM ({percent}) REPEATABLE (16)"
        )
        if sampled is None or not sampled[0]:
            continue
        profile[table] = {
            "rows_per_reception": round(sampled[0] * 100.0 / percent / stored, 3),
            "row": round(float(sampled[1]) + LINE_POINTER_BYTES, 1),
            **{
                column: round(float(mean), 1)
                for column, mean in zip(columns, list(sampled)[2:], strict=True)
                if mean  # a column NULL in every row sampled holds nothing
            },
        }
    return profile
