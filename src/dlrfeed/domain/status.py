"""The vocabulary of the rules: normalised statuses and the outcomes of applying an event."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """P17 normalised layer: an internal category of the raw `stat` (docs/spec/interfaces.md §4)."""

    ACCEPTED = "ACCEPTED"
    ENROUTE = "ENROUTE"
    DELIVERED = "DELIVERED"
    UNDELIVERABLE = "UNDELIVERABLE"
    EXPIRED = "EXPIRED"
    DELETED = "DELETED"
    REJECTED = "REJECTED"
    UNKNOWN = "UNKNOWN"
    UNRECOGNIZED = "UNRECOGNIZED"
    """A `stat` outside the documented mapping: kept raw, flagged, never applied (P17)."""


class Outcome(StrEnum):
    """What the store did with one delivery (per reception) or one logical event."""

    APPLIED = "applied"
    """A new logical event that the status now reflects (or is a candidate of, for progress)."""
    REPEAT = "repeat"
    """P14: same key, same fingerprint as a stored event; only repeat counters change."""
    LATE_PROGRESS = "late_progress"
    """F13/C2: a progress event older than what the status already holds; recorded, not applied."""
    SUPERSEDED = "superseded"
    """A deadline `UNKNOWN` arriving after a network final, with `deadline_unknown_superseded`."""
    CORROBORATED = "corroborated"
    """Another logical event reporting the same final status as the one held; nothing changes."""
    CONFLICT = "conflict"
    """P14/P18/C3: same key with other content, or an incompatible final; kept, flagged."""
    UNCORRELATED = "uncorrelated"
    """P12: no sent message with this id (yet); waits in the exceptions queue."""
    UNRECOGNIZED = "unrecognized"
    """P17: unknown `stat`; kept raw, flagged, never applied."""
    UNEXPECTED_LEVEL = "unexpected_level"
    """F4: a level other than 1 or 2; kept raw, flagged (`malformed`), never applied."""
    UNSTORABLE = "unstorable"
    """C8: the database refused the receipt; its raw bytes are in the exceptions queue."""


# P16 / docs/spec/interfaces.md §4: the documented mapping of raw `stat` to the normalised status.
STAT_TO_STATUS: dict[str, Status] = {
    "ACCEPTD": Status.ACCEPTED,
    "ENROUTE": Status.ENROUTE,
    "DELIVRD": Status.DELIVERED,
    "UNDELIV": Status.UNDELIVERABLE,
    "EXPIRED": Status.EXPIRED,
    "DELETED": Status.DELETED,
    "REJECTD": Status.REJECTED,
    "UNKNOWN": Status.UNKNOWN,
}

# P16: ENROUTE/ACCEPTD are intermediate; the rest (the deadline UNKNOWN included) are final.
PROGRESS_STATUSES: frozenset[Status] = frozenset({Status.ACCEPTED, Status.ENROUTE})
FINAL_STATUSES: frozenset[Status] = frozenset(
    {
        Status.DELIVERED,
        Status.UNDELIVERABLE,
        Status.EXPIRED,
        Status.DELETED,
        Status.REJECTED,
        Status.UNKNOWN,
    }
)
