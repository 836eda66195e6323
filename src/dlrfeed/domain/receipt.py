"""A receipt as dlrfeed receives it, from the feed or by an HTTP callback: the domain form of
the proto `Receipt` (F4), whose fields are the gateway's webhook body."""

from __future__ import annotations

from typing import Literal, NamedTuple, NewType

MessageId = NewType("MessageId", str)
"""The gateway's message id, exactly as returned at submit and as carried by receipts (P10)."""

AckToken = NewType("AckToken", str)
"""Opaque token naming one receipt of one login at the gateway (F9)."""

Channel = Literal["feed", "webhook"]
"""How a receipt reached dlrfeed: the gateway's feed, or an HTTP callback to a `dlr_url`."""


class Receipt(NamedTuple):
    """One delivery of one receipt, as received: nothing normalised, nothing dropped.

    `raw` is the receipt exactly as it came off the wire (the serialized protobuf message), so
    the evidence survives whatever the parser makes of the fields (P6, P9). Optional fields are
    None when the gateway left them absent (F4: absent, not empty). Immutable; a named tuple
    because one is built per received receipt, and a frozen dataclass costs several times as
    much to construct.
    """

    message_id: MessageId
    level: int
    stat: str
    err: str | None
    sub: str | None
    dlvrd: str | None
    submit_date: str | None
    done_date: str | None
    text: str | None
    source_addr: str | None
    destination_addr: str | None
    smsc_message_id: str | None
    connector: str | None
    delivery_count: int
    ack_token: AckToken
    raw: bytes
    received_at: float
    """Local receive time, seconds since the epoch (P19: kept apart from the reported times)."""
    channel: Channel = "feed"
    """The path it came by; a webhook receipt's `raw` is the callback as posted, its
    `ack_token` empty and its `delivery_count` 0 (a callback does not say how often it came)."""
    peer: str | None = None
    """The address the callback came from (`host:port`); None for the feed."""
    flags: tuple[str, ...] = ()
    """What the channel found odd in reading the fields (a callback's `latin1:reply`,
    `stat_inferred`); the parse starts its flags with these (C4)."""


class UnreadableCallback(NamedTuple):
    """An HTTP callback that cannot be read as a receipt, to be kept as evidence (C8)."""

    raw: bytes
    """What arrived, byte for byte (the body, or a GET's query)."""
    reason: str
    """One line: why it is not a receipt."""
    peer: str | None
    message_id: str
    """The id it names when one can be read (P24: findable by it), else ""."""
    flood_key: str | None = None
    """Set when its caller has opened too many investigations lately: it is then kept as
    evidence of the one open investigation under this key instead of opening its own."""
