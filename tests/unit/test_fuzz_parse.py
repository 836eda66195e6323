"""Fuzz of the feed adapter's decode and the pure parse: no input raises, nothing odd unflagged.

C4/C8: whatever a gateway sends - any unicode, any length, any level or delivery count, bytes
the protobuf decoder refuses - becomes a receipt with its bytes whole, and parse makes every
field storable while flagging each value it had to change. `make test` runs the default
form (100-300 examples each, a few seconds); `make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs 10,000.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import MAX_ID_CHARS, parse
from dlrfeed.domain.status import STAT_TO_STATUS, Status
from dlrfeed.domain.wire_format import evidence_key
from dlrfeed.feed.wire import pull_receipts, receipt_by_hand, receipt_from_wire
from gateway.receipts.v1 import feed_pb2
from support.receipt_strategies import (
    OPTIONAL_FIELDS,
    DamagedPayload,
    ReceiptRecipe,
    examples,
    hostile_payloads,
    wire_receipts,
)

OPTIONS = IntegrationOptions()
LIMIT = OPTIONS.max_field_chars
pytestmark = pytest.mark.fuzz


@examples(300)
@given(wire_receipts())
def test_c4_every_field_survives_decode_and_parse_flags_every_change(
    recipe: ReceiptRecipe,
) -> None:
    """A well-formed receipt decodes to exactly its fields; parse keeps the raw bytes, makes
    every text storable (no NUL, bounded) and flags each NUL escape, truncation, odd level and
    unknown stat (C4, P17)."""
    message = recipe.message()
    raw = message.SerializeToString()
    receipt = receipt_from_wire(raw, 0.0)
    assert receipt.raw == raw
    assert receipt.message_id == message.id
    assert (receipt.level, receipt.delivery_count) == (message.level, message.delivery_count)
    for name in OPTIONAL_FIELDS:
        present = message.HasField(name)  # type: ignore[arg-type]  # names from the proto
        expected = getattr(message, name) if present else None
        assert getattr(receipt, name) == expected, name

    event = parse(receipt, OPTIONS)
    flags = set(event.flags)
    assert event.raw == raw
    texts = {"id": event.message_id, "stat": event.stat, "err": event.err, "text": event.text}
    for value in texts.values():
        assert value is None or "\x00" not in value
    assert len(event.message_id) <= MAX_ID_CHARS
    assert all(len(v) <= LIMIT for v in texts.values() if v is not None)
    if "\x00" in message.id:
        assert "nul_escaped:id" in flags
    if len(message.id.replace("\x00", "\\u0000")) > MAX_ID_CHARS:
        assert "truncated:id" in flags
    if message.HasField("text") and len(message.text.replace("\x00", "\\u0000")) > LIMIT:
        assert "truncated:text" in flags
    assert ("level_unexpected" in flags) == (message.level not in (1, 2))
    if message.stat not in STAT_TO_STATUS:
        assert event.status is Status.UNRECOGNIZED
        assert "stat_unrecognized" in flags


@examples(300)
@given(hostile_payloads())
def test_c8_any_bytes_become_a_receipt_with_the_bytes_whole(
    recipe: ReceiptRecipe | DamagedPayload,
) -> None:
    """Damaged, truncated, spliced or random bytes never raise in the adapter or in parse; the
    receipt carries the bytes unchanged (the evidence) and a fixed receipt decodes the same as
    the strict decoder would."""
    raw = recipe.payload()
    receipt = receipt_from_wire(raw, 0.0)
    assert receipt.raw == raw
    assert 0 <= receipt.level <= 2**32 - 1
    assert 0 <= receipt.delivery_count <= 2**32 - 1
    event = parse(receipt, OPTIONS)
    assert event.raw == raw
    assert "\x00" not in event.message_id


@examples(200)
@given(hostile_payloads())
def test_c8_hand_walk_agrees_with_protobuf_on_what_protobuf_accepts(
    recipe: ReceiptRecipe | DamagedPayload,
) -> None:
    """The fallback decoder invents nothing: on any bytes protobuf accepts (damaged ones too:
    unknown fields, wrong wire types, repeated fields), both give the same receipt."""
    raw = recipe.payload()
    try:
        feed_pb2.Receipt.FromString(raw)
    except DecodeError:
        return
    assert receipt_by_hand(raw, 0.0) == receipt_from_wire(raw, 0.0)


@examples(100)
@given(hostile_payloads())
def test_c8_a_bad_receipt_in_a_pull_response_does_not_take_the_others_down(
    recipe: ReceiptRecipe | DamagedPayload,
) -> None:
    """Pull: the response is split into its receipts' bytes before any receipt is decoded."""
    bad = recipe.payload()
    good = feed_pb2.Receipt(id="ok", level=2, stat="DELIVRD", ack_token="t").SerializeToString()
    response = b"".join(b"\x0a" + _varint(len(part)) + part for part in (good, bad, good))
    parts = pull_receipts(response)
    assert parts == [good, bad, good]
    assert [receipt_from_wire(p, 0.0).message_id for p in parts][0::2] == ["ok", "ok"]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize(
    "raw", [b"\x0b" * 5000, b"\x0b" * 100 + b"\x0c" * 100, b"\x0c", b"\x0b", b"\x0f\x00"]
)
def test_c8_nested_or_unbalanced_groups_never_raise(raw: bytes) -> None:
    """C8: 5000 start-group tags must not recurse past Python's stack (a RecursionError out
    of the reader). Nesting beyond protobuf's limit of 100 is damage: kept, not followed."""
    receipt = receipt_from_wire(raw, 0.0)
    assert receipt.raw == raw
    assert receipt.message_id == ""


def test_evidence_key_ignores_only_the_delivery_fields() -> None:
    """C8: every delivery of one receipt shares its evidence key (token and delivery_count
    differ), another receipt does not, and damaged bytes keep their damage in the key."""
    base = feed_pb2.Receipt(id="m1", level=2, stat="DELIVRD", ack_token="t1", delivery_count=1)
    redelivered = feed_pb2.Receipt()
    redelivered.CopyFrom(base)
    redelivered.ack_token, redelivered.delivery_count = "t2-longer", 7
    other = feed_pb2.Receipt()
    other.CopyFrom(base)
    other.stat = "UNDELIV"
    raw = base.SerializeToString()
    assert evidence_key(raw) == evidence_key(redelivered.SerializeToString())
    assert evidence_key(raw) != evidence_key(other.SerializeToString())
    # Cut inside the token: the readable fields plus the damaged tail, different from whole.
    assert evidence_key(raw[:-4]) != evidence_key(raw)
    assert evidence_key(raw[:-4]) != evidence_key(raw[:-5])
    assert evidence_key(b"\xff\xff") != evidence_key(b"\xff\xfe")
