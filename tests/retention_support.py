"""Receipts with a chosen receive time, for the tests of day partitions (migration 0010)."""

from __future__ import annotations

from dlrfeed.domain.receipt import Receipt
from rule_receipts import feed_receipt


def receipt(message_id: str, received_at: float, *, delivery_count: int = 1) -> Receipt:
    """A final receipt with its real serialized proto, received at `received_at`."""
    return feed_receipt(
        message_id,
        2,
        "DELIVRD",
        ack_token=f"t-{message_id}",
        received_at=received_at,
        delivery_count=delivery_count,
    )
