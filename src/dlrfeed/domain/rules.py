"""The rules: one pure planner that decides every delivery's outcome and every message's status.

Pure (no I/O). Every path of the store asks the same `Planner` - the live ingest (the held state
read first), late correlation and `dlrfeed recompute` (every reception of the message replayed
from no state) - so the computed status is the same rules over the same arrival order whatever
path the receipts took (P19). Two layers, as P13 has them:
- the *key* layer (P14): a delivery of a logical event key (id, level) is new content, a repeat
  (of content held or seen conflicting), an update the key accepts (level-1 progress; at level
  2 anything but a second applicable result) or a conflict (two applicable results of a level-2
  key), a function of the contents the key holds;
- the *message* layer (P16-P19): the transition table of `transitions`, held basis kind x
  incoming kind.
docs/rules.md states the table and what does and does not depend on arrival order.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from enum import Enum
from typing import Any, NamedTuple, Protocol, assert_never

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.status import Outcome, Status
from dlrfeed.domain.transitions import (
    KIND_OF,
    Action,
    Kind,
    kind_of,
    level_stat_mismatch,
    transition_table,
)

RULES_VERSION = "rules-3"
"""P8: recorded on events and on the projection; bump when any rule changes (rows with another
version are stale: `dlrfeed recompute`)."""

CLOCK_SKEW_TOLERANCE = timedelta(minutes=10)
"""P19: how much earlier than the recorded submission a reported time may be and still be used.
SMPP dates often have minute resolution, and the SMSC's clock is not ours."""

FUTURE_TOLERANCE_S = 86_400.0
"""P19: a reported time more than a day after the receipt was received is implausible."""

ARRIVAL_ORDER_TIE = "arrival_order_tie"
"""Status flag (P19): two events could not be ordered by reported time; the first arrived stays."""
DONE_DATE_IMPLAUSIBLE = "done_date_implausible"
"""Status flag (P19): a reported time was implausible; kept raw, not used to order or measure."""

STAT_INFERRED = "stat_inferred"
"""Event and status flag (P2): the gateway inferred the stat from its class of report (Kannel's
report type without the network's receipt); the reason never calls it the network's."""

# Parse flags that deserve no `malformed` exception; ND/empty dates are documented absences,
# and an inferred stat is said in the status's reason.
_BENIGN_FLAG_SUFFIXES = ("_nd", "_empty", "stat_unrecognized", STAT_INFERRED)


class Observed(Protocol):
    """What the planner reads of one delivery: the parsed receipt (`parse.LogicalEvent` is
    one) or a stored reception replayed (`Delivery`)."""

    @property
    def message_id(self) -> str: ...
    @property
    def correlation_id(self) -> str: ...
    @property
    def level(self) -> int: ...
    @property
    def status(self) -> Status: ...
    @property
    def stat(self) -> str: ...
    @property
    def err(self) -> str | None: ...
    @property
    def done_at(self) -> datetime | None: ...
    @property
    def received_at(self) -> float: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def flags(self) -> tuple[str, ...]: ...


class Delivery(NamedTuple):
    """A stored reception as the planner reads it (late correlation, recompute)."""

    message_id: str
    correlation_id: str
    level: int
    status: Status
    stat: str
    err: str | None
    done_at: datetime | None
    received_at: float
    fingerprint: str
    flags: tuple[str, ...]


class KeyContents(NamedTuple):
    """P14: what one logical event key holds: its first content's status, the fingerprints of
    every content it accepted (the first, then progress updates, a level-2 result after a
    level-2 progress or unrecognized stat, or an option's second result) in arrival order, the
    statuses of the applicable results it accepted after its first content, and the
    fingerprints of the other contents that conflicted with its result, once each."""

    first_status: Status
    fingerprints: tuple[str, ...]
    later_results: tuple[Status, ...] = ()
    conflicting: tuple[str, ...] = ()

    def results(self, level: int) -> tuple[Status, ...]:
        """P14: the applicable results the key holds (its first content's, then the later)."""
        if _is_result(kind_of(level, self.first_status)):
            return (self.first_status, *self.later_results)
        return self.later_results


def _is_result(kind: Kind) -> bool:
    """P14: only an applicable result (a final stat at level 2) takes a key's result place."""
    return kind is Kind.NETWORK_RESULT or kind is Kind.UNKNOWN_RESULT


class Basis(NamedTuple):
    """P7: the delivery a computed status rests on."""

    event_id: int
    reception_id: int
    level: int
    status: Status
    stat: str
    err: str | None
    order_at: datetime | None
    """The reported done time when plausible (P19), else None: what orders and measures."""


class MessageState(NamedTuple):
    """P7/P20: the planner's state of one correlated message; a status exists once a basis does."""

    basis: Basis | None
    repeats: int = 0
    """P14/P20: deliveries that repeated content their key already held."""
    conflicts: int = 0
    """P14/P18: conflicting level-2 deliveries of a key plus incompatible results."""
    progress_events: int = 0
    """Distinct progress observations (first contents and progress updates), applied or not."""
    deadline_superseded: bool = False
    """Option `deadline_unknown_superseded` took effect for this message."""
    flags: frozenset[str] = frozenset()
    """ARRIVAL_ORDER_TIE, DONE_DATE_IMPLAUSIBLE, STAT_INFERRED."""


EMPTY_STATE = MessageState(None)


def basis_kind(basis: Basis) -> Kind:
    """The table's held kind of a basis."""
    return kind_of(basis.level, basis.status)


def is_final(state: MessageState) -> bool:
    """P16/F13: a message is final only on a level-2 result."""
    return state.basis is not None and basis_kind(state.basis) is not Kind.PROGRESS


def explain(state: MessageState) -> str:
    """P7: the reason for a status, saying what was reported and never more (P2)."""
    basis = state.basis
    if basis is None:
        return "no applicable receipt yet"
    err = "" if basis.err is None else f", err {basis.err}"
    kind = basis_kind(basis)
    if kind is Kind.PROGRESS:
        if level_stat_mismatch(basis.level, basis.status):
            if basis.level == 1:
                return (
                    f"progress receipt (level 1) reporting {basis.stat}{err}: "
                    "a progress report, not a result, so not final (F4)"
                )
            return (
                f"result receipt (level 2) reporting the progress stat {basis.stat}{err}: "
                "counted as progress (F4)"
            )
        if STAT_INFERRED in state.flags:
            return f"in progress as inferred by the gateway, no stat reported: {basis.stat}{err}"
        return f"in progress as reported by the network: {basis.stat}{err}"
    # P23: the reason names the basis only. Whether an UNKNOWN was superseded (in either
    # order) is the status' `deadline_superseded`, so an UNKNOWN arriving after the network
    # result changes no reason and emits no change.
    if kind is Kind.UNKNOWN_RESULT:
        return f"result reported (level 2): UNKNOWN{err}"
    if STAT_INFERRED in state.flags:
        return (
            f"final status inferred by the gateway from its report's class, no stat reported "
            f"by the network: {basis.stat}{err}"
        )
    return f"final status reported by the network: {basis.stat}{err}"


class PlannedException(NamedTuple):
    """An investigation-queue item the rules open for one delivery (P12, P14, P17, P18, C4).

    `message_level` items come from the message layer and are opened only where the message's
    rules run; the others are opened when the delivery is first stored, correlated or not."""

    kind: str
    details: Mapping[str, Any]
    message_level: bool


class Decision(NamedTuple):
    """The planner's answer for one delivery."""

    outcome: Outcome
    exceptions: tuple[PlannedException, ...]


class KeyClass(Enum):
    """P14: what a delivery is to its logical event key."""

    NEW = "new"
    """The key's first content."""
    UPDATE = "update"
    """Another content the key accepts: a level-1 progress update; at level 2 a progress or
    unrecognized stat, a result while the key holds none, or an option's second result."""
    REPEAT = "repeat"
    """Content the key already holds, or that already conflicted with it (C1)."""
    CONFLICT = "conflict"
    """Another applicable result of a level-2 key holding one: kept, flagged, never applied."""

    __hash__ = object.__hash__


def classify(
    known: KeyContents | None, delivery: Observed, options: IntegrationOptions
) -> KeyClass:
    """P14: a delivery against the contents its key holds. Content seen before, held or
    conflicting, is a repeat. Only two applicable results of a level-2 key conflict: a level-2
    progress or unrecognized stat is kept as content and leaves the result place free."""
    if known is None:
        return KeyClass.NEW
    if delivery.fingerprint in known.fingerprints or delivery.fingerprint in known.conflicting:
        return KeyClass.REPEAT
    if delivery.level != 2:
        # Progress updates (and unexpected levels, never applied anyway) are kept as content.
        return KeyClass.UPDATE
    incoming = kind_of(2, delivery.status)
    if not _is_result(incoming):
        return KeyClass.UPDATE
    results = known.results(2)
    if not results:
        return KeyClass.UPDATE
    pair = {kind_of(2, results[0]), incoming}
    if (
        options.deadline_unknown_superseded
        and len(results) == 1
        and pair == {Kind.NETWORK_RESULT, Kind.UNKNOWN_RESULT}
    ):
        return KeyClass.UPDATE
    return KeyClass.CONFLICT


def is_malformed(flags: tuple[str, ...]) -> bool:
    """C4: parse flags that open a `malformed` exception (absences ND/empty do not)."""
    return any(not flag.endswith(_BENIGN_FLAG_SUFFIXES) for flag in flags)


_NO_EXCEPTIONS: tuple[PlannedException, ...] = ()
_PLAIN = {outcome: Decision(outcome, _NO_EXCEPTIONS) for outcome in Outcome}
_REPEAT = _PLAIN[Outcome.REPEAT]
_TIE = frozenset({ARRIVAL_ORDER_TIE})
_IMPLAUSIBLE = frozenset({DONE_DATE_IMPLAUSIBLE})
_INFERRED = frozenset({STAT_INFERRED})


class Planner:
    """Decides, delivery by delivery in arrival order, each outcome and each message's state.

    Holds only what it was given and what it decided: `keys` (the contents each known key
    holds), `messages` (the state of each correlated message; absent = not correlated) and
    `submitted` (each correlated message's recorded submission time). After the deliveries,
    the store writes `messages` that changed, `key_updates`, and the event counters.
    """

    def __init__(
        self,
        options: IntegrationOptions,
        keys: dict[tuple[str, int], KeyContents],
        messages: dict[str, MessageState],
        submitted: Mapping[str, datetime | None],
    ) -> None:
        self.options = options
        self.table = transition_table(options)
        self.keys = keys
        self.messages = messages
        self.submitted = submitted
        self.key_updates: dict[int, list[str]] = {}
        """Event id -> fingerprints of the contents its key accepted in these deliveries."""
        self.key_results: dict[int, list[str]] = {}
        """Event id -> statuses of the results its key accepted after its first content here."""
        self.key_conflicting: dict[int, list[str]] = {}
        """Event id -> fingerprints of the contents that conflicted with its key's result here."""
        self.event_accepted: dict[int, int] = {}
        """Event id -> deliveries that were not conflicts (repeats - of a conflicting content
        too -, updates), new ones excluded: the increment of `times_received`."""
        self.event_conflicts: dict[int, int] = {}
        self.event_last: dict[int, float] = {}
        """Event id -> the latest receive time among these deliveries (first ones excluded)."""
        # The bounds of a plausible time, in the zone of the reported times: comparing two
        # times of one tzinfo skips the zone look-ups (per delivery, on the ingest hot path).
        self._latest: dict[tuple[float, tzinfo | None], datetime] = {}
        self._earliest: dict[tuple[str, tzinfo | None], datetime | None] = {}

    def _order_time(self, d: Observed) -> tuple[datetime | None, bool]:
        """P19: the reported time usable to order and measure, and whether it was implausible
        (more than FUTURE_TOLERANCE_S after the receipt was received, or earlier than the
        recorded submission by more than CLOCK_SKEW_TOLERANCE)."""
        done = d.done_at
        if done is None:
            return None, False
        zone = done.tzinfo
        latest = self._latest.get((d.received_at, zone))
        if latest is None:
            latest = datetime.fromtimestamp(d.received_at + FUTURE_TOLERANCE_S, zone)
            self._latest[(d.received_at, zone)] = latest
        if done > latest:
            return None, True
        key = (d.correlation_id, zone)
        if key in self._earliest:
            earliest = self._earliest[key]
        else:
            submitted = self.submitted.get(d.correlation_id)
            earliest = self._earliest[key] = (
                None if submitted is None else (submitted - CLOCK_SKEW_TOLERANCE).astimezone(zone)
            )
        if earliest is not None and done < earliest:
            return None, True
        return done, False

    def decide(self, d: Observed, event_id: int, reception_id: int) -> Decision:
        """The outcome of delivery `d` - of logical event `event_id`, stored as reception
        `reception_id` (its arrival order) - and the exceptions it opens; updates the states."""
        key = (d.message_id, d.level)
        known = self.keys.get(key)
        # classify(), inlined for its two common answers (once per delivery, hot path).
        if known is None:
            key_class = KeyClass.NEW
        elif d.fingerprint in known.fingerprints:
            key_class = KeyClass.REPEAT
        else:
            key_class = classify(known, d, self.options)
        cid = d.correlation_id
        state = self.messages.get(cid)
        if key_class is KeyClass.NEW:
            self.keys[key] = KeyContents(d.status, (d.fingerprint,))
        else:
            last = self.event_last.get(event_id, 0.0)
            self.event_last[event_id] = d.received_at if d.received_at > last else last
            if key_class is KeyClass.CONFLICT:
                # P14/C1: the conflicting content is remembered, so a redelivery of it is a
                # repeat: one conflict, one exception, however often it comes.
                assert known is not None
                self.event_conflicts[event_id] = self.event_conflicts.get(event_id, 0) + 1
                self.keys[key] = known._replace(conflicting=(*known.conflicting, d.fingerprint))
                self.key_conflicting.setdefault(event_id, []).append(d.fingerprint)
            else:
                self.event_accepted[event_id] = self.event_accepted.get(event_id, 0) + 1
                if key_class is KeyClass.UPDATE:
                    assert known is not None
                    later = known.later_results
                    if d.level == 2 and _is_result(KIND_OF[(2, d.status)]):
                        later = (*later, d.status)
                        self.key_results.setdefault(event_id, []).append(d.status.value)
                    self.keys[key] = known._replace(
                        fingerprints=(*known.fingerprints, d.fingerprint), later_results=later
                    )
                    self.key_updates.setdefault(event_id, []).append(d.fingerprint)
        if key_class is KeyClass.REPEAT:
            if state is not None:
                self.messages[cid] = state._replace(repeats=state.repeats + 1)
            return _REPEAT
        exceptions: list[PlannedException] = []
        if d.flags and is_malformed(d.flags):
            exceptions.append(
                PlannedException("malformed", {"flags": list(d.flags), "rule": "C4"}, False)
            )
        if key_class is KeyClass.CONFLICT:
            assert known is not None
            exceptions.append(
                PlannedException(
                    "conflict",
                    {
                        "cause": "same_key_other_content",
                        "rule": "P14",
                        "level": d.level,
                        "stored_event_id": event_id,
                        "stored_fingerprint": known.fingerprints[0],
                        "fingerprint": d.fingerprint,
                        "stat": d.stat,
                        "err": d.err,
                    },
                    False,
                )
            )
            if state is not None:
                self.messages[cid] = state._replace(conflicts=state.conflicts + 1)
            return Decision(Outcome.CONFLICT, tuple(exceptions))
        if state is None:
            if key_class is KeyClass.NEW:
                # P12/C5: no message with this id; never guessed from destination or text.
                exceptions.append(
                    PlannedException(
                        "uncorrelated",
                        {"rule": "P12", "correlation_id": cid, "level": d.level, "stat": d.stat},
                        False,
                    )
                )
            return Decision(Outcome.UNCORRELATED, tuple(exceptions))
        outcome = self._apply(state, d, event_id, reception_id, exceptions)
        return Decision(outcome, tuple(exceptions)) if exceptions else _PLAIN[outcome]

    def _apply(
        self,
        state: MessageState,
        d: Observed,
        event_id: int,
        reception_id: int,
        exceptions: list[PlannedException],
    ) -> Outcome:
        """The message layer: new content `d` against the held basis (the transition table);
        the message's new state is stored in `messages`."""
        incoming = KIND_OF.get((d.level, d.status), Kind.UNEXPECTED_LEVEL)
        basis = state.basis
        held = Kind.NONE if basis is None else KIND_OF[(basis.level, basis.status)]
        action = self.table[(held, incoming)]
        if action is Action.NOT_APPLIED:
            if incoming is Kind.UNEXPECTED_LEVEL:
                return Outcome.UNEXPECTED_LEVEL
            exceptions.append(
                PlannedException(
                    "unrecognized", {"rule": "P17", "stat": d.stat, "level": d.level}, True
                )
            )
            return Outcome.UNRECOGNIZED
        at, implausible = self._order_time(d)
        flags = state.flags | _IMPLAUSIBLE if implausible else state.flags
        progress = state.progress_events + (incoming is Kind.PROGRESS)
        superseded = state.deadline_superseded
        take = False
        if action is Action.TAKE:
            take, outcome = True, Outcome.APPLIED
        elif action is Action.IGNORE_PROGRESS:
            outcome = Outcome.LATE_PROGRESS
        elif basis is None:
            raise AssertionError("only TAKE and NOT_APPLIED apply without a held basis")
        elif action is Action.NEWER_PROGRESS:
            if d.level != basis.level:  # F13: any level-2 receipt outranks any level-1 one
                take = d.level > basis.level
            elif at is None or basis.order_at is None or at == basis.order_at:
                # P19: no basis to order them: the first arrived stays, and the tie is flagged.
                flags = flags | _TIE
            else:
                take = at > basis.order_at
            outcome = Outcome.APPLIED if take else Outcome.LATE_PROGRESS
        elif action is Action.SAME_RESULT_OR_CONFLICT:
            if d.status is basis.status:
                # P18: a corroborating report changes nothing of the final - not its err, its
                # basis or its reason (P23: nothing new to emit); it is kept as evidence.
                outcome = Outcome.CORROBORATED
            else:
                # P18/C3: the first result applied stays; the later incompatible one is kept.
                exceptions.append(
                    PlannedException(
                        "conflict",
                        {
                            "cause": "incompatible_final",
                            "rule": "P18",
                            "held_status": basis.status.value,
                            "held_event_id": basis.event_id,
                            "incoming_status": d.status.value,
                            "incoming_stat": d.stat,
                        },
                        True,
                    )
                )
                self.messages[d.correlation_id] = state._replace(
                    conflicts=state.conflicts + 1, progress_events=progress, flags=flags
                )
                return Outcome.CONFLICT
        elif action is Action.SUPERSEDE_UNKNOWN:
            take, superseded, outcome = True, True, Outcome.APPLIED
        elif action is Action.UNKNOWN_SUPERSEDED:
            superseded, outcome = True, Outcome.SUPERSEDED
        else:
            assert_never(action)
        if take:
            basis = Basis(event_id, reception_id, d.level, d.status, d.stat, d.err, at)
            # P2: whether the status rests on an inferred stat is the basis's, not history's.
            flags = flags | _INFERRED if STAT_INFERRED in d.flags else flags - _INFERRED
        self.messages[d.correlation_id] = MessageState(
            basis, state.repeats, state.conflicts, progress, superseded, flags
        )
        return outcome


def status_change(old: Mapping[str, Any], new: MessageState) -> str | None:
    """P8: what differs between a stored status row and the state the rules compute now, in
    words for the audit trail; None when nothing a reader sees differs."""
    basis = new.basis
    if basis is None:
        return f"no applicable receipt under the current rules (was {old['status']})"
    now = {
        "status": basis.status.value,
        "is_final": is_final(new),
        "reason": explain(new),
        "supporting_event_id": basis.event_id,
        "repeats": new.repeats,
        "conflicts": new.conflicts,
        "progress_events": new.progress_events,
        "deadline_superseded": new.deadline_superseded,
    }
    changes = [
        f"{name} {old[name]!r} -> {value!r}" for name, value in now.items() if old[name] != value
    ]
    return "; ".join(changes) or None
