"""Decoding what the gateway sends, including what the protobuf library refuses.

A receipt the strict decoder rejects (a string field that is not UTF-8, a truncated or corrupt
wire) must neither crash a reader nor - under Pull - take the other receipts of its response
down with it, and it must still reach the store with its bytes whole (C8, P9). So the strict
decode is tried first (the normal, fast path) and, when it fails, the wire is walked by hand:
every field that can be read is kept, text that is not UTF-8 is decoded with
`surrogateescape` (lossless, and refused by the database, so the store keeps that receipt raw
as an `unstorable` exception with its evidence), and the raw bytes always travel unchanged.
"""

from __future__ import annotations

import structlog
from google.protobuf.message import DecodeError

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.domain.wire_format import ACK_TOKEN_FIELD, DELIVERY_COUNT_FIELD, top_level_fields
from gateway.receipts.v1 import feed_pb2

# Receipt field numbers (docs/spec/interfaces.md §1) of the string fields, by domain attribute name.
_TEXT_FIELDS = {
    1: "message_id",
    3: "stat",
    4: "err",
    5: "sub",
    6: "dlvrd",
    7: "submit_date",
    8: "done_date",
    9: "text",
    10: "source_addr",
    11: "destination_addr",
    12: "smsc_message_id",
    13: "connector",
}
_LEVEL = 2
_PULL_RECEIPTS = 1  # PullResponse.receipts
_UINT32 = 0xFFFFFFFF

log = structlog.get_logger("dlrfeed.feed")


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message, in wire order, up to the first
    unreadable byte: varints as int, length-delimited as bytes, fixed32/64 and groups skipped."""
    found, _ = top_level_fields(data)
    return [(f.number, f.value) for f in found if f.value is not None]


def receipt_from_wire(raw: bytes, received_at: float) -> Receipt:
    """The domain receipt for the serialized proto `raw`, whatever its bytes.

    The strict decoder first; on DecodeError, the fields readable by hand (last occurrence wins,
    as in protobuf). Never raises for any input.
    """
    try:
        message = feed_pb2.Receipt.FromString(raw)
    except DecodeError as exc:
        # C8: kept and stored (raw whole), never a crash; the event says which bytes were odd.
        log.warning("receipt_undecodable", error=str(exc)[:200], payload_bytes=len(raw))
        return receipt_by_hand(raw, received_at)
    return receipt_from_proto(message, raw, received_at)


def receipt_from_proto(message: feed_pb2.Receipt, raw: bytes, received_at: float) -> Receipt:
    """The domain receipt for one decoded proto `Receipt`; absent optional fields become None
    (F4); `raw` is the serialized form it was decoded from (P6/P9)."""
    has = message.HasField
    return Receipt(
        message_id=MessageId(message.id),
        level=message.level,
        stat=message.stat,
        err=message.err if has("err") else None,
        sub=message.sub if has("sub") else None,
        dlvrd=message.dlvrd if has("dlvrd") else None,
        submit_date=message.submit_date if has("submit_date") else None,
        done_date=message.done_date if has("done_date") else None,
        text=message.text if has("text") else None,
        source_addr=message.source_addr if has("source_addr") else None,
        destination_addr=message.destination_addr if has("destination_addr") else None,
        smsc_message_id=message.smsc_message_id if has("smsc_message_id") else None,
        connector=message.connector if has("connector") else None,
        delivery_count=message.delivery_count,
        ack_token=AckToken(message.ack_token),
        raw=raw,
        received_at=received_at,
    )


def receipt_by_hand(raw: bytes, received_at: float) -> Receipt:
    """The fallback decode: every field readable before any damage, text losslessly decoded
    (`surrogateescape`), unknown fields and wrong wire types ignored as protobuf ignores them,
    the last occurrence of a field winning. Never raises."""
    text: dict[str, str] = {}
    level = delivery_count = 0
    ack_token = ""
    for number, value in fields(raw):
        if isinstance(value, bytes):
            if number in _TEXT_FIELDS:
                text[_TEXT_FIELDS[number]] = value.decode("utf-8", "surrogateescape")
            elif number == ACK_TOKEN_FIELD:
                # A token that is not UTF-8 cannot be sent back in AckRequest (a proto string):
                # replaced, the gateway reports it gone and redelivers the receipt after the
                # lease (F6), when it is stored again as a repeat.
                ack_token = value.decode("utf-8", "replace")
        elif number == _LEVEL:
            level = value & _UINT32  # protobuf's own uint32 truncation
        elif number == DELIVERY_COUNT_FIELD:
            delivery_count = value & _UINT32
    return Receipt(
        message_id=MessageId(text.get("message_id", "")),
        level=level,
        stat=text.get("stat", ""),
        err=text.get("err"),
        sub=text.get("sub"),
        dlvrd=text.get("dlvrd"),
        submit_date=text.get("submit_date"),
        done_date=text.get("done_date"),
        text=text.get("text"),
        source_addr=text.get("source_addr"),
        destination_addr=text.get("destination_addr"),
        smsc_message_id=text.get("smsc_message_id"),
        connector=text.get("connector"),
        delivery_count=delivery_count,
        ack_token=AckToken(ack_token),
        raw=raw,
        received_at=received_at,
    )


def pull_receipts(raw: bytes) -> list[bytes]:
    """The serialized receipts of a serialized PullResponse, each exactly as received, so that
    one receipt the strict decoder refuses cannot fail the whole response (gRPC deserializer)."""
    return [
        value
        for number, value in fields(raw)
        if number == _PULL_RECEIPTS and isinstance(value, bytes)
    ]
