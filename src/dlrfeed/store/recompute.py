"""The recompute pass (`sql/recompute.sql`): stored statuses computed again under the current
rules and options, every delivery of each message replayed through the planner (P8, P22).

Module functions on a connection the caller holds; `Store.recompute` acquires it and
translates the driver's errors.
"""

from __future__ import annotations

import json
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
from dlrfeed.store import queries
from dlrfeed.store.correlation import correlate
from dlrfeed.store.replay import Replay, replay
from dlrfeed.store.rows import dumps, status_json
from dlrfeed.store.transactions import write_transaction

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection
    from dlrfeed.store.sql import Query


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
    writes: queries.StatusWrites,
    waiting: Query,
    events_by_message: bool,
    progress: Progress | None = None,
) -> RecomputeResult:
    """Recompute the stale status rows (all with `every`) on `conn`, `chunk` messages at a
    time, each login's part of a chunk in its own transaction, each message's deliveries read
    back with `waiting` and its status written with `writes` (see `Store.recompute`, which
    translates the driver's errors). With `events_by_message` (a schema since migration 0024)
    the events' totals and the conflict exceptions are written as the current rules plan them
    too, and a status computed the same is left unwritten. `progress` hears after each
    transaction what was done so far."""
    version = options.rules_version(RULES_VERSION)
    total = None
    if progress is not None:
        total = await queries.COUNT_STALE_STATUSES.fetchval(
            conn, every=every, rules_version=version
        )
    done = RecomputeResult(0, 0, 0, total)
    after = ("", "")
    while True:
        keys = await queries.STALE_STATUSES.fetch(
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
            pass_ = _Chunk(conn, options, version, login, writes, events_by_message)
            async with write_transaction(conn):
                changed, retired = await pass_.run(message_ids, waiting)
            done = RecomputeResult(
                done.examined + len(message_ids),
                done.changed + changed,
                done.evidence_retired + retired,
                total,
            )
            if progress is not None:
                progress(done)
    return done


@dataclass(slots=True)
class _Chunk:
    """One login's part of a chunk, recomputed in the caller's transaction."""

    conn: Connection
    options: IntegrationOptions
    version: str
    login: str
    writes: queries.StatusWrites
    events_by_message: bool

    async def run(self, message_ids: list[str], waiting: Query) -> tuple[int, int]:
        """Recompute the statuses of `message_ids` under their message locks: the number of
        rows changed (each audited) and of rows left as they were (evidence retired)."""
        conn, login = self.conn, self.login
        correlated = await correlate(conn, login, sorted(message_ids))
        submitted = correlated.submitted
        before = {
            r["message_id"]: r
            for r in await queries.STATUSES_BEFORE_RECOMPUTE.fetch(
                conn, login=login, message_ids=message_ids
            )
        }
        planner = Planner(self.options, {}, dict.fromkeys(submitted, EMPTY_STATE), submitted)
        replayed = replay(
            planner, await waiting.fetch(conn, login=login, correlation_ids=sorted(submitted))
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
                if old["rules_version"] != self.version:
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
                    f"recomputed under {self.version} (was {old['rules_version']}): {why}",
                ]
            )
        if audit:  # most chunks of a recompute change nothing: no round trip for them
            await queries.RECORD_RECOMPUTE_AUDIT.execute(
                conn, login=login, rules_version=self.version, audit=dumps(audit)
            )
        changed = {a[0] for a in audit}
        if not self.events_by_message:  # an older schema: every status written, as before
            changed.update(current)
            current = []
        if changed or gone:
            await self.writes.recompute.execute(
                conn,
                login=login,
                rules_version=self.version,
                statuses=status_json(
                    {m: s for m, s in planner.messages.items() if m in changed}, correlated.refs
                ),
                gone=gone,
            )
        if current:
            await queries.MARK_STATUSES_CURRENT.fetchval(
                conn, login=login, message_ids=current, rules_version=self.version
            )
        if self.events_by_message:
            recomputed = {m for m in before if m not in kept}
            await self._write_events(planner, replayed, recomputed)
        return len(audit), len(kept)

    async def _write_events(self, planner: Planner, replayed: Replay, messages: set[str]) -> None:
        """P22: the totals of the events of `messages` and their conflict exceptions as the
        live path writes them under the current rules and options: a later redelivery then
        meets the contents the replay accepted."""
        stored: dict[int, tuple[int, int, tuple[str, ...]]] = {}
        planned: dict[tuple[int, int], tuple[str, str]] = {}
        for r in replayed.deliveries:
            if r.delivery.correlation_id not in messages:
                continue
            stored.setdefault(r.event_id, r.totals)
            for p in r.decision.exceptions:
                if p.kind == "conflict":
                    planned[(r.event_id, r.reception_id)] = (
                        r.delivery.message_id,
                        json.dumps(p.details),
                    )
        contents = []
        for event_id, old in stored.items():
            new = (
                1 + planner.event_accepted.get(event_id, 0),
                planner.event_conflicts.get(event_id, 0),
                tuple(planner.key_updates.get(event_id, ())),
            )
            if new != old:
                contents.append((event_id, *new))
        if contents:
            await queries.WRITE_EVENT_CONTENTS.fetchval(
                self.conn,
                event_ids=[c[0] for c in contents],
                times_received=[c[1] for c in contents],
                conflicts=[c[2] for c in contents],
                updates=[" ".join(c[3]) for c in contents],
            )
        existing = await queries.CONFLICTS_OF_EVENTS.fetch(self.conn, event_ids=sorted(stored))
        held = {(x["event_id"], x["reception_id"]) for x in existing}
        to_open = [(k, v) for k, v in planned.items() if k not in held]
        to_resolve = [
            x["id"]
            for x in existing
            if x["resolved_at"] is None and (x["event_id"], x["reception_id"]) not in planned
        ]
        if to_open or to_resolve:
            await queries.WRITE_CONFLICTS.fetch(
                self.conn,
                login=self.login,
                message_ids=[v[0] for _, v in to_open],
                details=[v[1] for _, v in to_open],
                event_ids=[k[0] for k, _ in to_open],
                reception_ids=[k[1] for k, _ in to_open],
                resolved_ids=to_resolve,
                resolution=f"not a conflict under {self.version} (dlrfeed recompute)",
            )
