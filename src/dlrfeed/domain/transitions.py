"""The message layer's state machine (P16-P19): what a delivery or a held basis is (its kind),
what a transition does (its action), and the table of (held, incoming) -> action.

Pure data and lookups, read by the `rules.Planner` for every delivery. docs/rules.md states the
table in words, with what does and does not depend on arrival order.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from functools import lru_cache
from types import MappingProxyType

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.status import FINAL_STATUSES, PROGRESS_STATUSES, Status


class Kind(Enum):
    """What a delivery or a held basis is, for the transition table (P16, F4, F13)."""

    NONE = "none"
    """No basis yet (only as the held side)."""
    PROGRESS = "progress"
    """Level 1 whatever its stat, or level 2 with a progress stat (flagged)."""
    NETWORK_RESULT = "network_result"
    """Level 2 with DELIVRD, UNDELIV, EXPIRED, DELETED or REJECTD."""
    UNKNOWN_RESULT = "unknown_result"
    """Level 2 with UNKNOWN (what the gateway sends at its receipt deadline, F3)."""
    UNRECOGNIZED = "unrecognized"
    """A `stat` outside the mapping (only as the incoming side): never applied (P17)."""
    UNEXPECTED_LEVEL = "unexpected_level"
    """A level other than 1 or 2 (only as the incoming side): never applied (F4)."""

    # Members are singletons compared by identity; Enum's own __hash__ is Python code, and the
    # table is looked up by Kind pairs once per delivery.
    __hash__ = object.__hash__


class Action(Enum):
    """What a transition does."""

    TAKE = "take"
    """The delivery becomes the basis of the status (outcome applied)."""
    NEWER_PROGRESS = "newer_progress"
    """Progress vs progress: level 2 over level 1 (F13), then the later reported time (P19)."""
    IGNORE_PROGRESS = "ignore_progress"
    """Progress under a result: recorded, never applied (F13, C2; outcome late_progress)."""
    SAME_RESULT_OR_CONFLICT = "same_result_or_conflict"
    """Result vs result: the same status corroborates, another one conflicts (P18, C3)."""
    SUPERSEDE_UNKNOWN = "supersede_unknown"
    """Option: a network result replaces a held UNKNOWN (outcome applied)."""
    UNKNOWN_SUPERSEDED = "unknown_superseded"
    """Option: an UNKNOWN under a held network result is recorded, not applied."""
    NOT_APPLIED = "not_applied"
    """Unrecognized stat or unexpected level: nothing changes (P17, F4)."""


_NEVER_APPLIED = {
    (held, incoming): Action.NOT_APPLIED
    for held in (Kind.NONE, Kind.PROGRESS, Kind.NETWORK_RESULT, Kind.UNKNOWN_RESULT)
    for incoming in (Kind.UNRECOGNIZED, Kind.UNEXPECTED_LEVEL)
}

# P16-P19: (held, incoming) -> action. Conservative defaults (P18): a result is never replaced
# by another result, and progress never moves a result (F13).
TRANSITIONS: Mapping[tuple[Kind, Kind], Action] = MappingProxyType(
    {
        (Kind.NONE, Kind.PROGRESS): Action.TAKE,
        (Kind.NONE, Kind.NETWORK_RESULT): Action.TAKE,
        (Kind.NONE, Kind.UNKNOWN_RESULT): Action.TAKE,
        (Kind.PROGRESS, Kind.PROGRESS): Action.NEWER_PROGRESS,
        (Kind.PROGRESS, Kind.NETWORK_RESULT): Action.TAKE,
        (Kind.PROGRESS, Kind.UNKNOWN_RESULT): Action.TAKE,
        (Kind.NETWORK_RESULT, Kind.PROGRESS): Action.IGNORE_PROGRESS,
        (Kind.NETWORK_RESULT, Kind.NETWORK_RESULT): Action.SAME_RESULT_OR_CONFLICT,
        (Kind.NETWORK_RESULT, Kind.UNKNOWN_RESULT): Action.SAME_RESULT_OR_CONFLICT,
        (Kind.UNKNOWN_RESULT, Kind.PROGRESS): Action.IGNORE_PROGRESS,
        (Kind.UNKNOWN_RESULT, Kind.NETWORK_RESULT): Action.SAME_RESULT_OR_CONFLICT,
        (Kind.UNKNOWN_RESULT, Kind.UNKNOWN_RESULT): Action.SAME_RESULT_OR_CONFLICT,
        **_NEVER_APPLIED,
    }
)

# P18: integration options, each overriding named cells of the table when switched on.
OPTION_TRANSITIONS: Mapping[str, Mapping[tuple[Kind, Kind], Action]] = {
    "deadline_unknown_superseded": {
        (Kind.UNKNOWN_RESULT, Kind.NETWORK_RESULT): Action.SUPERSEDE_UNKNOWN,
        (Kind.NETWORK_RESULT, Kind.UNKNOWN_RESULT): Action.UNKNOWN_SUPERSEDED,
    },
}


def _kind_by_rule(level: int, status: Status) -> Kind:
    """F4/F13/P16: the rule itself, from a delivery's level *and* its normalised status."""
    if level != 1 and level != 2:
        return Kind.UNEXPECTED_LEVEL
    if status is Status.UNRECOGNIZED:
        return Kind.UNRECOGNIZED
    if level == 1 or status in PROGRESS_STATUSES:
        return Kind.PROGRESS
    if status is Status.UNKNOWN:
        return Kind.UNKNOWN_RESULT
    return Kind.NETWORK_RESULT


KIND_OF: Mapping[tuple[int, Status], Kind] = {
    (level, status): _kind_by_rule(level, status) for level in (1, 2) for status in Status
}
"""Every kind of the levels 1 and 2, worked out once by the rule: the planner looks a
delivery's kind up here once or twice per delivery on the ingest hot path."""


def kind_of(level: int, status: Status) -> Kind:
    """F4/F13/P16: the kind of a delivery, from its level *and* its normalised status."""
    return KIND_OF.get((level, status), Kind.UNEXPECTED_LEVEL)


def level_stat_mismatch(level: int, status: Status) -> bool:
    """F4: a level-1 receipt with a final stat, or a level-2 receipt with a progress stat."""
    return (level == 1 and status in FINAL_STATUSES) or (level == 2 and status in PROGRESS_STATUSES)


@lru_cache(maxsize=16)
def transition_table(options: IntegrationOptions) -> Mapping[tuple[Kind, Kind], Action]:
    """The table in force under `options`: the defaults with each enabled option's cells."""
    table = dict(TRANSITIONS)
    for name, cells in OPTION_TRANSITIONS.items():
        if getattr(options, name):
            table.update(cells)
    return MappingProxyType(table)
