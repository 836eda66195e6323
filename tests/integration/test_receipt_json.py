"""`dlr.receipt_json`: the JSON form of a reception, read out of its evidence bytes (P9).

The receptions keep the serialized receipt whole (`payload`), read as JSON by this SQL function
and the view `dlr.receptions_readable`. These tests hold the
function to the protobuf library's own reading of the same bytes (the oracle: what it reads is
shown the same, what it refuses reads as `{"undecodable": hex}`), and to never failing a query
over bytes that are not a receipt at all. `make test` draws the same examples every run;
`make fuzz` explores the byte-level property 20,000 times.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.receipts.v1 import feed_pb2
from support.receipt_strategies import (
    FUZZING,
    OPTIONAL_FIELDS,
    DamagedPayload,
    ReceiptRecipe,
    Text,
    examples,
    hostile_payloads,
    wire_receipts,
)

# Every string field of Receipt, by name and number: protobuf refuses the whole receipt when
# any of them is not UTF-8, ack_token included (read, never shown).
STRING_FIELDS = {
    f.name: f.number
    for f in feed_pb2.Receipt.DESCRIPTOR.fields
    if f.type == FieldDescriptor.TYPE_STRING
}

# Byte sequences no UTF-8 decoder accepts, one of each kind.
BAD_UTF8 = {
    "lone continuation byte": b"\x80",
    "two-byte lead cut short": b"\xc3",
    "three-byte lead cut short": b"\xe2\x82",
    "four-byte lead cut short": b"\xf0\x9f\x98",
    "overlong NUL": b"\xc0\x80",
    "overlong three-byte form": b"\xe0\x80\xaf",
    "surrogate": b"\xed\xa0\x80",
    "beyond U+10FFFF": b"\xf4\x90\x80\x80",
    "never in UTF-8": b"\xff",
}

# What may precede the bad bytes in the same field: the function shows the first 256 NULs of a
# field one way and the rest another (bounded work), so the runs sit on both sides of 256.
PREFIXES = {
    "nothing": "",
    "255 NULs": "\x00" * 255,
    "256 NULs": "\x00" * 256,
    "257 NULs": "\x00" * 257,
    "4,090 NULs": "\x00" * 4090,
    "multi-byte characters": "ñ€😀\U0010ffff" * 40,
    "NULs between multi-byte characters": "😀\x00ñ" * 300,
}


async def receipt_json(db: asyncpg.Connection, payload: bytes) -> dict[str, Any]:
    text = await db.fetchval("SELECT dlr.receipt_json($1)::text", payload)
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def _bytea_escape(data: bytes) -> str:
    """PostgreSQL's encode(data, 'escape'): NUL and bytes above 127 in octal, \\ doubled."""
    return "".join(
        "\\\\" if b == 92 else f"\\{b:03o}" if b == 0 or b > 127 else chr(b) for b in data
    )


def shown_text(value: str) -> str:
    """A text field as the function shows it: the first 256 NULs as \\u0000, the rest of a
    field with more in bytea escape form (bounded work on hostile text)."""
    parts = value.split("\x00")
    if len(parts) <= 257:
        return "\\u0000".join(parts)
    return (
        "\\u0000".join(parts[:256]) + "\\u0000" + _bytea_escape("\x00".join(parts[256:]).encode())
    )


def expected_json(message: feed_pb2.Receipt) -> dict[str, Any]:
    """What the function must show: the proto fields by name, NUL as six visible characters,
    optional fields only when present, `ack_token` never."""
    visible = {"id": message.id, "stat": message.stat}
    visible |= {f.name: v for f, v in message.ListFields() if f.name in OPTIONAL_FIELDS}
    shown: dict[str, Any] = {k: shown_text(v) for k, v in visible.items()}
    return shown | {"level": message.level, "delivery_count": message.delivery_count}


def protobuf_reading(raw: bytes) -> dict[str, Any]:
    """What the function must show for any bytes: protobuf's reading of them, or
    `{"undecodable": hex}` where protobuf refuses them."""
    try:
        message = feed_pb2.Receipt.FromString(raw)
    except DecodeError:
        return {"undecodable": raw.hex()}
    return expected_json(message)


def varint(value: int) -> bytes:
    """`value` as a protobuf varint in its shortest form."""
    out = bytearray()
    while value > 127:
        out.append(value & 127 | 128)
        value >>= 7
    return bytes([*out, value])


def length_delimited(field: int, body: bytes) -> bytes:
    """One length-delimited field (wire type 2) as protobuf writes it."""
    return varint(field << 3 | 2) + varint(len(body)) + body


@dataclass(frozen=True, slots=True)
class StringFieldBytes:
    """A real receipt with one more occurrence of a string field, its bytes given raw: a run
    (`piece` repeated `times`, encoded as UTF-8), then `damage` (bad UTF-8, or valid bytes), then
    `tail`. protobuf validates every occurrence, the last one wins when all are UTF-8."""

    base: ReceiptRecipe
    field: str
    piece: str
    times: int
    damage: bytes
    tail: bytes

    def payload(self) -> bytes:
        body = (self.piece * self.times).encode() + self.damage + self.tail
        return self.base.payload() + length_delimited(STRING_FIELDS[self.field], body)


def string_field_bytes() -> st.SearchStrategy[StringFieldBytes]:
    """A string field holding a long run of NULs or multi-byte characters, then bad or good
    UTF-8: rare in random bytes, and where a reader that treats long runs apart goes wrong."""
    return st.builds(
        StringFieldBytes,
        base=wire_receipts(),
        field=st.sampled_from(sorted(STRING_FIELDS)),
        piece=st.sampled_from(["\x00", "ñ", "😀", "\x00ñ", "a\x00"]),
        times=st.one_of(st.sampled_from([0, 1, 255, 256, 257, 4090]), st.integers(0, 5000)),
        damage=st.one_of(st.sampled_from(sorted(BAD_UTF8.values())), st.binary(max_size=4)),
        tail=st.one_of(st.just(b""), st.sampled_from([b"\x00", b"a", "😀".encode()])),
    )


async def assert_reads_as_protobuf(db: asyncpg.Connection, raw: bytes) -> None:
    """The function's reading of `raw` is protobuf's, and its numbers are JSON integers."""
    shown = await receipt_json(db, raw)
    assert shown == protobuf_reading(raw)
    if "undecodable" not in shown:
        assert type(shown["level"]) is int
        assert type(shown["delivery_count"]) is int


@pytest.mark.fuzz
@given(recipe=wire_receipts())
@examples(200)
async def test_matches_the_protobuf_reading_of_any_real_receipt(
    db: asyncpg.Connection, recipe: ReceiptRecipe
) -> None:
    """Every field of any serialized Receipt, NUL, long text and 4-byte UTF-8 included."""
    payload = recipe.payload()
    shown = await receipt_json(db, payload)
    assert shown == expected_json(feed_pb2.Receipt.FromString(payload))
    assert type(shown["level"]) is int
    assert type(shown["delivery_count"]) is int


# The byte-level property: `make fuzz` explores it 20,000 times (damage that protobuf refuses is
# a thin slice of random bytes); `make test` draws the same 300 every run.
BYTES_EXPLORED = settings(max_examples=20_000) if FUZZING else examples(300)


@pytest.mark.fuzz
@given(payload=st.one_of(hostile_payloads(), string_field_bytes()))
@example(  # a 4,090-NUL connector whose last byte is flipped: protobuf refuses it
    payload=DamagedPayload(
        base=ReceiptRecipe((("connector", Text("\x00", 4090)),)),
        how="flip",
        at=1.0,
        xor=0x80,
        junk=b"",
    )
)
@BYTES_EXPLORED
async def test_reads_any_bytes_as_protobuf_does(
    db: asyncpg.Connection, payload: ReceiptRecipe | DamagedPayload | StringFieldBytes
) -> None:
    """Damaged, spliced, cut or random bytes: what protobuf reads, the function shows the same
    (last occurrence wins, uint32 cut, unknown fields, groups and wrong wire types skipped);
    what protobuf refuses gives `{"undecodable": hex}` - never an error, so a query over many
    receptions cannot fail on one."""
    await assert_reads_as_protobuf(db, payload.payload())


@pytest.mark.parametrize("damage", list(BAD_UTF8.values()), ids=list(BAD_UTF8))
@pytest.mark.parametrize("prefix", list(PREFIXES.values()), ids=list(PREFIXES))
async def test_bad_utf8_after_any_prefix_is_undecodable(
    db: asyncpg.Connection, prefix: str, damage: bytes
) -> None:
    """Invalid UTF-8 anywhere in a string field makes protobuf refuse the receipt, whatever
    precedes it in the field (a run of NULs on either side of 256, multi-byte characters) and
    whatever follows; the same field with the bad bytes left out reads as protobuf reads it."""
    base = feed_pb2.Receipt(id="m1", level=2, stat="DELIVRD").SerializeToString()
    for tail in (b"", b"a", b"\x00" * 3):
        raw = base + length_delimited(STRING_FIELDS["connector"], prefix.encode() + damage + tail)
        assert protobuf_reading(raw) == {"undecodable": raw.hex()}  # the oracle refuses it
        assert await receipt_json(db, raw) == {"undecodable": raw.hex()}
        good = base + length_delimited(STRING_FIELDS["connector"], prefix.encode() + tail)
        await assert_reads_as_protobuf(db, good)
        assert "connector" in await receipt_json(db, good)


@pytest.mark.parametrize("prefix", ["", "\x00" * 257, "ñ" * 300], ids=["short", "NULs", "ñ"])
@pytest.mark.parametrize("field", sorted(STRING_FIELDS))
async def test_bad_utf8_in_each_string_field_is_undecodable(
    db: asyncpg.Connection, field: str, prefix: str
) -> None:
    """Each string field, ack_token (never shown) included, and an earlier occurrence as well
    as the last: protobuf refuses them all, so does the function. The same bytes in a field
    Receipt does not have are skipped unread, as protobuf skips them."""
    good = feed_pb2.Receipt(id="m1", level=1, stat="ENROUTE", text="ñ").SerializeToString()
    bad_field = length_delimited(STRING_FIELDS[field], prefix.encode() + b"\xc3(")
    again = length_delimited(STRING_FIELDS[field], b"fine")
    for raw in (good + bad_field, bad_field + good, bad_field + again):
        assert protobuf_reading(raw) == {"undecodable": raw.hex()}
        assert await receipt_json(db, raw) == {"undecodable": raw.hex()}
    unknown = good + length_delimited(14, prefix.encode() + b"\xc3(")
    assert await receipt_json(db, unknown) == await receipt_json(db, good)
    await assert_reads_as_protobuf(db, unknown)


def short_byte_sequences() -> list[bytes]:
    """Every 1- and 2-byte sequence, and 3- and 4-byte ones around each boundary of the UTF-8
    rules (overlong forms, surrogates, U+10FFFF, bad continuation bytes)."""
    edges = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    sequences = [bytes([a]) for a in range(256)]
    sequences += [bytes([a, b]) for a in range(256) for b in range(256)]
    sequences += [bytes([a, b, c]) for a in range(0xC0, 0x100) for b in edges for c in edges]
    sequences += [
        bytes([a, b, c, d]) for a in range(0xF0, 0xF8) for b in edges for c in edges for d in edges
    ]
    return sequences


@pytest.mark.parametrize("prefix", ["", "ñ", "\x00" * 257], ids=["alone", "after ñ", "NULs"])
async def test_agrees_with_protobuf_on_every_short_byte_sequence(
    db: asyncpg.Connection, prefix: str
) -> None:
    """protobuf's UTF-8 check and PostgreSQL's are two implementations of one rule: they agree
    on every short byte sequence, alone in a field, after a multi-byte character and after more
    than 256 NULs (where the function shows the field in its escape form)."""
    payloads = [
        length_delimited(STRING_FIELDS["text"], prefix.encode() + s) for s in short_byte_sequences()
    ]
    query = """
        SELECT dlr.receipt_json(p)::text FROM unnest($1::bytea[]) WITH ORDINALITY AS u(p, n)
        ORDER BY n"""
    shown = [json.loads(text) for text in await db.fetchval(f"SELECT array({query})", payloads)]
    disagreements = [
        raw.hex() for raw, got in zip(payloads, shown, strict=True) if got != protobuf_reading(raw)
    ]
    assert disagreements == []


@pytest.mark.parametrize("kind", ["tag", "length"])
@pytest.mark.parametrize("size", [1, 2, 5, 6, 10])
async def test_tags_and_lengths_are_32_bit_varints(
    db: asyncpg.Connection, kind: str, size: int
) -> None:
    """protobuf reads a tag and a length as 32-bit varints, at most 5 bytes even with zero
    padding (numbers as 64-bit ones, up to 10): longer is refused, as the function does."""

    def padded(value: int) -> bytes:  # `value` (< 128) written in `size` bytes
        return bytes([value | 128] + [128] * (size - 2) + [0]) if size > 1 else bytes([value])

    tag, length = STRING_FIELDS["stat"] << 3 | 2, 7
    raw = (
        padded(tag) + varint(length) + b"DELIVRD"
        if kind == "tag"
        else varint(tag) + padded(length) + b"DELIVRD"
    )
    shown = await receipt_json(db, raw)
    assert shown == protobuf_reading(raw)
    assert ("undecodable" in shown) is (size > 5)


async def test_is_marked_parallel_unsafe(db: asyncpg.Connection) -> None:
    """Its fallback is an exception block, which "changes the transaction state even
    temporarily": PostgreSQL's documentation requires PARALLEL UNSAFE for such functions, so
    no parallel plan runs it (where the server refuses subtransactions, a query failed)."""
    query = "SELECT proparallel::text FROM pg_proc WHERE proname = 'receipt_json'"
    assert await db.fetchval(query) == "u"


async def test_known_cases(db: asyncpg.Connection) -> None:
    """Zero values left off the wire, NUL, an unknown field skipped, truncation."""
    assert await receipt_json(db, b"") == {"id": "", "level": 0, "stat": "", "delivery_count": 0}
    message = feed_pb2.Receipt(id="m1", level=2, stat="DELIV\x00RD", text="ñ", delivery_count=3)
    message.ack_token = "secret-lease"
    raw = message.SerializeToString()
    assert await receipt_json(db, raw) == {
        "id": "m1",
        "level": 2,
        "stat": "DELIV\\u0000RD",
        "text": "ñ",
        "delivery_count": 3,
    }
    unknown_field = raw + b"\xb8\x06\x05"  # field 103, varint 5: skipped, as protobuf does
    assert await receipt_json(db, unknown_field) == await receipt_json(db, raw)
    assert await receipt_json(db, raw[:-1]) == {"undecodable": raw[:-1].hex()}


async def test_hostile_text_costs_bounded_work(db: asyncpg.Connection) -> None:
    """Half a million NULs in one field: the first 256 shown as \\u0000, the rest escaped,
    in bounded time (each NUL would otherwise copy the rest of the field again)."""
    message = feed_pb2.Receipt(id="m1", level=2, stat="DELIVRD", text="a\x00" * 500_000)
    shown = await asyncio.wait_for(receipt_json(db, message.SerializeToString()), 30)
    assert shown["text"].startswith("a\\u0000" * 256 + "a\\000a\\000")
    assert shown["text"].endswith("a\\000")
