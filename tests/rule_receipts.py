"""Receipts for the rule tests: one delivery as the feed adapter builds it, at a fixed time."""

from __future__ import annotations

from datetime import UTC, datetime

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"
SUBMITTED = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RECEIVED = datetime(2026, 11, 29, 13, 0, tzinfo=UTC).timestamp()


def receipt(
    message_id: str,
    level: int,
    stat: str,
    done_date: str | None = "2611291201",
    err: str | None = "000",
) -> Receipt:
    wire = feed_pb2.Receipt(id=message_id, level=level, stat=stat, ack_token="t")
    wire.delivery_count = 1
    if err is not None:
        wire.err = err
    if done_date is not None:
        wire.done_date = done_date
    """One delivery of `message_id` at `level` with `stat`, received at RECEIVED."""
    return Receipt(
        message_id=MessageId(message_id),
        level=level,
        stat=stat,
        err=err,
        sub=None,
        dlvrd=None,
        submit_date=None,
        done_date=done_date,
        text=None,
        source_addr=None,
        destination_addr=None,
        smsc_message_id=None,
        connector=None,
        delivery_count=1,
        ack_token=AckToken("t"),
        raw=wire.SerializeToString(),
        received_at=RECEIVED,
    )
