"""The recompute pass (`sql/recompute.sql`): stored statuses computed again under the current
rules, every delivery of each message replayed through the planner (P8).

Module functions on a connection the caller holds; `Store.recompute` acquires it and
translates the driver's errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.rules import (
    EMPTY_STATE,
    RULES_VERSION,
    Planner,
    explain,
    is_final,
    status_change,
)
from dlrfeed.store import queries
from dlrfeed.store.correlation import correlate
from dlrfeed.store.rows import dumps, replayed, status_json
from dlrfeed.store.transactions import write_transaction

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection
    from dlrfeed.store.sql import Query


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    """What `Store.recompute` did."""

    examined: int
    """Status rows computed again."""
    changed: int
    """Of those, rows whose status, reason, basis or counters changed (each audited)."""


async def recompute(
    conn: Connection,
    options: IntegrationOptions,
    *,
    every: bool,
    chunk: int,
    writes: queries.StatusWrites,
    waiting: Query,
) -> RecomputeResult:
    """Recompute the stale status rows (all with `every`) on `conn`, `chunk` messages at a
    time, each login's part of a chunk in its own transaction, each message's deliveries read
    back with `waiting` and its status written with `writes` (see
    `Store.recompute`, which translates the driver's errors)."""
    examined = changed = 0
    after = ("", "")
    while True:
        keys = await queries.STALE_STATUSES.fetch(
            conn,
            after_login=after[0],
            after_message_id=after[1],
            chunk=chunk,
            every=every,
            rules_version=RULES_VERSION,
        )
        if not keys:
            break
        after = (keys[-1]["login"], keys[-1]["message_id"])
        by_login: dict[str, list[str]] = {}
        for key in keys:
            by_login.setdefault(key["login"], []).append(key["message_id"])
        for login, message_ids in by_login.items():
            async with write_transaction(conn):
                changed += await _recompute_chunk(
                    conn, options, login, message_ids, writes, waiting
                )
            examined += len(message_ids)
    return RecomputeResult(examined=examined, changed=changed)


async def _recompute_chunk(
    conn: Connection,
    options: IntegrationOptions,
    login: str,
    message_ids: list[str],
    writes: queries.StatusWrites,
    waiting: Query,
) -> int:
    """Recompute the statuses of `message_ids` of `login` in the caller's transaction, under
    the message locks; the number of rows changed (each audited)."""
    correlated = await correlate(conn, login, sorted(message_ids))
    submitted = correlated.submitted
    before = {
        r["message_id"]: r
        for r in await queries.STATUSES_BEFORE_RECOMPUTE.fetch(
            conn, login=login, message_ids=message_ids
        )
    }
    planner = Planner(options, {}, dict.fromkeys(submitted, EMPTY_STATE), submitted)
    for reception in await waiting.fetch(conn, login=login, correlation_ids=sorted(submitted)):
        planner.decide(*replayed(reception))
    audit: list[list[Any]] = []
    gone: list[str] = []
    for message_id, old in sorted(before.items()):
        state = planner.messages.get(message_id, EMPTY_STATE)
        why = status_change(dict(old), state)
        if state.basis is None:
            gone.append(message_id)
        if why is None:
            continue
        basis = state.basis
        audit.append(
            [
                message_id,
                old["status"],
                old["is_final"],
                old["reason"],
                old["supporting_event_id"],
                old["rules_version"],
                None if basis is None else basis.status,
                None if basis is None else is_final(state),
                None if basis is None else explain(state),
                None if basis is None else basis.event_id,
                f"recomputed under {RULES_VERSION} (was {old['rules_version']}): {why}",
            ]
        )
    if audit:  # most chunks of a recompute change nothing: no round trip for them
        await queries.RECORD_RECOMPUTE_AUDIT.execute(
            conn, login=login, rules_version=RULES_VERSION, audit=dumps(audit)
        )
    await writes.recompute.execute(
        conn,
        login=login,
        rules_version=RULES_VERSION,
        statuses=status_json(
            {m: s for m, s in planner.messages.items() if m in before}, correlated.refs
        ),
        gone=gone,
    )
    return len(audit)
