"""The state machine of a message's computed status (P16-P19): a transition table, as data.

Pure (no I/O). The store feeds it the logical events of a message; it answers the new computed
status and the outcome of each event. docs/rules.md explains the table and why the result does
not depend on arrival order except for conflicting finals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple, assert_never

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.status import FINAL_STATUSES, PROGRESS_STATUSES, Outcome, Status

RULES_VERSION = "rules-1"
"""P8: recorded on events and on the projection; bump when any transition changes."""


class Kind(Enum):
    """What a status or an event is, for the transition table (P16)."""

    NONE = "none"
    """No applied event yet (only as the held side)."""
    PROGRESS = "progress"
    """ACCEPTED, ENROUTE."""
    NETWORK_FINAL = "network_final"
    """A final reported by the network: DELIVERED, UNDELIVERABLE, EXPIRED, DELETED, REJECTED."""
    DEADLINE_FINAL = "deadline_final"
    """The gateway's deadline UNKNOWN (F3)."""
    UNRECOGNIZED = "unrecognized"
    """A `stat` outside the mapping (only as the incoming side)."""

    # Members are singletons compared by identity, so identity hashing is exact; Enum's own
    # __hash__ is Python code, and the transition table is looked up by Kind pairs per event.
    __hash__ = object.__hash__


class Action(Enum):
    """What a transition does."""

    TAKE = "take"
    """The event becomes the basis of the status (outcome applied)."""
    NEWER_PROGRESS = "newer_progress"
    """Progress vs progress: the later one by reported time, then rank, wins (P19)."""
    IGNORE_PROGRESS = "ignore_progress"
    """Progress under a final: recorded, never applied (F13, C2; outcome late_progress)."""
    SAME_FINAL_OR_CONFLICT = "same_final_or_conflict"
    """Final vs final: the same status corroborates, another one is a conflict (P18, C3)."""
    SUPERSEDE_DEADLINE = "supersede_deadline"
    """Option: a network final replaces the deadline UNKNOWN (outcome applied)."""
    DEADLINE_SUPERSEDED = "deadline_superseded"
    """Option: a deadline UNKNOWN under a network final is recorded, not applied."""
    NOT_APPLIED = "not_applied"
    """Unrecognized `stat`: nothing changes (P17; outcome unrecognized)."""


# P16-P19: (held, incoming) → action. Conservative defaults (P18): finals never progress and a
# final is never replaced by another final.
TRANSITIONS: Mapping[tuple[Kind, Kind], Action] = {
    (Kind.NONE, Kind.PROGRESS): Action.TAKE,
    (Kind.NONE, Kind.NETWORK_FINAL): Action.TAKE,
    (Kind.NONE, Kind.DEADLINE_FINAL): Action.TAKE,
    (Kind.NONE, Kind.UNRECOGNIZED): Action.NOT_APPLIED,
    (Kind.PROGRESS, Kind.PROGRESS): Action.NEWER_PROGRESS,
    (Kind.PROGRESS, Kind.NETWORK_FINAL): Action.TAKE,
    (Kind.PROGRESS, Kind.DEADLINE_FINAL): Action.TAKE,
    (Kind.PROGRESS, Kind.UNRECOGNIZED): Action.NOT_APPLIED,
    (Kind.NETWORK_FINAL, Kind.PROGRESS): Action.IGNORE_PROGRESS,
    (Kind.NETWORK_FINAL, Kind.NETWORK_FINAL): Action.SAME_FINAL_OR_CONFLICT,
    (Kind.NETWORK_FINAL, Kind.DEADLINE_FINAL): Action.SAME_FINAL_OR_CONFLICT,
    (Kind.NETWORK_FINAL, Kind.UNRECOGNIZED): Action.NOT_APPLIED,
    (Kind.DEADLINE_FINAL, Kind.PROGRESS): Action.IGNORE_PROGRESS,
    (Kind.DEADLINE_FINAL, Kind.NETWORK_FINAL): Action.SAME_FINAL_OR_CONFLICT,
    (Kind.DEADLINE_FINAL, Kind.DEADLINE_FINAL): Action.SAME_FINAL_OR_CONFLICT,
    (Kind.DEADLINE_FINAL, Kind.UNRECOGNIZED): Action.NOT_APPLIED,
}

# P18: integration options, each overriding named cells of the table when switched on.
OPTION_TRANSITIONS: Mapping[str, Mapping[tuple[Kind, Kind], Action]] = {
    "deadline_unknown_superseded": {
        (Kind.DEADLINE_FINAL, Kind.NETWORK_FINAL): Action.SUPERSEDE_DEADLINE,
        (Kind.NETWORK_FINAL, Kind.DEADLINE_FINAL): Action.DEADLINE_SUPERSEDED,
    },
}

# P19: among progress events with the same reported time, the later stage wins.
_PROGRESS_RANK: Mapping[Status, int] = {Status.ACCEPTED: 1, Status.ENROUTE: 2}


def _kind_from_vocabulary(status: Status) -> Kind:
    if status in PROGRESS_STATUSES:
        return Kind.PROGRESS
    if status is Status.UNKNOWN:
        return Kind.DEADLINE_FINAL
    if status in FINAL_STATUSES:
        return Kind.NETWORK_FINAL
    return Kind.UNRECOGNIZED


# Looked up once per event on the ingest hot path: one dict probe instead of set tests.
_KIND_OF: Mapping[Status, Kind] = {status: _kind_from_vocabulary(status) for status in Status}


def kind_of(status: Status) -> Kind:
    """The table's kind of a normalised status."""
    return _KIND_OF[status]


@lru_cache(maxsize=16)
def transition_table(options: IntegrationOptions) -> Mapping[tuple[Kind, Kind], Action]:
    """The table in force under `options`: the defaults with each enabled option's cells.

    Cached per options value (immutable): `apply` asks for it once per event.
    """
    table = dict(TRANSITIONS)
    for name, cells in OPTION_TRANSITIONS.items():
        if getattr(options, name):
            table.update(cells)
    return MappingProxyType(table)


class EventFacts(NamedTuple):
    """What the rules need of one logical event; `ref` is the store's event id.

    A named tuple, like `Receipt`: one is built per event on the ingest hot path, and a frozen
    dataclass costs several times more to construct."""

    ref: int
    status: Status
    stat: str
    err: str | None
    done_at: datetime | None
    fingerprint: str

    def order_key(self) -> tuple[bool, float, int, str]:
        """P19: a total order by reported time, then stage, then fingerprint — never arrival."""
        done = self.done_at.timestamp() if self.done_at is not None else 0.0
        return (
            self.done_at is not None,
            done,
            _PROGRESS_RANK.get(self.status, 0),
            self.fingerprint,
        )


class MessageStatus(NamedTuple):
    """P7/P20: the computed status of one correlated message and its summary counters.

    A named tuple for the same reason as `EventFacts` (one or two per event when ingesting)."""

    status: Status
    is_final: bool
    reason: str
    basis: EventFacts
    """The event that supports the status (P7, P20 audit)."""
    repeats: int = 0
    """P14/P20: deliveries beyond the first of each of the message's logical events."""
    conflicts: int = 0
    """P14/P18: conflicting deliveries of a key plus incompatible finals."""
    progress_events: int = 0
    """Distinct progress events seen, applied or not."""
    deadline_superseded: bool = False
    """Option `deadline_unknown_superseded` took effect for this message."""


def explain(basis: EventFacts, deadline_superseded: bool) -> str:
    """P7: the reason for a status, a function of its basis alone (so order-independent)."""
    err = "" if basis.err is None else f", err {basis.err}"
    if deadline_superseded:
        return (
            f"network final {basis.stat}{err} supersedes the gateway's deadline UNKNOWN "
            "(option deadline_unknown_superseded)"
        )
    if basis.status is Status.UNKNOWN:
        return "the gateway's deadline receipt UNKNOWN: no result reported in time (F3)"
    if basis.status in FINAL_STATUSES:
        return f"final status reported by the network: {basis.stat}{err}"
    return f"in progress as reported by the network: {basis.stat}{err}"


def _based_on(
    basis: EventFacts,
    previous: MessageStatus | None,
    progress_events: int,
    deadline_superseded: bool,
) -> MessageStatus:
    """A status supported by `basis`, keeping the counters of `previous`."""
    return MessageStatus(  # positional: a third of the keyword form's cost, once per event
        basis.status,
        basis.status in FINAL_STATUSES,  # is_final
        explain(basis, deadline_superseded),  # reason
        basis,
        0 if previous is None else previous.repeats,
        0 if previous is None else previous.conflicts,
        progress_events,
        deadline_superseded,
    )


def apply(
    current: MessageStatus | None, event: EventFacts, options: IntegrationOptions
) -> tuple[MessageStatus | None, Outcome]:
    """Apply one new logical event of a correlated message: the new status and the outcome.

    Repeats and same-key conflicts never reach this function (see `classify_delivery`).
    """
    incoming = kind_of(event.status)
    held = Kind.NONE if current is None else kind_of(current.status)
    action = transition_table(options)[(held, incoming)]
    progress = 1 if incoming is Kind.PROGRESS else 0
    if action is Action.NOT_APPLIED:
        return current, Outcome.UNRECOGNIZED
    if current is None:
        return _based_on(event, None, progress, False), Outcome.APPLIED
    counted = current.progress_events + progress
    superseded = current.deadline_superseded
    if action is Action.TAKE:
        return _based_on(event, current, counted, superseded), Outcome.APPLIED
    if action is Action.NEWER_PROGRESS:
        if event.order_key() > current.basis.order_key():
            return _based_on(event, current, counted, superseded), Outcome.APPLIED
        return current._replace(progress_events=counted), Outcome.LATE_PROGRESS
    if action is Action.IGNORE_PROGRESS:
        return current._replace(progress_events=counted), Outcome.LATE_PROGRESS
    if action is Action.SAME_FINAL_OR_CONFLICT:
        if event.status is current.status:
            # Corroboration: keep the earlier of the two by reported time so that the basis
            # does not depend on which arrived first.
            if event.order_key() < current.basis.order_key():
                return _based_on(event, current, counted, superseded), Outcome.CORROBORATED
            return current, Outcome.CORROBORATED
        # P18/C3: the first final applied stays; the later incompatible one is a conflict.
        return current._replace(conflicts=current.conflicts + 1), Outcome.CONFLICT
    if action is Action.SUPERSEDE_DEADLINE:
        return _based_on(event, current, counted, True), Outcome.APPLIED
    if action is Action.DEADLINE_SUPERSEDED:
        return _based_on(current.basis, current, counted, True), Outcome.SUPERSEDED
    assert_never(action)


def classify_delivery(stored_fingerprint: str, delivery_fingerprint: str) -> Outcome:
    """P14: a delivery of an already stored key is a repeat (same content) or a conflict."""
    return Outcome.REPEAT if stored_fingerprint == delivery_fingerprint else Outcome.CONFLICT


def count(current: MessageStatus, *, repeats: int = 0, conflicts: int = 0) -> MessageStatus:
    """Add repeat / same-key conflict deliveries to a status' counters (nothing else changes)."""
    if repeats == 0 and conflicts == 0:
        return current
    return current._replace(
        repeats=current.repeats + repeats, conflicts=current.conflicts + conflicts
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of one message, as the reference `replay` sees it."""

    level: int
    event: EventFacts


def replay(
    deliveries: Iterable[Delivery], options: IntegrationOptions
) -> tuple[MessageStatus | None, list[Outcome]]:
    """The specification of what the store computes for one correlated message.

    Deliveries in arrival order: the first of a (level) key stores the logical event, later ones
    are repeats or conflicts by fingerprint (P14), new events go through `apply`. Counts seen
    before the first applied event (repeats of an unrecognized event) are carried into the status
    when it is created, as the store does. Returns the final status and each delivery's outcome;
    the store's batched ingest must agree with it.
    """
    stored: dict[int, str] = {}
    status: MessageStatus | None = None
    pending_repeats = pending_conflicts = 0
    outcomes: list[Outcome] = []
    for delivery in deliveries:
        known = stored.get(delivery.level)
        if known is None:
            stored[delivery.level] = delivery.event.fingerprint
            created = status is None
            status, outcome = apply(status, delivery.event, options)
            if created and status is not None:
                status = count(status, repeats=pending_repeats, conflicts=pending_conflicts)
        else:
            outcome = classify_delivery(known, delivery.event.fingerprint)
            repeat = outcome is Outcome.REPEAT
            if status is None:
                pending_repeats += repeat
                pending_conflicts += not repeat
            else:
                status = count(status, repeats=int(repeat), conflicts=int(not repeat))
        outcomes.append(outcome)
    return status, outcomes
