"""Independent verification (C6): what the sender knows of a message beyond the network's word.

A verification is evidence of its own - an OTP code entered, a reply received, a link opened -
recorded by the sending application with `dlrfeed record-verifications`. It is kept apart from
the DLR status: nothing the rules compute reads it (P2: DELIVRD is the network's word, never
"read"), and the reports put it beside the status (`dlrfeed show`, `dlrfeed quality`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from dlrfeed.domain.parse import stored_id
from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

_INSERT_VERIFICATIONS = query("insert_verifications")
# Rows per statement: a file of millions is recorded in bounded transactions.
_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Verification:
    """One verification of a sent message, as the sender recorded it.

    `message_id` is the gateway's id as returned at submit; `kind` the sender's own word for
    the evidence (`otp_confirmed`, `reply`, `click`, ...); `source` where it came from (an app,
    a service), free text. The same (login, message_id, kind, verified_at) twice is one.
    """

    login: str
    message_id: str
    kind: str
    verified_at: datetime
    source: str | None = None


@dataclass(frozen=True, slots=True)
class VerificationResult:
    """What `Store.record_verifications` did."""

    recorded: int
    """Verifications newly recorded."""
    already_recorded: int
    """Verifications that were there already (the same login, id, kind and time)."""
    waiting: int
    """Of those newly recorded, the ones whose message is not recorded (yet): they count once
    it is (correlated by message id when read)."""


async def record_verifications(
    conn: Connection, verifications: Sequence[Verification]
) -> VerificationResult:
    """Record `verifications` on `conn`, a chunk per transaction (idempotent)."""
    recorded = waiting = 0
    for start in range(0, len(verifications), _CHUNK):
        chunk = verifications[start : start + _CHUNK]
        async with conn.transaction():
            row = await _INSERT_VERIFICATIONS.fetchrow(
                conn,
                logins=[v.login for v in chunk],
                # P24: kept as the message's own id is, so an altered id still joins.
                message_ids=[stored_id(v.message_id) for v in chunk],
                kinds=[v.kind for v in chunk],
                verified_at=[v.verified_at for v in chunk],
                sources=[v.source for v in chunk],
            )
        assert row is not None, "an aggregate without GROUP BY returns one row"
        recorded += int(row["recorded"])
        waiting += int(row["waiting"])
    return VerificationResult(
        recorded=recorded, already_recorded=len(verifications) - recorded, waiting=waiting
    )
