"""The reference: docs/rules.md's rule table, restated as a small and slow interpreter.

It shares no code with `dlrfeed.domain` (not even the stat mapping or the outcome names): it
reads the table in docs/rules.md as written, over the deliveries of ONE sent message in their
arrival order, and says what the status, the counters, each delivery's outcome and the
exceptions must be. Tests and the invariant checker (`dlrfeed_tools.invariants`) compare
the real store with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

STAT_STATUS = {
    "ACCEPTD": "ACCEPTED",
    "ENROUTE": "ENROUTE",
    "DELIVRD": "DELIVERED",
    "UNDELIV": "UNDELIVERABLE",
    "EXPIRED": "EXPIRED",
    "DELETED": "DELETED",
    "REJECTD": "REJECTED",
    "UNKNOWN": "UNKNOWN",
}
PROGRESS = {"ACCEPTED", "ENROUTE"}
SKEW = timedelta(minutes=10)
FUTURE = timedelta(days=1)

# docs/rules.md, "The transition table": held x incoming -> what happens.
TABLE = {
    ("none", "progress"): "take",
    ("none", "network"): "take",
    ("none", "unknown"): "take",
    ("progress", "progress"): "newer",
    ("progress", "network"): "take",
    ("progress", "unknown"): "take",
    ("network", "progress"): "late",
    ("unknown", "progress"): "late",
    ("network", "network"): "same-or-conflict",
    ("network", "unknown"): "same-or-conflict",
    ("unknown", "network"): "same-or-conflict",
    ("unknown", "unknown"): "same-or-conflict",
}
OPTION_CELLS = {("unknown", "network"): "supersede", ("network", "unknown"): "superseded"}


@dataclass(frozen=True)
class Sent:
    """One delivery of a receipt of the message: the fields the rules read."""

    receipt_id: str
    level: int
    stat: str
    err: str | None
    done: datetime | None
    """The reported done time as parsed (None when absent, ND or unparsable)."""
    done_raw: str | None
    received_at: float


@dataclass
class Expected:
    """What the store must hold for the message after the deliveries."""

    status: str | None = None
    is_final: bool = False
    basis: int | None = None
    """Index (in arrival order) of the delivery the status rests on."""
    basis_time: datetime | None = None
    repeats: int = 0
    conflicts: int = 0
    progress_events: int = 0
    superseded: bool = False
    flags: set[str] = field(default_factory=set)
    outcomes: list[str] = field(default_factory=list)
    key_outcomes: list[str] = field(default_factory=list)
    """Each delivery's outcome had it been stored before the message was recorded: only the
    key layer's answer (repeat, conflict of a level-2 key), else `uncorrelated`."""
    exceptions: Counter[str] = field(default_factory=Counter)
    """Kind (and cause for conflicts) -> count, except `uncorrelated` (resolved on recording)."""


def kind(level: int, stat: str) -> str:
    if level not in (1, 2):
        return "level"
    status = STAT_STATUS.get(stat)
    if status is None:
        return "unrecognized"
    if level == 1 or status in PROGRESS:
        return "progress"
    return "unknown" if status == "UNKNOWN" else "network"


def mismatched(level: int, stat: str) -> bool:
    status = STAT_STATUS.get(stat)
    if status is None:
        return False
    return (level == 1 and status not in PROGRESS) or (level == 2 and status in PROGRESS)


def usable_time(sent: Sent, submitted_at: datetime | None) -> tuple[datetime | None, bool]:
    if sent.done is None:
        return None, False
    if sent.done > datetime.fromtimestamp(sent.received_at, UTC) + FUTURE:
        return None, True
    if submitted_at is not None and sent.done < submitted_at - SKEW:
        return None, True
    return sent.done, False


def expect(
    deliveries: list[Sent],
    *,
    submitted_at: datetime | None = None,
    superseding: bool = False,
    malformed_dates: frozenset[int] = frozenset(),
) -> Expected:
    """The rules over `deliveries` in arrival order, the message recorded (correlated).

    `malformed_dates`: indexes of deliveries whose done date could not be parsed (a C4 flag).
    """
    out = Expected()
    contents: dict[tuple[str, int], list[tuple[str, str | None, str | None]]] = {}
    conflicting: dict[tuple[str, int], list[tuple[str, str | None, str | None]]] = {}
    results: dict[tuple[str, int], list[str]] = {}
    """The kinds of the applicable results each key took ("network", "unknown")."""
    held: tuple[int, Sent, datetime | None] | None = None  # index, delivery, usable time
    for index, sent in enumerate(deliveries):
        key = (sent.receipt_id, sent.level)
        content = (sent.stat, sent.err, sent.done_raw)
        seen = contents.get(key)
        this_kind = kind(sent.level, sent.stat)
        if seen is not None and (content in seen or content in conflicting.get(key, [])):
            # Content seen before, held or conflicting: a repeat (P14, C1).
            out.repeats += 1
            out.outcomes.append("repeat")
            out.key_outcomes.append("repeat")
            continue
        if (
            sent.level not in (1, 2)
            or mismatched(sent.level, sent.stat)
            or index in (malformed_dates)
        ):
            out.exceptions["malformed"] += 1
        # Only two applicable results of one level-2 key conflict; a progress or unrecognized
        # stat leaves the result place to the result that follows it.
        held_results = results.get(key, [])
        if sent.level == 2 and this_kind in ("network", "unknown") and held_results:
            pair = {held_results[0], this_kind}
            if not (superseding and len(held_results) == 1 and pair == {"unknown", "network"}):
                out.conflicts += 1
                out.exceptions["conflict:same_key_other_content"] += 1
                out.outcomes.append("conflict")
                out.key_outcomes.append("conflict")
                conflicting.setdefault(key, []).append(content)
                continue
        out.key_outcomes.append("uncorrelated")
        if seen is None:
            contents[key] = [content]
        else:
            seen.append(content)
        if sent.level == 2 and this_kind in ("network", "unknown"):
            results.setdefault(key, []).append(this_kind)
        if this_kind == "level":
            out.outcomes.append("unexpected_level")
            continue
        if this_kind == "unrecognized":
            out.exceptions["unrecognized"] += 1
            out.outcomes.append("unrecognized")
            continue
        at, implausible = usable_time(sent, submitted_at)
        if implausible:
            out.flags.add("done_date_implausible")
        if this_kind == "progress":
            out.progress_events += 1
        held_kind = "none" if held is None else kind(held[1].level, held[1].stat)
        cell = TABLE[(held_kind, this_kind)]
        if superseding:
            cell = OPTION_CELLS.get((held_kind, this_kind), cell)
        if cell == "take":
            held = (index, sent, at)
            out.outcomes.append("applied")
        elif cell == "late":
            out.outcomes.append("late_progress")
        elif cell == "newer":
            assert held is not None
            _, held_sent, held_at = held
            if sent.level > held_sent.level:
                held = (index, sent, at)
                out.outcomes.append("applied")
            elif sent.level < held_sent.level:
                out.outcomes.append("late_progress")
            elif at is None or held_at is None or at == held_at:
                out.flags.add("arrival_order_tie")
                out.outcomes.append("late_progress")
            elif at > held_at:
                held = (index, sent, at)
                out.outcomes.append("applied")
            else:
                out.outcomes.append("late_progress")
        elif cell == "same-or-conflict":
            assert held is not None
            _, held_sent, held_at = held
            if STAT_STATUS[sent.stat] == STAT_STATUS[held_sent.stat]:
                # P18: a corroborating report changes nothing of the final.
                out.outcomes.append("corroborated")
            else:
                out.conflicts += 1
                out.exceptions["conflict:incompatible_final"] += 1
                out.outcomes.append("conflict")
        elif cell == "supersede":
            held = (index, sent, at)
            out.superseded = True
            out.outcomes.append("applied")
        else:
            assert cell == "superseded"
            out.superseded = True
            out.outcomes.append("superseded")
    if held is not None:
        index, sent, at = held
        out.basis, out.basis_time = index, at
        out.status = STAT_STATUS[sent.stat]
        out.is_final = kind(sent.level, sent.stat) in ("network", "unknown")
    return out
