"""The deliveries of correlated events replayed through the planner (late correlation,
recompute), from what the store keeps of them (P21).

Retention retires receptions by whole days; an event keeps its first content and its totals
(deliveries accepted and conflicting, contents accepted) as long as its message. So a replay
reads the receptions still kept and, for an event whose first delivery was retired, that
delivery rebuilt from the event (sql/submissions.sql, waiting_receptions); `Replay` says which
events lost more than their first delivery, and how many of each kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from dlrfeed.domain.rules import Decision, Delivery, MessageState, Planner
from dlrfeed.store.rows import replayed
from dlrfeed.store.sql import query

if TYPE_CHECKING:
    import asyncpg

    from dlrfeed.store.rows import Connection


WRITE_EVENT_CONTENTS = query("write_event_contents")
CONFLICTS_OF_EVENTS = query("conflicts_of_events")
WRITE_CONFLICTS = query("write_conflicts")
# Late correlation and recompute: every delivery of the events of some correlation ids.
WAITING_RECEPTIONS = query("waiting_receptions")
_NOT_A_CONFLICT = "not a conflict under "
"""How a conflict exception the current rules no longer plan is resolved (then the version)."""


class Retired(NamedTuple):
    """What retention took of one event beyond its first delivery, by the planner's classes."""

    correlation_id: str
    level: int
    repeats: int
    updates: int
    conflicts: int


class EventTotals(NamedTuple):
    """What an event keeps of its deliveries (P14): how many were accepted, first included, and
    how many conflicted; the contents its key accepted after the first, the statuses of the
    results it accepted after the first, and the contents that conflicted with its result."""

    accepted: int
    conflicts: int
    updates: tuple[str, ...]
    later_results: tuple[str, ...]
    conflicting_contents: tuple[str, ...]


class Replayed(NamedTuple):
    """One delivery replayed: it, its event, its reception (0: its first delivery rebuilt from
    the event, the reception retired), the planner's decision, and its event's totals as
    stored."""

    delivery: Delivery
    event_id: int
    reception_id: int
    decision: Decision
    totals: EventTotals


class Replay(NamedTuple):
    """A replay's deliveries in order, and the events that lost deliveries to retention."""

    deliveries: list[Replayed]
    retired: dict[int, Retired]

    def retired_messages(self) -> set[str]:
        """The correlation ids of the messages with retired deliveries beyond a first one."""
        return {r.correlation_id for r in self.retired.values()}


def replay(planner: Planner, rows: Iterable[asyncpg.Record]) -> Replay:
    """Replay `rows` (waiting_receptions, in arrival order) through `planner`; then, for each
    event that has fewer deliveries than its totals count, what the missing ones were: the
    event's totals less what the replay classified (retention took the oldest deliveries, whose
    contents the event no longer names; their count and class it still keeps)."""
    deliveries: list[Replayed] = []
    read: dict[int, int] = {}
    totals: dict[int, asyncpg.Record] = {}
    for row in rows:
        delivery, event_id, reception_id = replayed(row)
        decision = planner.decide(delivery, event_id, reception_id)
        stored = EventTotals(
            row["times_received"],
            row["conflicting_receptions"],
            tuple(row["updates"]),
            tuple(row["later_results"]),
            tuple(row["conflicting_contents"]),
        )
        deliveries.append(Replayed(delivery, event_id, reception_id, decision, stored))
        read[event_id] = read.get(event_id, 0) + 1
        totals[event_id] = row
    retired: dict[int, Retired] = {}
    for event_id, row in totals.items():
        if read[event_id] >= row["times_received"] + row["conflicting_receptions"]:
            continue
        accepted = row["times_received"] - 1 - planner.event_accepted.get(event_id, 0)
        updates = len(row["updates"]) - len(planner.key_updates.get(event_id, ()))
        conflicts = row["conflicting_receptions"] - planner.event_conflicts.get(event_id, 0)
        retired[event_id] = Retired(
            row["correlation_id"],
            row["level"],
            max(accepted - max(updates, 0), 0),
            max(updates, 0),
            max(conflicts, 0),
        )
    return Replay(deliveries, retired)


def with_retired_counts(state: MessageState, retired: Iterable[Retired]) -> MessageState:
    """P20/P21: `state` with the counters of the deliveries retention took (repeats, conflicts,
    level-1 progress updates) added, as the live path counted them when they arrived."""
    repeats, conflicts, progress = state.repeats, state.conflicts, state.progress_events
    for r in retired:
        repeats += r.repeats
        conflicts += r.conflicts
        progress += r.updates if r.level == 1 else 0
    return state._replace(repeats=repeats, conflicts=conflicts, progress_events=progress)


async def write_as_replayed(
    conn: Connection,
    login: str,
    version: str,
    planner: Planner,
    replayed: Replay,
    messages: set[str],
) -> None:
    """P22: the totals of the events of `messages` and their conflict exceptions written as
    the live path writes them under the rules and options of `planner` (`version`), after it
    replayed `replayed`: a later redelivery then meets the contents the replay accepted, and
    the investigation queue holds the conflicts these rules see (one opened for each that no
    exception holds, an open one no longer planned resolved)."""
    stored: dict[int, EventTotals] = {}
    seen: set[tuple[int, int]] = set()
    planned: dict[tuple[int, int], tuple[str, str]] = {}
    for r in replayed.deliveries:
        if r.delivery.correlation_id not in messages:
            continue
        stored.setdefault(r.event_id, r.totals)
        seen.add((r.event_id, r.reception_id))
        for p in r.decision.exceptions:
            if p.kind == "conflict" and r.reception_id:
                planned[(r.event_id, r.reception_id)] = (
                    r.delivery.message_id,
                    json.dumps(p.details),
                )
    contents = []
    for event_id, old in stored.items():
        if event_id in replayed.retired:  # its totals count what retention took: kept (P21)
            continue
        new = EventTotals(
            1 + planner.event_accepted.get(event_id, 0),
            planner.event_conflicts.get(event_id, 0),
            tuple(planner.key_updates.get(event_id, ())),
            tuple(planner.key_results.get(event_id, ())),
            tuple(planner.key_conflicting.get(event_id, ())),
        )
        if new != old:
            contents.append((event_id, new))
    if contents:
        await WRITE_EVENT_CONTENTS.fetchval(
            conn,
            event_ids=[event_id for event_id, _ in contents],
            times_received=[c.accepted for _, c in contents],
            conflicts=[c.conflicts for _, c in contents],
            updates=[" ".join(c.updates) for _, c in contents],
            later_results=[" ".join(c.later_results) for _, c in contents],
            conflicting_contents=[" ".join(c.conflicting_contents) for _, c in contents],
        )
    existing = await CONFLICTS_OF_EVENTS.fetch(conn, event_ids=sorted(stored))
    held = {(x["event_id"], x["reception_id"]) for x in existing}
    to_open = [(k, v) for k, v in planned.items() if k not in held]
    # A conflict other rules judged none is one again; one an operator resolved stays so.
    to_reopen = [
        x["id"]
        for x in existing
        if (x["event_id"], x["reception_id"]) in planned
        and (x["resolution"] or "").startswith(_NOT_A_CONFLICT)
    ]
    # Only a conflict of a delivery replayed is judged again: one whose reception retired
    # stays as it was decided.
    to_resolve = [
        x["id"]
        for x in existing
        if x["resolved_at"] is None
        and (x["event_id"], x["reception_id"]) in seen
        and (x["event_id"], x["reception_id"]) not in planned
    ]
    if to_open or to_reopen or to_resolve:
        await WRITE_CONFLICTS.fetch(
            conn,
            login=login,
            message_ids=[v[0] for _, v in to_open],
            details=[v[1] for _, v in to_open],
            event_ids=[k[0] for k, _ in to_open],
            reception_ids=[k[1] for k, _ in to_open],
            reopened_ids=to_reopen,
            resolved_ids=to_resolve,
            resolution=f"{_NOT_A_CONFLICT}{version}",
        )
