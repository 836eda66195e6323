"""Receipts as the feed adapter builds them (`feed_receipt`, the real serialized proto as `raw`),
and the rule tests' one delivery at a fixed time (`receipt`)."""

from __future__ import annotations

from datetime import UTC, datetime

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"
SUBMITTED = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RECEIVED = datetime(2026, 11, 29, 13, 0, tzinfo=UTC).timestamp()


def feed_receipt(
    message_id: str,
    level: int,
    stat: str,
    *,
    ack_token: str,
    received_at: float,
    err: str | None = "000",
    done_date: str | None = None,
    submit_date: str | None = None,
    text: str | None = None,
    destination: str | None = None,
    delivery_count: int = 1,
) -> Receipt:
    """A receipt as the feed adapter builds it: the fields given, and the wire receipt carrying
    them (None fields left unset) serialized as `raw`."""
    wire = feed_pb2.Receipt(id=message_id, level=level, stat=stat, ack_token=ack_token)
    wire.delivery_count = delivery_count
    for name, value in (
        ("err", err),
        ("done_date", done_date),
        ("text", text),
        ("destination_addr", destination),
    ):
        if value is not None:
            setattr(wire, name, value)
    return Receipt(
        message_id=MessageId(message_id),
        level=level,
        stat=stat,
        err=err,
        sub=None,
        dlvrd=None,
        submit_date=submit_date,
        done_date=done_date,
        text=text,
        source_addr=None,
        destination_addr=destination,
        smsc_message_id=None,
        connector=None,
        delivery_count=delivery_count,
        ack_token=AckToken(ack_token),
        raw=wire.SerializeToString(),
        received_at=received_at,
    )


def receipt(
    message_id: str,
    level: int,
    stat: str,
    done_date: str | None = "2611291201",
    err: str | None = "000",
) -> Receipt:
    """One delivery of `message_id` at `level` with `stat`, received at RECEIVED."""
    return feed_receipt(
        message_id, level, stat, ack_token="t", received_at=RECEIVED, err=err, done_date=done_date
    )
