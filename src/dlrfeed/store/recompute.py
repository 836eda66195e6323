"""The recompute pass (`sql/recompute.sql`, for `Store.recompute`): stored statuses computed
again under the current rules and options (P8, P22).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
from dlrfeed.store.correlation import correlate
from dlrfeed.store.replay import WAITING_RECEPTIONS, replay, write_as_replayed
from dlrfeed.store.rows import dumps, status_json
from dlrfeed.store.sql import query
from dlrfeed.store.transactions import write_transaction

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

STALE_STATUSES = query("stale_statuses")
COUNT_STALE_STATUSES = query("count_stale_statuses")
STATUSES_BEFORE_RECOMPUTE = query("statuses_before_recompute")
RECORD_RECOMPUTE_AUDIT = query("record_recompute_audit")
WRITE_RECOMPUTE = query("write_recompute")
MARK_STATUSES_CURRENT = query("mark_statuses_current")


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    """What `Store.recompute` did (so far, in a progress report)."""

    examined: int
    """Status rows computed again."""
    changed: int
    """Of those, rows whose status, reason, basis or counters changed (each audited)."""
    evidence_retired: int = 0
    """Of those, rows left as they were: retention took deliveries they were computed from
    beyond what their events keep (P21)."""
    total: int | None = None
    """The rows the pass is to examine, counted when it started (None: not counted)."""


Progress = Callable[[RecomputeResult], None]


async def recompute(
    conn: Connection,
    options: IntegrationOptions,
    *,
    every: bool,
    chunk: int,
    progress: Progress | None = None,
    busy: float = 1.0,
) -> RecomputeResult:
    """`Store.recompute` on `conn`: each login's part of a chunk in its own transaction."""
    version = options.rules_version(RULES_VERSION)
    total = None
    if progress is not None:
        total = await COUNT_STALE_STATUSES.fetchval(conn, every=every, rules_version=version)
    done = RecomputeResult(0, 0, 0, total)
    after = ("", "")
    while True:
        keys = await STALE_STATUSES.fetch(
            conn,
            after_login=after[0],
            after_message_id=after[1],
            chunk=chunk,
            every=every,
            rules_version=version,
        )
        if not keys:
            break
        after = (keys[-1]["login"], keys[-1]["message_id"])
        by_login: dict[str, list[str]] = {}
        for key in keys:
            by_login.setdefault(key["login"], []).append(key["message_id"])
        for login, message_ids in by_login.items():
            started = time.monotonic()
            async with write_transaction(conn):
                changed, retired = await _recompute_chunk(
                    conn, options, version, login, message_ids
                )
            if busy < 1.0:  # no transaction open meanwhile: nothing held back
                await asyncio.sleep((time.monotonic() - started) * (1.0 / busy - 1.0))
            done = RecomputeResult(
                done.examined + len(message_ids),
                done.changed + changed,
                done.evidence_retired + retired,
                total,
            )
            if progress is not None:
                progress(done)
    return done


async def _recompute_chunk(
    conn: Connection,
    options: IntegrationOptions,
    version: str,
    login: str,
    message_ids: list[str],
) -> tuple[int, int]:
    """Recompute the statuses of `login`'s `message_ids` under their message locks, in the
    caller's transaction: the number of rows changed (each audited) and of rows left as they
    were (evidence retired)."""
    correlated = await correlate(conn, login, sorted(message_ids))
    submitted = correlated.submitted
    before = {
        r["message_id"]: r
        for r in await STATUSES_BEFORE_RECOMPUTE.fetch(conn, login=login, message_ids=message_ids)
    }
    planner = Planner(options, {}, dict.fromkeys(submitted, EMPTY_STATE), submitted)
    replayed = replay(
        planner,
        await WAITING_RECEPTIONS.fetch(conn, login=login, correlation_ids=sorted(submitted)),
    )
    # P21: a status whose deliveries retention took beyond what its events keep is left
    # as it is (its version too: it was not computed under this one).
    kept = replayed.retired_messages() & before.keys()
    audit: list[list[Any]] = []
    gone: list[str] = []
    current: list[str] = []
    for message_id, old in sorted(before.items()):
        if message_id in kept:
            continue
        state = planner.messages.get(message_id, EMPTY_STATE)
        why = status_change(dict(old), state)
        if state.basis is None:
            gone.append(message_id)
        if why is None:
            if old["rules_version"] != version:
                current.append(message_id)
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
                f"recomputed under {version} (was {old['rules_version']}): {why}",
            ]
        )
    if audit:  # most chunks of a recompute change nothing: no round trip for them
        await RECORD_RECOMPUTE_AUDIT.execute(
            conn, login=login, rules_version=version, audit=dumps(audit)
        )
    changed = {a[0] for a in audit}
    if changed or gone:
        await WRITE_RECOMPUTE.execute(
            conn,
            login=login,
            rules_version=version,
            statuses=status_json(
                {m: s for m, s in planner.messages.items() if m in changed}, correlated.refs
            ),
            gone=gone,
        )
    if current:
        await MARK_STATUSES_CURRENT.fetchval(
            conn, login=login, message_ids=current, rules_version=version
        )
    recomputed = {m for m in before if m not in kept}
    await write_as_replayed(conn, login, version, planner, replayed, recomputed)
    return len(audit), len(kept)
