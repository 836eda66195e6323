"""C8: what the database refuses as a receipt is kept raw, as an `unstorable` exception.

A receipt whose row the database refuses (isolated by bisecting its batch), and an HTTP callback
that cannot be read as a receipt at all, keep their bytes whole under the id they name (P24):
one open exception however often the same bytes arrive, every delivery's bytes kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dlrfeed.domain.parse import MAX_ID_CHARS
from dlrfeed.domain.receipt import Receipt, UnreadableCallback
from dlrfeed.domain.wire_format import callback_evidence_key, evidence_key
from dlrfeed.store.rows import printable
from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

OPEN_UNSTORABLE = query("open_unstorable")
RECORD_UNSTORABLE_REDELIVERY = query("record_unstorable_redelivery")


async def keep_unstorable(
    conn: Connection, login: str, receipt: Receipt, error: BaseException
) -> None:
    """The receipt the database refused with `error`, kept with its bytes."""
    details: dict[str, object] = {
        "error": f"{type(error).__name__}: {error}"[:2000],
        "receipt": printable(repr(receipt)[:4000]),
        "delivery_count": receipt.delivery_count,
    }
    if receipt.channel == "feed":
        key = evidence_key(receipt.raw)
    else:
        details |= {"channel": receipt.channel, "peer": receipt.peer}
        key = callback_evidence_key(receipt.raw)
    await _keep(conn, login, receipt.message_id, details, receipt.raw, key)


async def keep_unreadable(
    conn: Connection, login: str, callbacks: Sequence[UnreadableCallback]
) -> None:
    """Callbacks that are not receipts, each kept with its bytes (a flood's under its
    `flood_key`, one exception for the flood)."""
    for callback in callbacks:
        details = {"error": callback.reason[:2000], "channel": "webhook", "peer": callback.peer}
        key = callback.flood_key or callback_evidence_key(callback.raw)
        await _keep(conn, login, callback.message_id, details, callback.raw, key)


async def _keep(
    conn: Connection,
    login: str,
    message_id: str,
    details: Mapping[str, object],
    raw: bytes,
    key: str,
) -> None:
    arguments = {
        "login": login,
        "message_id": printable(message_id)[:MAX_ID_CHARS],
        "details": json.dumps(details, ensure_ascii=True),
        "evidence": bytes(raw),
        "evidence_key": key,
    }
    # Delivered again while an earlier delivery is under investigation: one open exception
    # per receipt (never counted twice), every delivery's bytes kept. Only an operator
    # resolving that exception between our two statements sends us round again.
    while await OPEN_UNSTORABLE.fetchval(conn, **arguments) is None:
        if await RECORD_UNSTORABLE_REDELIVERY.fetchval(conn, **arguments) is not None:
            return
