"""fakegw's seedable fault injection: each fault does what it says, and replays exactly."""

from __future__ import annotations

import time

import grpc
import pytest

from fakegw.admin_client import AdminClient
from fakegw.faults import Faults
from fakegw.server import FakeGateway
from support.fakegw_support import (
    LOGIN,
    LOGINS,
    PASSWORD,
    StreamReader,
    feed_client,
    receipt_body,
)


async def test_duplicate_fault_enqueues_the_same_id_and_level_again() -> None:
    """F8 says clients must dedupe by id + level; this fault makes them prove it."""
    async with FakeGateway(LOGINS, faults=Faults(duplicate_rate=1.0)).running() as gw:
        result = await gw.inject(LOGIN, [receipt_body(1)])
        assert result["enqueued"] == 2
        client = feed_client(gw.target)
        receipts = await client.pull()
        await client.close()
        assert [(r.id, r.level) for r in receipts] == [("m1", 2), ("m1", 2)]
        assert receipts[0].ack_token != receipts[1].ack_token


async def test_duplicate_fault_replays_exactly_with_the_same_seed() -> None:
    patterns = []
    for _ in range(2):
        faults = Faults(seed=7, duplicate_rate=0.5)
        async with FakeGateway(LOGINS, faults=faults).running() as gw:
            await gw.inject(LOGIN, [receipt_body(i) for i in range(50)])
            records = gw.ledger(LOGIN)["records"]
            patterns.append([r["receipt"]["id"] for r in records])
    assert patterns[0] == patterns[1]
    assert 50 < len(patterns[0]) < 100


async def test_stream_cut_fault_ends_the_stream_after_n_receipts_and_releases() -> None:
    async with FakeGateway(
        LOGINS, lease_seconds=60, faults=Faults(cut_stream_every=3)
    ).running() as gw:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(10)])
        client = feed_client(gw.target)
        reader = StreamReader(client, window=100)
        await reader.task
        assert reader.error is not None
        assert reader.error.code() == grpc.StatusCode.UNAVAILABLE
        assert len(reader.receipts) == 3
        assert gw.stats(LOGIN)["in_flight"] == 0  # F7: the cut stream released everything
        await client.close()


async def test_unavailable_and_no_subscribe_faults_switch_at_runtime() -> None:
    async with FakeGateway(LOGINS).running() as gw:
        client = feed_client(gw.target)
        async with AdminClient(gw.target, LOGIN, PASSWORD) as admin:
            knobs = await admin.faults(unavailable_rate=1.0, no_subscribe=True)
            assert knobs["unavailable_rate"] == 1.0
            with pytest.raises(grpc.aio.AioRpcError) as pulled:
                await client.pull()
            assert pulled.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError) as acked:
                await client.ack(["x"])
            assert acked.value.code() == grpc.StatusCode.UNAVAILABLE
            reader = StreamReader(client)
            await reader.task
            assert reader.error is not None
            assert reader.error.code() == grpc.StatusCode.UNIMPLEMENTED
            await admin.faults(unavailable_rate=0.0, no_subscribe=False)
            assert await client.pull() == []
        await client.close()


async def test_ack_lost_fault_applies_the_ack_and_a_repeat_is_already_gone() -> None:
    """F9: repeating an Ack after a lost reply is safe."""
    async with FakeGateway(LOGINS, faults=Faults(ack_lost_rate=1.0)).running() as gw:
        await gw.inject(LOGIN, [receipt_body(1)])
        client = feed_client(gw.target)
        token = (await client.pull())[0].ack_token
        with pytest.raises(grpc.aio.AioRpcError):
            await client.ack([token])
        assert gw.stats(LOGIN)["acked"] == 1
        gw.faults.update({"ack_lost_rate": 0.0})
        assert list((await client.ack([token])).already_gone) == [token]
        await client.close()


async def test_unknown_fault_knob_is_invalid_argument() -> None:
    async with FakeGateway(LOGINS).running() as gw, AdminClient(gw.target, LOGIN, None) as admin:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin.faults(no_such_knob=1)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_latency_fault_delays_pull_and_ack_answers() -> None:
    async with FakeGateway(LOGINS, faults=Faults(latency_ms=250)).running() as gw:
        client = feed_client(gw.target)
        started = time.monotonic()
        assert await client.pull() == []
        assert (await client.ack(["gone"])).acked == 0
        assert time.monotonic() - started >= 0.5
        await client.close()


async def test_ledger_pages_by_id_and_a_bounded_ledger_keeps_the_newest() -> None:
    """The ledger (every enqueue and ack) pages stably, also when trimmed for long runs."""
    async with FakeGateway(LOGINS, ledger_max_records=10).running() as gw:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(30)])
        page = gw.ledger(LOGIN, after=0, limit=5)
        assert page["first_id"] > 1
        assert len(page["records"]) == 5
        assert page["records"][0]["id"] == page["first_id"]
        rest = gw.ledger(LOGIN, after=page["next"])
        ids = [r["id"] for r in page["records"] + rest["records"]]
        assert ids == list(range(ids[0], 31))
        assert rest["records"][-1]["receipt"]["id"] == "m29"
