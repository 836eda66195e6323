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
# Each boundary with the planner settings in one simple-protocol round trip: a write
# transaction is a handful of statements, and each round trip waits for the event loop as well
# as for the server. (begin, commit, roll back): a transaction, or a savepoint inside one.
_TRANSACTION = (f"BEGIN; {PLAN_AS_PROBES.text}", "COMMIT", "ROLLBACK")
_SAVEPOINT = (
    f"SAVEPOINT write_transaction; {PLAN_AS_PROBES.text}",
    "RELEASE SAVEPOINT write_transaction",
    "ROLLBACK TO SAVEPOINT write_transaction; RELEASE SAVEPOINT write_transaction",
)
_T = TypeVar("_T")
_U = TypeVar("_U")


@asynccontextmanager
async def write_transaction(conn: Connection) -> AsyncIterator[None]:
    """A transaction on `conn` (a savepoint inside one) whose statements are planned as
    probes: no JIT, no sequential scan where an index answers."""
    begin, commit, roll_back = _SAVEPOINT if conn.is_in_transaction() else _TRANSACTION
    await conn.execute(begin)
    try:
        yield
    except BaseException:
        if not conn.is_closed():
            # A roll back that fails is raised, the error that ended the block chained to it
            # (as asyncpg's own transactions do): nothing may run on the connection as it is.
            await conn.execute(roll_back)
        raise
    await conn.execute(commit)


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
