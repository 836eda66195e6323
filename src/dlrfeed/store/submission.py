"""The sending side's record of a sent message (P5), as `record-submissions` takes it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import normalise_destination, stored_id


@dataclass(frozen=True, slots=True)
class Submission:
    """One message as the sending application recorded it when the gateway accepted it (P3, P5).

    `message_id` is the gateway's id exactly as returned; `destination` the addressing exactly
    as sent (normalised to E.164 on the way in, raw kept). `internal_id` defaults to the
    message id when the sender has no id of its own.
    """

    login: str
    message_id: str
    destination: str
    internal_id: str | None = None
    source: str | None = None
    submitted_at: datetime | None = None
    dlr_requested: bool = True
    dlr_level: int | None = None
    route: str | None = None

    def normalised(self, options: IntegrationOptions) -> tuple[Any, ...]:
        """The row of `recording.INSERT_MESSAGES` (after login): one value of each of its column
        arrays, in the order of its parameters."""
        destination, is_e164 = normalise_destination(self.destination, options)
        # P24: an id that cannot be kept as received is kept as its receipts' ids are.
        message_id = stored_id(self.message_id)
        return (
            message_id,
            self.internal_id if self.internal_id is not None else message_id,
            destination,
            self.destination,
            is_e164,
            self.source,
            self.route,
            self.submitted_at,
            self.dlr_requested,
            self.dlr_level,
        )


@dataclass(frozen=True, slots=True)
class SubmissionResult:
    """What `Store.record_submissions` did."""

    recorded: int
    """Messages newly recorded."""
    already_recorded: int
    """Submissions whose (login, message_id) was already there (left unchanged)."""
    late_correlated_events: int
    """Waiting logical events applied now that their message exists (late correlation)."""
