"""The store's write transactions: ingest, the sending side's chunks, recompute.

Each plans its statements as the short index probes they are (`sql/server.sql`,
plan_as_probes), for the rest of the transaction only:
- without sequential scans where an index answers: dlr.event_rows keeps few live rows (its
  events move under their messages as they are recorded), so it looks cheaper to scan than to
  probe, and after a burst of moves one scan per key reads every dead row too (the plan
  test_sql_statements.test_the_write_transactions_probe_a_table_of_few_rows_by_its_key shows);
- without JIT: past jit_above_cost PostgreSQL compiles a statement every time it runs, which
  costs more than these probes. Their estimates stay far below it on a store of 200k messages
  (11.5k at most, waiting_receptions), but grow with the day partitions each probe of the
  receptions spans; what it does is held by
  test_the_write_transactions_plan_without_jit_and_leave_the_session_as_it_was.
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
