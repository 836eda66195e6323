"""The store's write transactions (ingest, the sending side's chunks, recompute), planned as
the short index probes their statements are: without JIT and without sequential scans where an
index answers, for the rest of the transaction only (why: `sql/server.sql`, plan_as_probes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

PLAN_AS_PROBES = query("plan_as_probes")
_T = TypeVar("_T")
_U = TypeVar("_U")


@asynccontextmanager
async def write_transaction(conn: Connection) -> AsyncIterator[None]:
    """A transaction on `conn` (a savepoint inside one) whose statements are planned as
    probes: no JIT, no sequential scan where an index answers."""
    async with conn.transaction():
        await PLAN_AS_PROBES.fetchval(conn)
        yield


async def overlapped(statement: Awaitable[_T], work: Callable[[], _U]) -> tuple[_T, _U]:
    """Await `statement` while running `work` (client CPU) as the server executes it.

    On this 2-core design point the client's per-receipt Python and the server's statement run
    in parallel instead of one after the other; the connection is only used by `statement`.
    """
    pending = asyncio.ensure_future(statement)
    try:
        await asyncio.sleep(0)  # one turn of the loop: the statement is sent
        done = work()
    finally:
        result = await pending
    return result, done
