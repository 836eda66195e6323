"""Fuzz of the whole ingest path against the real database: hostile receipts in, nothing lost.

C4/C8/P9: every byte sequence a gateway may send ends either as a reception whose payload is
those bytes, or as an `unstorable` exception whose evidence is those bytes - never an unhandled
exception, never a missing receipt - and every odd one is flagged. The feed adapter's decode
(dlrfeed.feed.wire) is driven first, as the daemon does, then the real `Store.ingest`.
`make test` runs a short form; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs 10,000 batches.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import grpc
import grpc.aio
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import MAX_ID_CHARS
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import STAT_TO_STATUS, Outcome
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient
from dlrfeed.store import Store, Submission
from dlrfeed_testing.receipt_strategies import (
    OPTIONAL_FIELDS,
    DamagedPayload,
    ReceiptRecipe,
    examples,
    hostile_payloads,
    receipts_from_payloads,
    wire_receipts,
)
from gateway.receipts.v1 import feed_pb2

LIMIT = IntegrationOptions().max_field_chars
_logins = itertools.count(1)
pytestmark = pytest.mark.fuzz


def _serialized(message: feed_pb2.Receipt) -> bytes:
    return message.SerializeToString()


def _undecodable(raw: bytes) -> bool:
    try:
        feed_pb2.Receipt.FromString(raw)
    except DecodeError:
        return True
    return False


def _texts(receipt: Receipt) -> list[str]:
    values = [receipt.message_id, receipt.stat] + [getattr(receipt, n) for n in OPTIONAL_FIELDS]
    return [v for v in values if v is not None]


def _must_be_flagged(receipt: Receipt) -> bool:
    """Odd by our own reckoning, independent of parse: NUL, over-long, odd level, unknown stat."""
    texts = _texts(receipt)
    return (
        any("\x00" in v for v in texts)
        or len(receipt.message_id) > MAX_ID_CHARS
        or any(len(v) > LIMIT for v in texts)
        or receipt.level not in (1, 2)
        or receipt.stat not in STAT_TO_STATUS
    )


def _not_utf8(receipt: Receipt) -> bool:
    """Text the hand decoder kept losslessly as surrogates: the database must refuse it."""
    return any(any("\udc80" <= c <= "\udcff" for c in v) for v in _texts(receipt))


async def _check_batch(
    store: Store, db: asyncpg.Connection, payloads: list[bytes]
) -> list[Outcome]:
    """Ingest `payloads` as one batch of a fresh login; prove nothing lost, odd ones flagged."""
    login = f"fuzz{next(_logins)}"
    # Some receipts correlate (ids m1..m3 are drawn often), so the rules and statuses run too.
    await store.record_submissions(
        [Submission(login=login, message_id=m, destination="+34600000001") for m in ("m1", "m2")]
    )
    receipts = receipts_from_payloads(payloads)
    result = await store.ingest(login, receipts)
    assert len(result.outcomes) == len(payloads)

    receptions = await db.fetch(
        "SELECT payload, flags FROM dlr.receptions_readable WHERE login = $1", login
    )
    evidence = await db.fetch(
        "SELECT evidence FROM dlr.exceptions WHERE login = $1 AND kind = 'unstorable'", login
    )
    # C8: every delivery is in the store exactly once, its bytes whole.
    stored = Counter(bytes(r["payload"]) for r in receptions)
    stored.update(bytes(r["evidence"]) for r in evidence)
    assert stored == Counter(payloads)

    flags_by_payload = {bytes(r["payload"]): r["flags"] for r in receptions}
    for receipt, outcome in zip(receipts, result.outcomes, strict=True):
        # Odd: kept raw as unstorable, or a reception that says what parse changed. Text that
        # is not UTF-8 is refused by the database unless it lies beyond a truncation.
        if (_must_be_flagged(receipt) or _not_utf8(receipt)) and outcome is not Outcome.UNSTORABLE:
            assert flags_by_payload[receipt.raw], receipt.raw[:80]
    return result.outcomes


_batches = st.lists(
    st.one_of(wire_receipts(allow_huge=True), hostile_payloads()), min_size=1, max_size=8
)


@examples(120)
@given(payloads=_batches)
async def test_c8_no_byte_sequence_breaks_ingest_or_loses_a_receipt(
    store: Store, db: asyncpg.Connection, payloads: list[ReceiptRecipe | DamagedPayload]
) -> None:
    """Any batch of any bytes: stored whole (reception or unstorable), odd ones flagged."""
    await _check_batch(store, db, [p.payload() for p in payloads])


async def test_c8_megabyte_fields_nul_everywhere_and_extreme_numbers_are_stored_and_flagged(
    store: Store, db: asyncpg.Connection
) -> None:
    """The cases a fuzzer draws rarely, every time: a 5 MB text, a 1 MB id, NUL in every field,
    levels 0, 3 and 2**32-1, a delivery count of 2**32-1, non-UTF-8 text, and a cut wire."""
    big = feed_pb2.Receipt(id="m1", level=2, stat="DELIVRD", text="x" * 5_000_000)
    huge_id = feed_pb2.Receipt(id="\U0010ffff" * 1_000_000, level=1, stat="ENROUTE")
    nul = feed_pb2.Receipt(id="m2\x00", level=2, stat="DELIV\x00RD", ack_token="t\x00")
    for name in OPTIONAL_FIELDS:
        setattr(nul, name, f"{name}\x00")
    extremes = [
        feed_pb2.Receipt(id="m1", level=level, stat="DELIVRD", delivery_count=2**32 - 1)
        for level in (0, 3, 2**32 - 1)
    ]
    not_utf8 = _serialized(feed_pb2.Receipt(id="m3", level=2)) + b"\x1a\x03D\xffD"
    cut = _serialized(feed_pb2.Receipt(id="m3", level=2, stat="DELIVRD", text="hello"))[:-3]
    payloads = [_serialized(m) for m in (big, huge_id, nul, *extremes)] + [not_utf8, cut]
    assert _undecodable(not_utf8)
    assert _undecodable(cut)
    outcomes = await _check_batch(store, db, payloads)
    assert outcomes[6] is Outcome.UNSTORABLE  # the non-UTF-8 stat, kept as evidence
    # Everything else became a reception, even the cut wire (its readable fields, bytes whole).
    assert Outcome.UNSTORABLE not in outcomes[:6] + outcomes[7:]


# ------------------------------------------------------------------ over real gRPC


_SERVICE = "gateway.receipts.v1.ReceiptFeed"


async def test_c8_undecodable_receipts_over_subscribe_and_pull_never_stop_the_reader(
    store: Store, db: asyncpg.Connection
) -> None:
    """A gateway that sends bytes protobuf refuses (a server that does not validate UTF-8): the
    Subscribe stream keeps going past them and a Pull response still yields its good receipts;
    all of them are stored. Before dlrfeed.feed.wire, Subscribe raised DecodeError out of the
    reader (the daemon stopped, and stopped again on every redelivery) and one such receipt
    failed every Pull of up to 1000 receipts with it."""
    good = [
        _serialized(feed_pb2.Receipt(id=f"g{i}", level=2, stat="DELIVRD", ack_token=f"t{i}"))
        for i in range(3)
    ]
    bad = [good[0] + b"\x1a\x02\xc3\x28", good[1][:-2], b"\xff\xff\xff"]
    sent = [good[0], bad[0], good[1], bad[1], good[2], bad[2]]

    async def subscribe(_request: bytes, _context: object) -> AsyncIterator[bytes]:
        for payload in sent:
            yield payload

    async def pull(_request: bytes, _context: object) -> bytes:
        return b"".join(b"\x0a" + bytes([len(p)]) + p for p in sent)

    handler = grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            # No serializers: the handlers speak raw bytes, as a careless gateway might.
            "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe),
            "Pull": grpc.unary_unary_rpc_method_handler(pull),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}", None)
    stream_channel = open_stream_channel(f"127.0.0.1:{port}", None)
    try:
        client = FeedClient(channel, "acme", "secret", stream_channel=stream_channel)
        stream = client.subscribe(window=10)
        streamed = []
        while (receipts := await stream.read()) is not None:
            streamed.extend(receipts)
        pulled = await client.pull(100, 0).receipts()
    finally:
        stream_channel.close()
        await channel.close(None)
        await server.stop(None)
    assert [r.raw for r in streamed] == sent
    assert [r.raw for r in pulled] == sent
    assert [r.message_id for r in pulled][0::2] == ["g0", "g1", "g2"]
    result = await store.ingest("acme", streamed + pulled)
    assert len(result.outcomes) == 12
    total = await db.fetchval(
        "SELECT (SELECT count(*) FROM dlr.receptions) + "
        "(SELECT count(*) FROM dlr.exceptions WHERE kind = 'unstorable')"
    )
    assert total == 12
