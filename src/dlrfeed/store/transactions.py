"""The store's write transactions: ingest, the sending side's chunks, recompute.

Each plans its statements as the short index probes they are (`sql/server.sql`,
plan_as_probes): without JIT, whose compilation triggered by estimates that grew with the
tables costs more than the statement, and without sequential scans where an index answers,
which a table with few live rows invites.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from dlrfeed.store import queries

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection


@asynccontextmanager
async def write_transaction(conn: Connection) -> AsyncIterator[None]:
    """A transaction on `conn` (a savepoint inside one) whose statements are planned as
    probes: no JIT, no sequential scan where an index answers."""
    async with conn.transaction():
        await queries.PLAN_AS_PROBES.fetchval(conn)
        yield
