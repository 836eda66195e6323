"""Receipts with a chosen receive time, for the tests of day partitions (migration 0010)."""

from __future__ import annotations

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from gateway.receipts.v1 import feed_pb2


def receipt(message_id: str, received_at: float, *, delivery_count: int = 1) -> Receipt:
    """A final receipt with its real serialized proto, received at `received_at`."""
    wire = feed_pb2.Receipt(id=message_id, level=2, stat="DELIVRD", ack_token=f"t-{message_id}")
    wire.err = "000"
    wire.delivery_count = delivery_count
    return Receipt(
        message_id=MessageId(message_id),
        level=2,
        stat="DELIVRD",
        err="000",
        sub=None,
        dlvrd=None,
        submit_date=None,
        done_date=None,
        text=None,
        source_addr=None,
        destination_addr=None,
        smsc_message_id=None,
        connector=None,
        delivery_count=delivery_count,
        ack_token=AckToken(wire.ack_token),
        raw=wire.SerializeToString(),
        received_at=received_at,
    )
