"""Simulated sending for F2 and F3: which receipts of a sent message reach the feed.

The admin `Send` call registers messages as the gateway would see them; `Report` hands in what
the network reported for them. F2 decides what is enqueued, and what is POSTed to the message's
`dlr_url` instead (fakegw.callbacks); F3 adds a final `UNKNOWN` receipt for a message that
reached the receipt deadline without a result.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fakegw.callbacks import checked_dlr_url
from fakegw.wire import ReceiptFields

Channel = Literal["grpc", "rest", "smpp"]
_CHANNELS: frozenset[str] = frozenset({"grpc", "rest", "smpp"})


@dataclass
class SentMessage:
    """A message sent through the gateway, with its receipt request."""

    login: str
    message_id: str
    dlr: bool
    dlr_level: int
    dlr_url: str | None
    channel: str
    sent_at: float
    resolved: bool = False

    def feed_wants(self, level: int) -> bool:
        """F2: is a receipt of `level` for this message enqueued in its login's feed?"""
        return self._asked_for(level) and not self.dlr_url  # F2: the webhook wins.

    def callback_url(self, level: int) -> str | None:
        """F2: the URL a receipt of `level` for this message is POSTed to, if any."""
        return self.dlr_url if self._asked_for(level) else None

    def _asked_for(self, level: int) -> bool:
        """F2: receipts were asked for, at this level, over a channel that has them here."""
        if self.channel not in ("grpc", "rest"):
            return False  # F2: SMPP messages get receipts on the bind, never here.
        if not self.dlr:
            return False
        if level == 1:
            return self.dlr_level in (1, 3)
        if level == 2:
            return self.dlr_level in (2, 3)
        return False

    def to_json(self) -> dict[str, Any]:
        """The registration as stored and echoed back."""
        return {
            "id": self.message_id,
            "dlr": self.dlr,
            "dlr_level": self.dlr_level,
            "dlr_url": self.dlr_url,
            "channel": self.channel,
            "sent_at": self.sent_at,
        }


def parse_sent_message(login: str, body: Mapping[str, Any], now: float) -> SentMessage:
    """Validate one `Send` item: `id`, `dlr` (bool, or REST's "yes"/"no"), `dlr_level` (1-3,
    default 3), optional `dlr_url` (an http(s) URL), `channel` grpc|rest|smpp (default grpc),
    optional `sent_at` (epoch seconds, default now). Raises ValueError on a malformed item."""
    message_id = body.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError(f"sent message needs a string id: {body!r}")
    dlr_raw = body.get("dlr", False)
    dlr = dlr_raw.lower() == "yes" if isinstance(dlr_raw, str) else bool(dlr_raw)
    dlr_level = body.get("dlr_level", 3)
    if dlr_level not in (1, 2, 3):
        raise ValueError(f"dlr_level must be 1, 2 or 3: {body!r}")
    dlr_url = body.get("dlr_url") or None
    if dlr_url is not None:
        dlr_url = checked_dlr_url(dlr_url)
    channel = body.get("channel", "grpc")
    if channel not in _CHANNELS:
        raise ValueError(f"channel must be grpc, rest or smpp: {body!r}")
    sent_at = body.get("sent_at", now)
    if not isinstance(sent_at, int | float):
        raise TypeError(f"sent_at must be epoch seconds: {body!r}")
    return SentMessage(
        login=login,
        message_id=message_id,
        dlr=dlr,
        dlr_level=int(dlr_level),
        dlr_url=dlr_url,
        channel=str(channel),
        sent_at=float(sent_at),
    )


def smpp_date(epoch: float) -> str:
    """A receipt date as gateways write it, `YYMMDDhhmmss` in UTC."""
    return time.strftime("%y%m%d%H%M%S", time.gmtime(epoch))


def deadline_receipt(message: SentMessage, now: float) -> ReceiptFields:
    """F3: the last receipt of a message that reached the deadline without a result."""
    return {
        "id": message.message_id,
        "level": 2,
        "stat": "UNKNOWN",
        "submit_date": smpp_date(message.sent_at),
        "done_date": smpp_date(now),
    }
