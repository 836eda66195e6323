"""The disk floor of the store: what a store grown on the growth benchmark's traffic would
take per reception if it kept only what it must, in dlrfeed's layout, beside what dlrfeed takes
on the same rows.

Floors, each a schema of its own holding copies of the grown store's rows:
- `contract_floor`: only the columns the public schema names for each table
  (docs/spec/interfaces.md §4; the change log's as `dlrfeed changes` lists them), with the
  keys it names; the change log keyed by its position, which its readers follow. A reception has no
  key there: the floor counts the one index reading a message's deliveries needs (`dlrfeed
  show`, late correlation), on (login, message_id, level), and reports its total without it too.
- `required_floor`: that, and what docs/spec/processing.md and docs/changes.md also ask of each
  row, the least way: a reception's event and outcome (the correlation result, P8), keyed by
  (event_id, id) as dlrfeed's days are; an event's id, the content that tells a repeat from a
  conflict and the reported time (stat, err, the done date raw and parsed: P14, P19) and the
  parser and rules versions (P8); a status's supporting event and rules version (P7, P8);
  every column of the change log (docs/changes.md names them all). Left out, though dlrfeed
  keeps them: a reception's storing time, the submit date, fingerprints (derivable from the
  content when it is stored whole), counters, the basis's own copy of its content, first and
  last reception times, the sent message's raw destination, source and route, the queue's
  resolutions.

Both keep dlrfeed's column types, column order and reasons as dlrfeed stores them (the
change log's and the status's by id in dlr.reasons, as text where the dictionary has none):
they measure what these rows need in this layout. A third,
`lean_floor`, holds the required floor's columns laid out to waste nothing (fixed-width
columns first, the narrowest integers, versions and outcome as smallint codes), the reasons
and text ids as they are: what a schema rewritten for size could take.

The store is grown as the growth benchmark grows it (its loop and traffic, through fakegw and
a `dlrfeed run` daemon by default, on a throwaway cluster with PostgreSQL's defaults); its rows
are then copied as the store wrote them:
- sent messages, logical events, receptions, changes and exceptions in the order they were
  stored (the random-keyed indexes fill as they do in production: ~70 %, not the ~90 % of a
  fresh build), each in its final state (no dead versions of an updated event or exception);
- each message's status inserted by its first change and updated in place by each later one,
  a few hundred messages per transaction, as the ingest writes them (so the status table has
  the dead versions and free space an updated table has, at dlrfeed's fillfactor).
Measures and reports; asserts nothing.

    python scripts/bench_floor.py [--receptions 1000000] [--driver store]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import asyncpg

from dlrfeed.store.migrate import migrate
from dlrfeed.store.retention import STATUS_CHANGES
from dlrfeed_tools.bench.growth import grow
from dlrfeed_tools.bench.growth_configs import config_cluster
from dlrfeed_tools.bench.growth_drivers import DRIVERS
from dlrfeed_tools.bench.growth_profile import table_sizes

STATUS_CHUNK = 500  # messages per status transaction: about one ingest batch's


@dataclass(frozen=True)
class Copied:
    """A table of a floor filled from dlr's table of the same name, in its stored order."""

    definition: str  # the columns and constraints of its CREATE TABLE
    source: str  # what it selects of dlr's table
    order: str
    index: tuple[str, str] | None = None  # an index of its own: its name, its columns
    stored_in: str | None = None
    """What it is filled from, when not dlr's table of its name (a view of that one): a
    relation of dlr, or a subquery."""


class StatusColumn(NamedTuple):
    """A column of a floor's statuses, and what the change log holds of it."""

    name: str
    type: str
    source: str


@dataclass(frozen=True)
class Floor:
    """The tables of one floor. Its statuses replay the change log (`status_columns`).
    `copies_values`: every column holds the store's value (not a stand-in of its width)."""

    schema: str
    copied: Mapping[str, Copied]
    status_columns: tuple[StatusColumn, ...]
    copies_values: bool = True


# Where the change log's rows are stored: each reason by its id in dlr.reasons where the
# dictionary holds it, as text where not; every floor keeps them so, the least way. A change
# names its message by the message row's id: its login and message id are filled in from the
# message row, as dlr.status_changes does.
_CHANGE_ROWS = f"""(
    SELECT c.position, c.changed_at, coalesce(c.login, m.login) AS login,
           coalesce(c.message_id, m.message_id) AS message_id, c.status, c.is_final, c.reason,
           c.reason_id, c.supporting_event_id, c.rules_version, c.previous_status,
           c.previous_is_final, c.previous_reason, c.previous_reason_id
    FROM dlr.{STATUS_CHANGES.parent} AS c
    LEFT JOIN dlr.messages AS m ON c.login IS NULL AND m.id = c.message_ref
) AS c"""
_STATUS_KEY = ("login", "message_id")
_CONTRACT_STATUS = (
    StatusColumn("login", "text", "login"),
    StatusColumn("message_id", "text", "message_id"),
    StatusColumn("status", "text", "status"),
    StatusColumn("is_final", "boolean", "is_final"),
    # As dlrfeed stores it: by id where the dictionary holds it.
    StatusColumn("reason", "text", "reason"),
    StatusColumn("reason_id", "integer", "reason_id"),
    # When the status last changed (the store's updated_at also moves when a repeat only
    # counts, which changes no status).
    StatusColumn("updated_at", "timestamptz", "changed_at"),
)
_MESSAGES = Copied(
    "login text NOT NULL, message_id text NOT NULL, internal_id text NOT NULL,"
    " destination text NOT NULL, submitted_at timestamptz, UNIQUE (login, message_id)",
    "login, message_id, internal_id, destination, submitted_at",
    "id",
)
_EXCEPTIONS = Copied(
    "kind text NOT NULL, login text NOT NULL, message_id text, details jsonb NOT NULL,"
    " opened_at timestamptz NOT NULL, resolved_at timestamptz",
    "kind, login, message_id, details, opened_at, resolved_at",
    "id",
)

CONTRACT_FLOOR = Floor(
    "contract_floor",
    {
        "messages": _MESSAGES,
        "events": Copied(
            "login text NOT NULL, message_id text NOT NULL, level bigint NOT NULL,"
            " stat text NOT NULL, status text NOT NULL, times_received integer NOT NULL,"
            " UNIQUE (login, message_id, level)",
            "login, message_id, level, stat, status, times_received",
            "id",
        ),
        "receptions": Copied(
            "login text NOT NULL, message_id text NOT NULL, level bigint NOT NULL,"
            " delivery_count bigint NOT NULL, received_at timestamptz NOT NULL,"
            " payload bytea NOT NULL, channel dlr.reception_channel NOT NULL, peer text",
            "login, message_id, level, delivery_count, received_at, payload, channel, peer",
            "id",
            index=("receptions_by_message", "login, message_id, level"),
        ),
        "status_changes": Copied(
            "position numeric PRIMARY KEY, login text NOT NULL, message_id text NOT NULL,"
            " status text, is_final boolean NOT NULL, reason text, reason_id integer,"
            " previous_status text, changed_at timestamptz NOT NULL",
            "position, login, message_id, status, is_final, reason, reason_id, previous_status,"
            " changed_at",
            "position",
            stored_in=_CHANGE_ROWS,
        ),
        "exceptions": _EXCEPTIONS,
    },
    _CONTRACT_STATUS,
)

REQUIRED_FLOOR = Floor(
    "required_floor",
    {
        "messages": _MESSAGES,
        "events": Copied(
            "id bigint PRIMARY KEY, login text NOT NULL, message_id text NOT NULL,"
            " level bigint NOT NULL, stat text NOT NULL, status text NOT NULL, err text,"
            " done_date_raw text, done_at timestamptz, times_received integer NOT NULL,"
            " parser_version text NOT NULL, rules_version text NOT NULL,"
            " UNIQUE (login, message_id, level)",
            "id, login, message_id, level, stat, status, err, done_date_raw, done_at,"
            " times_received, parser_version, rules_version",
            "id",
        ),
        "receptions": Copied(
            "id bigint NOT NULL, login text NOT NULL, message_id text NOT NULL,"
            " level bigint NOT NULL, delivery_count bigint NOT NULL,"
            " received_at timestamptz NOT NULL, payload bytea NOT NULL,"
            " channel dlr.reception_channel NOT NULL, peer text, event_id bigint NOT NULL,"
            " outcome text NOT NULL, PRIMARY KEY (event_id, id)",
            "id, login, message_id, level, delivery_count, received_at, payload, channel, peer,"
            " event_id, outcome",
            "id",
        ),
        "status_changes": Copied(
            "position numeric PRIMARY KEY, changed_at timestamptz NOT NULL,"
            " login text NOT NULL, message_id text NOT NULL, status text,"
            " is_final boolean NOT NULL, reason text,"
            " supporting_event_id bigint NOT NULL, rules_version text NOT NULL,"
            " previous_status text, previous_is_final boolean, previous_reason text,"
            " reason_id integer, previous_reason_id integer",
            "position, changed_at, login, message_id, status, is_final, reason,"
            " supporting_event_id, rules_version, previous_status, previous_is_final,"
            " previous_reason, reason_id, previous_reason_id",
            "position",
            stored_in=_CHANGE_ROWS,
        ),
        "exceptions": _EXCEPTIONS,
    },
    (
        *_CONTRACT_STATUS,
        StatusColumn("supporting_event_id", "bigint", "supporting_event_id"),
        StatusColumn("rules_version", "text", "rules_version"),
    ),
)

# The required floor laid out to waste nothing: fixed-width columns first, widest first (no
# alignment padding between them), `level` and `delivery_count` as the narrowest integers their
# documented ranges fit, the parser and rules versions and the outcome as smallint codes (a
# constant or the outcome's length stands in for the code: the same width, so the same bytes).
# It measures what a schema rewritten for size could take, reasons and text ids as they are
# (the change log's by id, as dlrfeed stores them).
LEAN_FLOOR = Floor(
    "lean_floor",
    {
        "messages": _MESSAGES,
        "events": Copied(
            "id bigint PRIMARY KEY, done_at timestamptz, times_received integer NOT NULL,"
            " level smallint NOT NULL, parser_version smallint NOT NULL,"
            " rules_version smallint NOT NULL, login text NOT NULL, message_id text NOT NULL,"
            " stat text NOT NULL, status text NOT NULL, err text, done_date_raw text,"
            " UNIQUE (login, message_id, level)",
            "id, done_at, times_received, level::smallint, 1::smallint, 1::smallint, login,"
            " message_id, stat, status, err, done_date_raw",
            "id",
        ),
        "receptions": Copied(
            "id bigint NOT NULL, event_id bigint NOT NULL, received_at timestamptz NOT NULL,"
            " delivery_count integer NOT NULL, level smallint NOT NULL,"
            " outcome smallint NOT NULL, channel dlr.reception_channel NOT NULL,"
            " login text NOT NULL, message_id text NOT NULL, payload bytea NOT NULL, peer text,"
            " PRIMARY KEY (event_id, id)",
            "id, event_id, received_at, delivery_count::integer, level::smallint,"
            " length(outcome)::smallint, channel, login, message_id, payload, peer",
            "id",
        ),
        "status_changes": Copied(
            "changed_at timestamptz NOT NULL, supporting_event_id bigint NOT NULL,"
            " reason_id integer, previous_reason_id integer,"
            " rules_version smallint NOT NULL, is_final boolean NOT NULL,"
            " previous_is_final boolean, position numeric PRIMARY KEY, login text NOT NULL,"
            " message_id text NOT NULL, status text, reason text,"
            " previous_status text, previous_reason text",
            "changed_at, supporting_event_id, reason_id, previous_reason_id, 1::smallint,"
            " is_final, previous_is_final, position, login, message_id, status, reason,"
            " previous_status, previous_reason",
            "position",
            stored_in=_CHANGE_ROWS,
        ),
        "exceptions": _EXCEPTIONS,
    },
    (
        StatusColumn("supporting_event_id", "bigint", "supporting_event_id"),
        StatusColumn("updated_at", "timestamptz", "changed_at"),
        StatusColumn("reason_id", "integer", "reason_id"),
        StatusColumn("rules_version", "smallint", "1::smallint"),
        StatusColumn("is_final", "boolean", "is_final"),
        StatusColumn("login", "text", "login"),
        StatusColumn("message_id", "text", "message_id"),
        StatusColumn("status", "text", "status"),
        StatusColumn("reason", "text", "reason"),
    ),
    copies_values=False,
)

FLOORS = (CONTRACT_FLOOR, REQUIRED_FLOOR, LEAN_FLOOR)

# Measured as the growth benchmark measures dlr (growth_profile.SIZES_BY_RELATION): a table
# with its TOAST, free-space and visibility maps, each of its indexes on its own.
_SIZES = """
SELECT t.relname AS table_name, '(table)' AS relation, pg_table_size(t.oid) AS bytes
FROM pg_class AS t JOIN pg_namespace AS n ON n.oid = t.relnamespace
WHERE n.nspname = $1 AND t.relkind = 'r'
UNION ALL
SELECT t.relname, i.relname, pg_relation_size(i.oid)
FROM pg_class AS t
JOIN pg_namespace AS n ON n.oid = t.relnamespace
JOIN pg_index AS x ON x.indrelid = t.oid
JOIN pg_class AS i ON i.oid = x.indexrelid
WHERE n.nspname = $1 AND t.relkind = 'r'
"""


async def build_floor(dsn: str, floor: Floor) -> None:
    """Copy the rows of the store at `dsn` into the schema of `floor`, as the store wrote
    them."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET client_min_messages = warning")
        await _copy_tables(conn, floor)
        await _replay_statuses(conn, dsn, floor)
    finally:
        await conn.close()


async def _copy_tables(conn: asyncpg.Connection, floor: Floor) -> None:
    schema = floor.schema
    await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
    for name, table in floor.copied.items():
        await conn.execute(f"CREATE TABLE {schema}.{name} ({table.definition})")
        if table.index is not None:
            index, indexed = table.index
            await conn.execute(f"CREATE INDEX {index} ON {schema}.{name} ({indexed})")
        await conn.execute(
            f"INSERT INTO {schema}.{name} SELECT {table.source}"
            f" FROM {table.stored_in or 'dlr.' + name}"
            f" ORDER BY {table.order}"
        )


async def _replay_statuses(writer: asyncpg.Connection, dsn: str, floor: Floor) -> None:
    """The floor's statuses written as the ingest writes them: each change of the log, in its
    order, upserted with a few hundred others per transaction (`writer` commits each), read
    through a cursor of a second connection (a large log does not fit in memory)."""
    schema, columns = floor.schema, floor.status_columns
    # dlrfeed's fillfactor: the room an update in place needs (docs/postgresql.md).
    await writer.execute(
        f"CREATE TABLE {schema}.message_status ("
        + ", ".join(f"{c.name} {c.type}" for c in columns)
        + f", PRIMARY KEY ({', '.join(_STATUS_KEY)})) WITH (fillfactor = 80)"
    )
    upsert = (
        f"INSERT INTO {schema}.message_status SELECT * FROM unnest("
        + ", ".join(f"${n}::{c.type}[]" for n, c in enumerate(columns, 1))
        + f") ON CONFLICT ({', '.join(_STATUS_KEY)}) DO UPDATE SET "
        + ", ".join(f"{c.name} = EXCLUDED.{c.name}" for c in columns if c.name not in _STATUS_KEY)
    )
    # Every change that set a status (a withdrawal, status NULL, sets none: the growth
    # traffic has no recompute to withdraw one), its reason as its status row holds it (the
    # change log's trigger copies it so).
    changes = (
        f"SELECT {', '.join(f'{c.source} AS {c.name}' for c in columns)}"
        f" FROM {_CHANGE_ROWS} WHERE status IS NOT NULL ORDER BY position"
    )
    reader = await asyncpg.connect(dsn)
    try:
        async with reader.transaction():
            cursor = await reader.cursor(changes)
            while chunk := await cursor.fetch(STATUS_CHUNK):
                # One row per message in a statement (ON CONFLICT updates a row once): its latest.
                rows = list({tuple(r[k] for k in _STATUS_KEY): r for r in chunk}.values())
                await writer.execute(upsert, *([r[c.name] for r in rows] for c in columns))
    finally:
        await reader.close()


async def floor_sizes(conn: asyncpg.Connection, floor: Floor) -> dict[str, dict[str, int]]:
    """Bytes on disk of each table of `floor` (with its TOAST) and of each of its indexes, by
    table, as growth_profile.table_sizes gives dlr's."""
    sizes: dict[str, dict[str, int]] = {}
    for r in await conn.fetch(_SIZES, floor.schema):
        sizes.setdefault(r["table_name"], {})[r["relation"]] = int(r["bytes"])
    return sizes


def compare(
    stored: int,
    dlrfeed: Mapping[str, Mapping[str, int]],
    floors: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> dict[str, Any]:
    """Bytes per reception stored: by table (its indexes included) and in total, of dlrfeed's
    store and of each floor (by schema); the contract floor's total also without the index of
    its receptions; and each floor's relations one by one."""

    def per_reception(relations: Mapping[str, int]) -> float:
        return round(sum(relations.values()) / stored, 1)

    by_table = {
        table: {
            "dlrfeed": per_reception(relations),
            **{schema: per_reception(sizes.get(table, {})) for schema, sizes in floors.items()},
        }
        for table, relations in sorted(dlrfeed.items())
    }
    totals = {
        source: round(sum(t[source] for t in by_table.values()), 1)
        for source in ("dlrfeed", *floors)
    }
    reception_index = floors[CONTRACT_FLOOR.schema]["receptions"]["receptions_by_message"]
    return {
        "receptions": stored,
        "by_table": by_table,
        "total": totals,
        "contract_floor_without_reception_index": round(
            totals[CONTRACT_FLOOR.schema] - reception_index / stored, 1
        ),
        "relations": {
            schema: {
                table: {name: round(b / stored, 1) for name, b in sorted(relations.items())}
                for table, relations in sorted(sizes.items())
            }
            for schema, sizes in floors.items()
        },
    }


async def measure(receptions: int, driver_kind: str, root: Path) -> dict[str, Any]:
    """Grow a store to `receptions` as the growth benchmark does (its loop, its traffic, the
    receipts handed over by `driver_kind`) on a throwaway cluster with PostgreSQL's defaults,
    and compare it with its floors."""
    cluster = config_cluster("default", root)
    cluster.init()
    cluster.start()
    try:
        dsn = await cluster.create_database("floor")
        await migrate(dsn)
        await grow(
            cluster, dsn, receptions, receptions, _quiet, _ignore_step, driver_kind=driver_kind
        )
        for floor in FLOORS:
            await build_floor(dsn, floor)
        conn = await asyncpg.connect(dsn)
        try:
            floors = {floor.schema: await floor_sizes(conn, floor) for floor in FLOORS}
            stored = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
            return {"driver": driver_kind, **compare(stored, await table_sizes(conn), floors)}
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
