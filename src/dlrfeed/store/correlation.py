"""P10: correlation by the gateway's message id, under the message locks.

Shared by the ingest transaction and the recompute pass: both lock the messages of a batch in
sorted order before they read or write a status.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from dlrfeed.store import queries

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection


async def correlate(conn: Connection, login: str, ids: list[str]) -> dict[str, datetime | None]:
    """Lock the messages of `ids` (sorted); those that exist with their submission time."""
    lock = queries.LOCK_MESSAGES
    found = {r[0]: r[1] for r in await lock.fetch(conn, login=login, message_ids=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        await queries.LOCK_CORRELATION_IDS.fetchval(conn, login=login, ids=missing)
        # A new statement, so a message committed while we waited is seen now.
        found.update((r[0], r[1]) for r in await lock.fetch(conn, login=login, message_ids=missing))
    return found
