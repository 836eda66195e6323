"""P10: correlation by the gateway's message id, under the message locks.

Shared by the ingest transaction and the recompute pass: both lock the messages of a batch in
sorted order before they read or write a status.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from dlrfeed.domain.parse import LogicalEvent
    from dlrfeed.store.rows import Connection

LOCK_MESSAGES = query("lock_messages")
LOCK_CORRELATION_IDS = query("lock_correlation_ids")


class Correlated(NamedTuple):
    """The messages found, each locked, by gateway id."""

    submitted: dict[str, datetime | None]
    """Each one's submission time (the planner checks reported times against it, P19)."""
    refs: dict[str, int]
    """Each one's row id, which its status is kept under."""

    def of(self, ids: Iterable[str]) -> dict[str, int]:
        """The row ids of those of `ids` found, in their order."""
        return {i: self.refs[i] for i in ids if i in self.refs}


def ids_to_lock(events: Iterable[LogicalEvent]) -> list[str]:
    """The ids whose messages a batch locks, sorted: each event's correlation id and its own id
    (the same but with receipt_ids_hex), whose message decides the table the event is kept in
    (sql/ingest.sql, insert_events_read_statuses)."""
    return sorted({e.correlation_id for e in events} | {e.message_id for e in events})


async def correlate(conn: Connection, login: str, ids: list[str]) -> Correlated:
    """Lock the messages of `ids` (sorted); those that exist."""
    rows = list(await LOCK_MESSAGES.fetch(conn, login=login, message_ids=ids))
    found = {r["message_id"] for r in rows}
    missing = [i for i in ids if i not in found]
    if missing:
        await LOCK_CORRELATION_IDS.fetchval(conn, login=login, ids=missing)
        # A new statement, so a message committed while we waited is seen now.
        rows += await LOCK_MESSAGES.fetch(conn, login=login, message_ids=missing)
    return Correlated(
        {r["message_id"]: r["submitted_at"] for r in rows}, {r["message_id"]: r["id"] for r in rows}
    )
