"""For the tests of day partitions and retention (migrations 0010, 0011, 0013): receipts with a
chosen receive time, the start of today, a database installed as released before a migration,
and the plan the server would run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store.migrate import available_migrations
from dlrfeed_tools.rule_receipts import feed_receipt


def receipt(message_id: str, received_at: float, *, delivery_count: int = 1) -> Receipt:
    """A final receipt with its real serialized proto, received at `received_at`."""
    return feed_receipt(
        message_id,
        2,
        "DELIVRD",
        ack_token=f"t-{message_id}",
        received_at=received_at,
        delivery_count=delivery_count,
    )


DAY = timedelta(days=1)


def today() -> datetime:
    """The start of today, UTC: where today's day partition begins."""
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


async def install_schema_before(conn: asyncpg.Connection, version: int) -> None:
    """Apply every migration older than `version` to an empty database, recording each in
    dlr.schema_version as `dlrfeed migrate` would: a database as released before `version`."""
    await conn.execute(
        "CREATE SCHEMA dlr; CREATE TABLE dlr.schema_version ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for migration in available_migrations():
        if migration.version < version:
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO dlr.schema_version (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )


async def plan_of(conn: asyncpg.Connection, statement: str, *args: object) -> str:
    """The server's EXPLAIN of `statement` with `args`, one line per plan node."""
    return "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + statement, *args))


async def drop_days_before(
    conn: asyncpg.Connection,
    cutoff: datetime,
    parents: tuple[str, ...] = ("reception_rows", "status_change_rows"),
) -> None:
    """Drop the days of evidence and of the change log (`parents`) that end by `cutoff`, as
    `maintain`'s retention does before it forgets (no message forgotten may have a delivery or
    a change left that names it by its event or its row)."""
    for row in await conn.fetch(
        "SELECT partition_name FROM dlr.day_partitions"
        " WHERE parent_table = ANY($2::text[]) AND upper_bound <= $1",
        cutoff,
        list(parents),
    ):
        await conn.execute(f'DROP TABLE dlr_partitions."{row[0]}"')
