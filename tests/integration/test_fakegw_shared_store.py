"""`--shared-store`: several fakegw nodes on one SQLite file act as one gateway (F6, F7, F9, F12).

Nodes are two in-process FakeGateway instances on one file (real gRPC over loopback), and for
the crash case two real `fakegw serve` processes, one of them killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fakegw import FakeGateway
from fakegw.admin_client import AdminClient
from gateway.receipts.v1 import feed_pb2
from support.fakegw_support import (
    LOGIN,
    LOGINS,
    OTHER_LOGIN,
    OTHER_PASSWORD,
    PASSWORD,
    FeedClient,
    StreamReader,
    feed_client,
    receipt_body,
    start_fakegw_process,
    stop_fakegw_process,
    wait_until,
)


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[FakeGateway, FakeGateway]]:
    """Two gateway nodes sharing one store file, leases of 30 s unless a test shortens them."""
    store = str(tmp_path / "shared.db")
    first = FakeGateway(LOGINS, store=store, shared_store=True, lease_seconds=30)
    second = FakeGateway(LOGINS, store=store, shared_store=True, lease_seconds=30)
    async with first.running(), second.running():
        yield first, second


async def _clients(a: FakeGateway, b: FakeGateway) -> tuple[FeedClient, FeedClient]:
    return feed_client(a.target), feed_client(b.target)


async def test_f12_receipt_injected_at_one_node_is_pulled_at_another(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = nodes
    client_a, client_b = await _clients(a, b)
    await a.inject(LOGIN, [receipt_body(i) for i in range(5)])
    pulled = await client_b.pull()
    assert [r.id for r in pulled] == [f"m{i}" for i in range(5)]
    assert {r.delivery_count for r in pulled} == {1}
    # F12: leased at B, so A has nothing to hand out and counts them in flight.
    assert await client_a.pull() == []
    assert (a.stats(LOGIN)["queued"], a.stats(LOGIN)["in_flight"]) == (0, 5)
    await client_a.close()
    await client_b.close()


async def test_f9_token_from_one_node_acked_at_another_is_gone_everywhere(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = nodes
    client_a, client_b = await _clients(a, b)
    await b.inject(LOGIN, [receipt_body(i) for i in range(4)])
    pulled = await client_a.pull()
    tokens = [r.ack_token for r in pulled]
    response = await client_b.ack(tokens)
    assert (response.acked, list(response.already_gone)) == (4, [])
    # Repeating at A: already_gone (F9); A neither counts them queued nor redelivers them.
    repeat = await client_a.ack(tokens[:2])
    assert (repeat.acked, list(repeat.already_gone)) == (0, tokens[:2])
    for node in (a, b):
        stats = node.stats(LOGIN)
        assert (stats["queued"], stats["in_flight"], stats["total"]) == (0, 0, 0)
    await a.sweep()
    assert await client_a.pull() == []
    # The ledger of every node holds every node's records, each id once.
    records = a.ledger(LOGIN)["records"]
    assert [r["kind"] for r in records] == ["enqueue"] * 4 + ["ack"] * 4
    assert len({r["id"] for r in records}) == 8
    assert b.ledger(LOGIN)["records"] == records
    await client_a.close()
    await client_b.close()


async def test_f9_forged_and_cross_login_tokens_are_already_gone_at_another_node(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = nodes
    await a.inject(LOGIN, [receipt_body(1)])
    client_a = feed_client(a.target)
    (receipt,) = await client_a.pull()
    token = receipt.ack_token
    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    other_b = feed_client(b.target, OTHER_LOGIN, OTHER_PASSWORD)
    response = await other_b.ack([token])
    assert (response.acked, list(response.already_gone)) == (0, [token])
    client_b = feed_client(b.target)
    response = await client_b.ack([forged, "not a token"])
    assert (response.acked, list(response.already_gone)) == (0, [forged, "not a token"])
    assert b.stats(LOGIN)["invalid_tokens"] == 2
    assert b.stats(LOGIN)["total"] == 1  # the receipt is still queued
    assert (await client_b.ack([token])).acked == 1
    for client in (client_a, other_b, client_b):
        await client.close()


async def test_f12_concurrent_readers_on_two_nodes_never_share_a_lease(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    """Two Pull loops and two Subscribe streams, one of each per node, drain one queue: every
    receipt is delivered, each exactly once (no expiry: leases are 30 s). Each stream holds a
    full window before the Pull loops start, so every reader has a lease to keep to itself
    whatever the machine's load (no reader's share is left to timing)."""
    a, b = nodes
    total = 3000
    await a.inject(LOGIN, [receipt_body(i) for i in range(total // 2)])
    await b.inject(LOGIN, [receipt_body(i) for i in range(total // 2, total)])
    seen: list[feed_pb2.Receipt] = []
    clients = [feed_client(node.target) for node in (a, b, a, b)]
    streams = [StreamReader(clients[2], window=100), StreamReader(clients[3], window=100)]
    await wait_until(lambda: all(len(s.receipts) == 100 for s in streams), 60)

    def delivered_so_far() -> int:
        return len(seen) + sum(len(s.receipts) for s in streams)

    async def pull_loop(client: FeedClient) -> None:
        while delivered_so_far() < total:
            batch = await client.pull(max_receipts=200, wait_seconds=1)
            seen.extend(batch)
            if batch:
                await client.ack([r.ack_token for r in batch])

    acked = [0, 0]

    async def ack_stream_receipts() -> None:
        for index, stream in enumerate(streams):
            fresh = stream.receipts[acked[index] :]
            if fresh:
                acked[index] += len(fresh)
                # Acked at the other node: F11 windows reopen on acks from any node.
                await clients[1 - index].ack([r.ack_token for r in fresh])

    async def ack_streams() -> None:
        while delivered_so_far() < total:
            await ack_stream_receipts()
            await asyncio.sleep(0.005)
        await ack_stream_receipts()

    # Generous: a bound on a hang, not on speed (both cores may be busy).
    await asyncio.wait_for(
        asyncio.gather(pull_loop(clients[0]), pull_loop(clients[1]), ack_streams()), 120
    )
    for stream in streams:
        await stream.stop()
    delivered = seen + [r for s in streams for r in s.receipts]
    ids = [r.id for r in delivered]
    assert len(ids) == len(set(ids)) == total
    assert {r.delivery_count for r in delivered} == {1}
    assert all(len(s.receipts) > 0 for s in streams)
    assert a.stats(LOGIN)["total"] == 0
    for client in clients:
        await client.close()


async def test_f7_stream_end_at_one_node_releases_at_once_for_another(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = nodes
    client_a, client_b = await _clients(a, b)
    await a.inject(LOGIN, [receipt_body(i) for i in range(10)])
    stream = StreamReader(client_a, window=4)
    await wait_until(lambda: len(stream.receipts) == 4)
    # F11 across nodes: an ack at B reopens A's window.
    await client_b.ack([stream.receipts[0].ack_token])
    await wait_until(lambda: len(stream.receipts) == 5)
    started = time.monotonic()
    await stream.stop()
    # F7: the 4 unacked receipts come back at once (lease is 30 s), delivery_count + 1. Node A
    # releases them when it sees the stream end, a moment after the cancel: B's long poll may
    # answer first with the 5 never delivered, so it pulls until all 9 are back.
    again = await client_b.pull(wait_seconds=5)
    while len(again) < 9 and time.monotonic() - started < 15:
        again += await client_b.pull(wait_seconds=1)
    assert time.monotonic() - started < 15  # released, not waiting out the 30 s lease
    counts = {r.id: r.delivery_count for r in again}
    assert {counts[r.id] for r in stream.receipts[1:]} == {2}
    assert len(again) == 9
    await client_a.close()
    await client_b.close()


async def test_f11_subscribe_at_one_node_notices_inject_at_another_within_the_poll(
    nodes: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = nodes
    client_b = feed_client(b.target)
    stream = StreamReader(client_b)
    await asyncio.sleep(0.2)  # the stream is now waiting for receipts
    started = time.monotonic()
    await a.inject(LOGIN, [receipt_body(1)])
    await wait_until(lambda: len(stream.receipts) == 1)
    assert time.monotonic() - started < 5.0  # polled (every 50 ms), not found by chance
    await stream.stop()
    await client_b.close()


async def test_f6_leases_of_a_killed_node_return_at_another_after_the_lease(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "shared.db")
    common = ("--store", store, "--shared-store", "--lease-seconds", "1")
    node_a, target_a = start_fakegw_process(*common)
    node_b, target_b = start_fakegw_process(*common)
    try:
        async with AdminClient(target_b, LOGIN, PASSWORD) as admin:
            assert (await admin.inject([receipt_body(i) for i in range(6)]))["enqueued"] == 6
        client_a = feed_client(target_a)
        leased_at = time.monotonic()  # before the lease starts: a slow kill does not count
        held = await client_a.pull(max_receipts=4)
        await client_a.close()
        stop_fakegw_process(node_a, signal.SIGKILL)
        client_b = feed_client(target_b)
        first = await client_b.pull()
        assert [r.id for r in first] == ["m4", "m5"]  # the crashed node's leases still hold
        assert (await client_b.ack([r.ack_token for r in first])).acked == 2
        back = await client_b.pull(wait_seconds=5)
        assert time.monotonic() - leased_at >= 0.9  # the 1 s lease ran out; not at the kill
        assert [(r.id, r.delivery_count) for r in back] == [(r.id, 2) for r in held]
        assert (await client_b.ack([r.ack_token for r in held])).acked == 4
        await client_b.close()
        async with AdminClient(target_b, LOGIN, PASSWORD) as admin:
            ledger = await admin.ledger_all()
        assert len({r["id"] for r in ledger}) == len(ledger) == 12
    finally:
        for process in (node_a, node_b):
            if process.poll() is None:
                stop_fakegw_process(process, signal.SIGKILL)


async def test_f7_f13_node_stop_releases_its_streams_behind_newer_receipts(tmp_path: Path) -> None:
    store = str(tmp_path / "shared.db")
    a = FakeGateway(LOGINS, store=store, shared_store=True, lease_seconds=30)
    b = FakeGateway(LOGINS, store=store, shared_store=True, lease_seconds=30)
    async with b.running():
        await a.start()
        client_a, client_b = feed_client(a.target), feed_client(b.target)
        await b.inject(LOGIN, [receipt_body(i) for i in range(5)])
        stream = StreamReader(client_a, window=3)
        await wait_until(lambda: len(stream.receipts) == 3)
        await a.stop()
        await stream.task
        assert stream.error is not None  # the stream ended with the node (UNAVAILABLE)
        assert b.stats(LOGIN)["in_flight"] == 0
        again = await client_b.pull()
        expected = [("m3", 1), ("m4", 1), ("m0", 2), ("m1", 2), ("m2", 2)]
        assert [(r.id, r.delivery_count) for r in again] == expected
        await client_a.close()
        await client_b.close()
