"""Both feed backends keep one contract: the same calls give the same answers.

The RPCs are written once over `FeedBackend`; these tests drive the in-memory backend (with a
SQLite journal) and the shared-store backend directly, without gRPC, with the clock passed in.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from fakegw.backend import FeedBackend, Reader, SweepCounts
from fakegw.memory_backend import MemoryBackend
from fakegw.persistence import SqlitePersistence
from fakegw.shared_backend import SharedBackend
from fakegw.tokens import TokenSigner
from fakegw.wire import ReceiptFields
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"
OTHER_LOGIN = "globex"
LEASE_SECONDS = 30.0
CAP = 5
T0 = 1_000_000.0  # the clock these tests pass in; nothing here reads the real time


def receipts(*numbers: int) -> list[ReceiptFields]:
    return [{"id": f"m{n}", "level": 2, "stat": "DELIVRD"} for n in numbers]


def decoded(wires: Sequence[bytes]) -> list[feed_pb2.Receipt]:
    return [feed_pb2.Receipt.FromString(wire) for wire in wires]


@pytest.fixture(params=["memory", "shared"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[FeedBackend]:
    store = str(tmp_path / "gw.sqlite")
    journal = SqlitePersistence(store)
    state = journal.load()
    signer = TokenSigner(state.hmac_key)
    chosen: FeedBackend
    if request.param == "memory":
        chosen = MemoryBackend(
            [LOGIN, OTHER_LOGIN],
            journal,
            state,
            signer,
            lease_seconds=LEASE_SECONDS,
            cap=CAP,
            ledger_max_records=0,
        )
    else:
        chosen = SharedBackend(
            store,
            signer,
            lease_seconds=LEASE_SECONDS,
            cap=CAP,
            poll_seconds=0.05,
            on_change_elsewhere=lambda: None,
        )
    await journal.start()
    await chosen.start()
    yield chosen
    await chosen.close()
    await journal.close()


async def take_ids(reader: Reader, limit: int, window: int | None, now: float) -> list[str]:
    deliveries = await reader.take(limit, window, now)
    return [receipt.id for receipt in decoded(deliveries.receipts)]


async def released_count(reader: Reader) -> int:
    """Release a reader (F7) and wait, with a generous bound, until it says how many."""
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    reader.release(done.set_result)
    return await asyncio.wait_for(done, 10)


async def test_the_cap_keeps_the_old_receipts_and_drops_the_new(backend: FeedBackend) -> None:
    assert await backend.enqueue(LOGIN, receipts(1, 2, 3), T0) == (3, 0)
    assert await backend.enqueue(LOGIN, receipts(4, 5, 6, 7), T0) == (2, 2)  # F15
    assert backend.sizes(LOGIN) == (5, 0)
    assert backend.sizes(OTHER_LOGIN) == (0, 0)


async def test_a_stream_takes_in_order_up_to_its_window(backend: FeedBackend) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2, 3), T0)
    stream = backend.reader(LOGIN, pull=False)
    deliveries = await stream.take(10, 2, T0)
    assert [r.id for r in decoded(deliveries.receipts)] == ["m1", "m2"]  # F11
    assert [r.delivery_count for r in decoded(deliveries.receipts)] == [1, 1]
    assert deliveries.redelivered == 0
    assert await take_ids(stream, 10, 2, T0) == []  # at the window: paused
    assert backend.sizes(LOGIN) == (1, 2)
    # F12: another reader of the login gets what the stream does not hold.
    assert await take_ids(backend.reader(LOGIN, pull=True), 10, None, T0) == ["m3"]


async def test_acks_free_the_window_and_repeat_as_already_gone(backend: FeedBackend) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2, 3), T0)
    stream = backend.reader(LOGIN, pull=False)
    first = decoded((await stream.take(10, 2, T0)).receipts)
    tokens = [receipt.ack_token for receipt in first]
    acked = await backend.ack(LOGIN, tokens, T0)
    assert acked.acked == [True, True]
    assert acked.invalid_tokens == 0
    assert await take_ids(stream, 10, 2, T0) == ["m3"]
    # F9: a repeat is already_gone; FD3: so are a forged token and another login's, as invalid.
    again = await backend.ack(LOGIN, [tokens[0], "forged"], T0)
    assert again.acked == [False, False]
    assert again.invalid_tokens == 1
    await backend.enqueue(OTHER_LOGIN, receipts(9), T0)
    [foreign] = decoded(
        list((await backend.reader(OTHER_LOGIN, pull=True).take(1, None, T0)).receipts)
    )
    assert (await backend.ack(LOGIN, [foreign.ack_token], T0)).acked == [False]
    assert backend.sizes(OTHER_LOGIN) == (0, 1)


async def test_a_released_stream_hands_its_receipts_back_behind_newer_ones(
    backend: FeedBackend,
) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2), T0)
    stream = backend.reader(LOGIN, pull=False)
    assert await take_ids(stream, 10, None, T0) == ["m1", "m2"]
    await backend.enqueue(LOGIN, receipts(3), T0)
    assert await released_count(stream) == 2  # F7
    pull = backend.reader(LOGIN, pull=True)
    deliveries = await pull.take(10, None, T0)
    again = decoded(deliveries.receipts)
    assert [r.id for r in again] == ["m3", "m1", "m2"]  # F13: redeliveries after newer
    assert [r.delivery_count for r in again] == [1, 2, 2]  # F6
    assert deliveries.redelivered == 2


async def test_an_expired_lease_is_delivered_again(backend: FeedBackend) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2), T0)
    pull = backend.reader(LOGIN, pull=True)
    assert await take_ids(pull, 1, None, T0) == ["m1"]
    assert await backend.sweep(T0 + 1, 0.0) == {}  # the lease still runs
    later = T0 + LEASE_SECONDS + 1
    assert await backend.sweep(later, 0.0) == {LOGIN: SweepCounts(lease_expired=1)}
    redelivered = decoded((await pull.take(10, None, later)).receipts)
    assert [(r.id, r.delivery_count) for r in redelivered] == [("m2", 1), ("m1", 2)]


async def test_retention_removes_only_unread_receipts(backend: FeedBackend) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2), T0)
    await backend.enqueue(LOGIN, receipts(3), T0 + 100)
    assert await take_ids(backend.reader(LOGIN, pull=False), 1, None, T0) == ["m1"]
    swept = await backend.sweep(T0 + 1, T0 + 50)  # the lease still runs
    assert swept == {LOGIN: SweepCounts(removed_by_retention=1)}  # F16: m2; m1 is leased
    assert backend.sizes(LOGIN) == (1, 1)


async def test_the_ledger_records_enqueues_and_acks(backend: FeedBackend) -> None:
    await backend.enqueue(LOGIN, receipts(1, 2), T0)
    await backend.enqueue(OTHER_LOGIN, receipts(7), T0)
    [first] = decoded((await backend.reader(LOGIN, pull=True).take(1, None, T0)).receipts)
    await backend.ack(LOGIN, [first.ack_token], T0 + 1)
    page = backend.ledger(LOGIN, 0, 100)
    assert [(r.kind, r.receipt["id"], r.at) for r in page.records] == [
        ("enqueue", "m1", T0),
        ("enqueue", "m2", T0),
        ("ack", "m1", T0 + 1),
    ]
    assert page.records[-1].token == first.ack_token
    assert page.first_id == 1
    everything = backend.ledger(None, 0, 2)
    assert [r.receipt["id"] for r in everything.records] == ["m1", "m2"]
    assert [r.receipt["id"] for r in backend.ledger(None, everything.next_after, 100).records] == [
        "m7",
        "m1",
    ]
