"""The disk floor of the public schema: what a store grown on the growth benchmark's traffic
would take per reception if it kept only what the public schema names, beside what dlrfeed
takes on the same rows.

The public schema (docs/spec/interfaces.md §4, and docs/changes.md for the change log) names,
per table, its key and its must-have columns. This grows a store as the growth benchmark does
(its loop and traffic, through fakegw and a `dlrfeed run` daemon by default, on a throwaway
cluster with PostgreSQL's defaults), then copies those columns and nothing else into tables of
a schema of their own, `contract_floor`, with the keys named and no other index, written as
the store wrote them:
- sent messages, logical events, receptions, changes and exceptions in the order they were
  stored (the random-keyed indexes fill as they do in production: ~70 %, not the ~90 % of a
  fresh build);
- each message's status inserted by its first change and updated in place by each later one,
  a few hundred messages per transaction, as the ingest writes them (so the status table has
  the dead versions and free space an updated table has, at the same fillfactor).
A reception has no key of its own in the public schema; the floor's receptions are reported
without an index and, beside that, with the one index reading a message's deliveries needs
(`dlrfeed show`, late correlation), on (login, message_id, level).

What the floor leaves out is what docs/spec/processing.md also asks of the store: the parser
and rules versions of every row (P8), a reception's storing time beside its receipt time, the
link from a delivery to its event, the basis of a status and its counters, the change log's
previous finality and reason, the investigation queue's resolutions and indexes. So a target
below the floor cannot be met by any layout of these tables; one a little above it leaves
that much for all of those. Measures and reports; asserts nothing.

    python scripts/bench_floor.py [--receptions 1000000] [--driver store]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.store.migrate import migrate
from dlrfeed_testing.bench.growth import grow
from dlrfeed_testing.bench.growth_configs import config_cluster
from dlrfeed_testing.bench.growth_drivers import DRIVERS
from dlrfeed_testing.bench.growth_profile import table_sizes

FLOOR_SCHEMA = "contract_floor"
STATUS_CHUNK = 500  # messages per status transaction: about one ingest batch's

# The public schema's columns and keys only (docs/spec/interfaces.md §4, docs/changes.md).
_CREATE = f"""
DROP SCHEMA IF EXISTS {FLOOR_SCHEMA} CASCADE;
CREATE SCHEMA {FLOOR_SCHEMA};
CREATE TABLE {FLOOR_SCHEMA}.messages (
    login text NOT NULL, message_id text NOT NULL, internal_id text NOT NULL,
    destination text NOT NULL, submitted_at timestamptz,
    UNIQUE (login, message_id));
CREATE TABLE {FLOOR_SCHEMA}.events (
    login text NOT NULL, message_id text NOT NULL, level bigint NOT NULL, stat text NOT NULL,
    status text NOT NULL, times_received integer NOT NULL,
    UNIQUE (login, message_id, level));
CREATE TABLE {FLOOR_SCHEMA}.receptions (
    login text NOT NULL, message_id text NOT NULL, level bigint NOT NULL,
    delivery_count bigint NOT NULL, received_at timestamptz NOT NULL, payload bytea NOT NULL,
    channel dlr.reception_channel NOT NULL);
CREATE INDEX receptions_by_message ON {FLOOR_SCHEMA}.receptions (login, message_id, level);
-- dlrfeed's fillfactor: the space an update in place needs (docs/postgresql.md).
CREATE TABLE {FLOOR_SCHEMA}.message_status (
    login text NOT NULL, message_id text NOT NULL, status text NOT NULL,
    is_final boolean NOT NULL, reason text NOT NULL, updated_at timestamptz NOT NULL,
    PRIMARY KEY (login, message_id)) WITH (fillfactor = 80);
CREATE TABLE {FLOOR_SCHEMA}.status_changes (
    position numeric PRIMARY KEY, login text NOT NULL, message_id text NOT NULL, status text,
    is_final boolean NOT NULL, reason text NOT NULL, previous_status text,
    changed_at timestamptz NOT NULL);
CREATE TABLE {FLOOR_SCHEMA}.exceptions (
    kind text NOT NULL, login text NOT NULL, message_id text, details jsonb NOT NULL,
    opened_at timestamptz NOT NULL, resolved_at timestamptz);
"""

_FILL = (
    f"INSERT INTO {FLOOR_SCHEMA}.messages"
    " SELECT login, message_id, internal_id, destination, submitted_at"
    " FROM dlr.messages ORDER BY id",
    f"INSERT INTO {FLOOR_SCHEMA}.events"
    " SELECT login, message_id, level, stat, status, times_received FROM dlr.events ORDER BY id",
    f"INSERT INTO {FLOOR_SCHEMA}.receptions"
    " SELECT login, message_id, level, delivery_count, received_at, payload, channel"
    " FROM dlr.receptions ORDER BY id",
    f"INSERT INTO {FLOOR_SCHEMA}.status_changes"
    " SELECT position, login, message_id, status, is_final, reason, previous_status, changed_at"
    " FROM dlr.status_changes ORDER BY position",
    f"INSERT INTO {FLOOR_SCHEMA}.exceptions"
    " SELECT kind, login, message_id, details, opened_at, resolved_at"
    " FROM dlr.exceptions ORDER BY id",
)

# Every change that set a status, in the log's order (a withdrawal, status NULL, sets none:
# the growth traffic has no recompute to withdraw one).
_CHANGES = """
SELECT login, message_id, status, is_final, reason, changed_at
FROM dlr.status_changes WHERE status IS NOT NULL ORDER BY position
"""

_UPSERT_STATUSES = f"""
INSERT INTO {FLOOR_SCHEMA}.message_status
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::text[],
                     $6::timestamptz[])
ON CONFLICT (login, message_id) DO UPDATE SET
    status = EXCLUDED.status, is_final = EXCLUDED.is_final, reason = EXCLUDED.reason,
    updated_at = EXCLUDED.updated_at
"""

# Measured as the growth benchmark measures dlr (growth_profile.SIZES_BY_RELATION): a table
# with its TOAST, free-space and visibility maps, an index on its own.
_SIZES = f"""
SELECT c.relname,
       CASE c.relkind WHEN 'r' THEN pg_table_size(c.oid) ELSE pg_relation_size(c.oid) END
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = '{FLOOR_SCHEMA}' AND c.relkind IN ('r', 'i')
"""


async def build_floor(conn: asyncpg.Connection) -> None:
    """Copy the public columns of the store at `conn` into the schema `contract_floor`."""
    await conn.execute(_CREATE)
    for statement in _FILL:
        await conn.execute(statement)
    changes = await conn.fetch(_CHANGES)
    for start in range(0, len(changes), STATUS_CHUNK):
        # One row per message in a statement (ON CONFLICT updates a row once): its latest.
        latest = {(r["login"], r["message_id"]): r for r in changes[start : start + STATUS_CHUNK]}
        rows = list(latest.values())
        await conn.execute(_UPSERT_STATUSES, *([r[column] for r in rows] for column in range(6)))


async def floor_sizes(conn: asyncpg.Connection) -> dict[str, int]:
    """Bytes on disk of each table (with its TOAST) and index of the floor."""
    return {str(r[0]): int(r[1]) for r in await conn.fetch(_SIZES)}


def compare(
    stored: int, dlrfeed: dict[str, dict[str, int]], floor: dict[str, int]
) -> dict[str, Any]:
    """Bytes per reception stored, by table, of dlrfeed's store (tables and their indexes) and
    of the floor; the floor's total with and without the receptions' index."""
    per_table: dict[str, dict[str, float]] = {}
    for table, relations in sorted(dlrfeed.items()):
        floor_bytes = sum(b for name, b in floor.items() if name.startswith(table))
        per_table[table] = {
            "dlrfeed": round(sum(relations.values()) / stored, 1),
            "floor": round(floor_bytes / stored, 1),
        }
    reception_index = floor["receptions_by_message"] / stored
    floor_total = sum(floor.values()) / stored
    return {
        "receptions": stored,
        "by_table": per_table,
        "dlrfeed_total": round(sum(t["dlrfeed"] for t in per_table.values()), 1),
        "floor_total": round(floor_total, 1),
        "floor_without_reception_index": round(floor_total - reception_index, 1),
        "floor_relations": {name: round(b / stored, 1) for name, b in sorted(floor.items())},
    }


async def measure(receptions: int, driver_kind: str, root: Path) -> dict[str, Any]:
    """Grow a store to `receptions` as the growth benchmark does (its loop, its traffic, the
    receipts handed over by `driver_kind`) on a throwaway cluster with PostgreSQL's defaults,
    and compare it with its floor."""
    cluster = config_cluster("default", root)
    cluster.init()
    cluster.start()
    try:
        dsn = await cluster.create_database("floor")
        await migrate(dsn)
        await grow(
            cluster, dsn, receptions, receptions, _quiet, _ignore_step, driver_kind=driver_kind
        )
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SET client_min_messages = warning")
            await build_floor(conn)
            stored = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
            figures = compare(stored, await table_sizes(conn), await floor_sizes(conn))
            return {"driver": driver_kind, **figures}
        finally:
            await conn.close()
    finally:
        cluster.destroy()


def _quiet(line: str) -> None:
    """The growth loop's log lines: this benchmark reports only its comparison."""


def _ignore_step(
    rows: list[dict[str, Any]], sizes: dict[str, dict[str, int]], profile: dict[str, Any]
) -> None:
    """The growth loop's step reports: the comparison reads the sizes once, at the end."""


def main(argv: list[str] | None = None) -> int:
    """Measure and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receptions", type=int, default=1_000_000)
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        default="daemon",
        help="hand the receipts to a dlrfeed run daemon through fakegw (as `make bench-growth`"
        " does), or to a Store directly",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as root:
        result = asyncio.run(measure(args.receptions, args.driver, Path(root)))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
