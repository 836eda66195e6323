"""`dlr.receipt_json`: the JSON form of a reception, read out of its evidence bytes (P9).

The receptions keep the serialized receipt whole (`payload`); migration 0003 replaced the stored
JSON copy with this SQL function and the view `dlr.receptions_readable`. These tests hold the
function to the protobuf library's own reading of the same bytes, and to never failing a query
over bytes that are not a receipt at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given

from gateway.receipts.v1 import feed_pb2
from receipt_strategies import (
    OPTIONAL_FIELDS,
    DamagedPayload,
    ReceiptRecipe,
    examples,
    hostile_payloads,
    wire_receipts,
)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


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


@given(payload=hostile_payloads())
@examples(300)
async def test_reads_any_bytes_as_protobuf_does(
    db: asyncpg.Connection, payload: ReceiptRecipe | DamagedPayload
) -> None:
    """Damaged, spliced, cut or random bytes: what protobuf reads, the function shows the same
    (last occurrence wins, uint32 cut, unknown fields, groups and wrong wire types skipped);
    what protobuf refuses gives `{"undecodable": hex}` - never an error, so a query over many
    receptions cannot fail on one."""
    raw = payload.payload()
    shown = await receipt_json(db, raw)
    try:
        message = feed_pb2.Receipt.FromString(raw)
    except DecodeError:
        assert shown == {"undecodable": raw.hex()}
    else:
        assert shown == expected_json(message)
        assert type(shown["level"]) is int
        assert type(shown["delivery_count"]) is int


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
