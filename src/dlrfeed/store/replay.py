"""The deliveries of correlated events replayed through the planner (late correlation,
recompute), from what the store keeps of them (P21).

Retention retires receptions by whole days; an event keeps its first content and its totals
(deliveries accepted and conflicting, contents accepted) as long as its message. So a replay
reads the receptions still kept and, for an event whose first delivery was retired, that
delivery rebuilt from the event (sql/submissions.sql, waiting_receptions); `Replay` says which
events lost more than their first delivery, and how many of each kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from dlrfeed.domain.rules import Decision, Delivery, MessageState, Planner
from dlrfeed.store.rows import replayed

if TYPE_CHECKING:
    import asyncpg


class Retired(NamedTuple):
    """What retention took of one event beyond its first delivery, by the planner's classes."""

    correlation_id: str
    level: int
    repeats: int
    updates: int
    conflicts: int


class Replayed(NamedTuple):
    """One delivery replayed: it, its event, its reception (0: its first delivery rebuilt from
    the event, the reception retired), the planner's decision, and its event's totals as
    stored (deliveries accepted, first included; conflicting ones; contents accepted after the
    first)."""

    delivery: Delivery
    event_id: int
    reception_id: int
    decision: Decision
    totals: tuple[int, int, tuple[str, ...]]


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
        stored = (row["times_received"], row["conflicting_receptions"], tuple(row["updates"]))
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
