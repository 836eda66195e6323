"""Receipt fields and their protobuf wire bytes, built once per receipt and reused per delivery.

Streaming one message costs tens of microseconds inside grpc.aio already, so fakegw keeps its own
per-delivery work to a few byte concatenations: the receipt's fields 1-13 are serialized once at
enqueue, and each delivery appends field 100 (`ack_token`) and field 101 (`delivery_count`)
directly in protobuf wire format. Protobuf parsers accept fields in any order, so the result is
a valid `Receipt` for every client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.receipts.v1 import feed_pb2

# Receipt fields 1-13 (docs/spec/interfaces.md §1): the webhook body, in field-number order.
RECEIPT_FIELDS: tuple[str, ...] = (
    "id",
    "level",
    "stat",
    "err",
    "sub",
    "dlvrd",
    "submit_date",
    "done_date",
    "text",
    "source_addr",
    "destination_addr",
    "smsc_message_id",
    "connector",
)
_FIELD_SET = frozenset(RECEIPT_FIELDS)

ReceiptFields = dict[str, str | int]

_TOKEN_TAG = b"\xa2\x06"  # field 100, wire type 2 (length-delimited)
_COUNT_TAG = b"\xa8\x06"  # field 101, wire type 0 (varint)
_PULL_ITEM_TAG = b"\x0a"  # PullResponse.receipts, field 1, wire type 2


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


_SMALL_VARINTS: tuple[bytes, ...] = tuple(_encode_varint(i) for i in range(16384))


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer (cached for small values)."""
    if value < 16384:
        return _SMALL_VARINTS[value]
    return _encode_varint(value)


def normalize_fields(body: Mapping[str, object]) -> ReceiptFields:
    """Validate a webhook-body dict (keys = Receipt fields 1-13) and return a clean copy.

    Absent keys stay absent (F4: optional fields are absent, not empty). `level` must be an
    integer in uint32 range; every other value must be a string. NUL characters, unknown `stat`
    values, odd dates and oversized `text` are accepted on purpose: the real gateway relays
    whatever a network reports, and the daemon must cope. Raises ValueError on anything else.
    """
    unknown = set(body) - _FIELD_SET
    if unknown:
        raise ValueError(f"unknown receipt keys: {sorted(unknown)}")
    fields: ReceiptFields = {}
    for name in RECEIPT_FIELDS:
        if name not in body:
            continue
        value = body[name]
        if value is None:
            continue
        if name == "level":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
                raise ValueError(f"level must be a uint32, got {value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        fields[name] = value
    return fields


def encode_fields(fields: ReceiptFields) -> bytes:
    """Serialize fields 1-13 of a Receipt once; deliveries append the delivery fields."""
    return feed_pb2.Receipt(**fields).SerializeToString()  # type: ignore[arg-type]  # validated above


def token_field(token: str) -> bytes:
    """Wire bytes of field 100 (`ack_token`) for one token."""
    raw = token.encode("ascii")
    return _TOKEN_TAG + varint(len(raw)) + raw


def delivery_bytes(base: bytes, token_bytes: bytes, delivery_count: int) -> bytes:
    """A complete serialized Receipt: fields 1-13, the token, and this delivery's count."""
    return base + token_bytes + _COUNT_TAG + varint(delivery_count)


def pull_response_bytes(receipts: Iterable[bytes]) -> bytes:
    """A serialized PullResponse holding already-serialized receipts."""
    return b"".join(_PULL_ITEM_TAG + varint(len(r)) + r for r in receipts)
