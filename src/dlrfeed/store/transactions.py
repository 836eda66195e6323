"""The store's write transactions: ingest, the sending side's chunks, recompute.

Each plans its statements without JIT (`sql/server.sql`, plan_without_jit): they are short
index probes, and a compilation triggered by estimates that grew with the tables costs more
than the statement.
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
    """A transaction on `conn` (a savepoint inside one) whose statements run without JIT."""
    async with conn.transaction():
        await queries.PLAN_WITHOUT_JIT.fetchval(conn)
        yield
