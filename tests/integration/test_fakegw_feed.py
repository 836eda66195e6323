"""fakegw's feed over real loopback gRPC, one or more tests per rule of docs/spec/feed.md."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import grpc
import pytest

from fakegw.admin_client import AdminClient, loopback_login_metadata
from fakegw.server import FakeGateway
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
    wait_until,
)

GatewayFactory = Callable[..., AbstractAsyncContextManager[FakeGateway]]


@asynccontextmanager
async def _running(**options: Any) -> AsyncIterator[FakeGateway]:
    async with FakeGateway(LOGINS, **options).running() as gw:
        yield gw


@pytest.fixture
def gateway() -> GatewayFactory:
    """`async with gateway(lease_seconds=1) as gw:` - a fakegw on a free loopback port."""
    return _running


@asynccontextmanager
async def _client(
    gw: FakeGateway, login: str = LOGIN, password: str = PASSWORD
) -> AsyncIterator[FeedClient]:
    client = feed_client(gw.target, login, password)
    try:
        yield client
    finally:
        await client.close()


# -- F6 lease and redelivery ----------------------------------------------------------------
async def test_f6_unacked_receipt_is_redelivered_after_lease_with_count_plus_one(
    gateway: GatewayFactory,
) -> None:
    async with gateway(lease_seconds=2.0) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(1)])
        started = time.monotonic()
        first = await client.pull()
        assert [(r.id, r.delivery_count) for r in first] == [("m1", 1)]
        leased = await client.pull()
        if time.monotonic() - started < 2.0:  # answered within the lease (a stall may not be)
            assert leased == []  # leased: nobody else gets it meanwhile
        # The lease's end, whenever the sweep sees it: a long poll returns with the redelivery.
        again = leased or await client.pull(wait_seconds=30)
        assert [(r.id, r.delivery_count) for r in again] == [("m1", 2)]
        assert gw.stats(LOGIN)["redelivered"] == 1


async def test_f13_redelivered_receipt_queues_behind_newer_receipts(
    gateway: GatewayFactory,
) -> None:
    async with gateway(lease_seconds=1.5) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(1), receipt_body(2)])
        started = time.monotonic()
        assert [r.id for r in await client.pull(max_receipts=1)] == ["m1"]
        await gw.inject(LOGIN, [receipt_body(3)])
        # m3 queued before m1's lease ended, unless the machine stalled that long.
        m3_first = time.monotonic() - started < 1.5
        await wait_until(lambda: gw.stats(LOGIN)["queued"] == 3)  # m1's lease ended, swept
        order = [r.id for r in await client.pull()]
        assert order == (["m2", "m3", "m1"] if m3_first else ["m2", "m1", "m3"])


# -- F7 stream end releases at once --------------------------------------------------------
async def test_f7_client_cancel_releases_unacked_receipts_at_once(
    gateway: GatewayFactory,
) -> None:
    async with gateway(lease_seconds=60) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(5)])
        reader = StreamReader(client, window=10)
        await wait_until(lambda: len(reader.receipts) == 5)
        assert gw.stats(LOGIN)["in_flight"] == 5
        await reader.stop()
        await wait_until(lambda: gw.stats(LOGIN)["in_flight"] == 0, within_seconds=2)
        again = await client.pull()
        assert sorted(r.id for r in again) == [f"m{i}" for i in range(5)]
        assert {r.delivery_count for r in again} == {2}


async def test_f7_dropped_connection_releases_unacked_receipts_at_once(
    gateway: GatewayFactory,
) -> None:
    """A reader process killed with SIGKILL: its connection drops, its receipts come back."""
    async with gateway(lease_seconds=60) as gw:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(3)])
        script = textwrap.dedent(
            f"""
            import sys, grpc
            from fakegw.admin_client import basic_auth_metadata
            from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc
            channel = grpc.insecure_channel({gw.target!r})
            stub = feed_pb2_grpc.ReceiptFeedStub(channel)
            call = stub.Subscribe(feed_pb2.SubscribeRequest(window=10),
                                  metadata=basic_auth_metadata({LOGIN!r}, {PASSWORD!r}))
            for number, receipt in enumerate(call, 1):
                if number == 3:
                    print("got3", flush=True)
            """
        )
        reader = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=subprocess.PIPE
        )
        assert reader.stdout is not None
        assert await asyncio.wait_for(reader.stdout.readline(), 20) == b"got3\n"
        assert gw.stats(LOGIN)["in_flight"] == 3
        reader.kill()
        await reader.wait()
        await wait_until(lambda: gw.stats(LOGIN)["in_flight"] == 0, within_seconds=5)
        assert gw.stats(LOGIN)["queued"] == 3


async def test_f7_server_stop_and_restart_releases_everything(tmp_path: Any) -> None:
    store = str(tmp_path / "feed.db")
    async with FakeGateway(LOGINS, store=store, lease_seconds=60).running() as gw:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(4)])
        client = feed_client(gw.target)
        reader = StreamReader(client, window=10)
        await wait_until(lambda: len(reader.receipts) == 4)
    await reader.task  # the stream ended with the server
    await client.close()
    assert reader.error is not None
    async with FakeGateway(LOGINS, store=store, lease_seconds=60).running() as gw2:
        assert gw2.stats(LOGIN)["queued"] == 4
        assert gw2.stats(LOGIN)["in_flight"] == 0
        async with _client(gw2) as client2:
            again = await client2.pull()
        assert {r.delivery_count for r in again} == {2}
        # F9: tokens from before the restart still ack.
        response = await client2_ack(gw2, [r.ack_token for r in reader.receipts])
        assert response.acked == 4


async def client2_ack(gw: FakeGateway, tokens: list[str]) -> feed_pb2.AckResponse:
    async with _client(gw) as client:
        return await client.ack(tokens)


# -- F9 Ack --------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1001])
async def test_f9_ack_with_none_or_more_than_1000_tokens_is_invalid_argument(
    gateway: GatewayFactory, count: int
) -> None:
    async with gateway() as gw, _client(gw) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.ack(["x"] * count)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_f9_ack_of_1000_tokens_is_accepted(gateway: GatewayFactory) -> None:
    async with gateway() as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(1000)])
        tokens = [r.ack_token for r in await client.pull()]
        response = await client.ack(tokens)
        assert (response.acked, list(response.already_gone)) == (1000, [])
        assert gw.stats(LOGIN)["total"] == 0


async def test_f9_every_already_gone_case(gateway: GatewayFactory) -> None:
    """Acked twice, another login's token, malformed, forged: already_gone, never an error."""
    async with (
        gateway() as gw,
        _client(gw) as client,
        _client(gw, OTHER_LOGIN, OTHER_PASSWORD) as other,
    ):
        await gw.inject(LOGIN, [receipt_body(1), receipt_body(2)])
        await gw.inject(OTHER_LOGIN, [receipt_body(9)])
        mine = [r.ack_token for r in await client.pull()]
        theirs = [r.ack_token for r in await other.pull()]
        first = await client.ack([mine[0]])
        assert first.acked == 1
        forged = mine[1][:-2] + ("AA" if not mine[1].endswith("AA") else "BB")
        gone_cases = [mine[0], theirs[0], "%%%not-base64%%%", forged]
        response = await client.ack([*gone_cases, mine[1]])
        assert response.acked == 1
        assert list(response.already_gone) == gone_cases
        # The other login's receipt is untouched by the foreign ack.
        assert gw.stats(OTHER_LOGIN)["total"] == 1
        # Only the spent token was genuine; the other three fail the HMAC check for this login.
        assert gw.stats(LOGIN)["invalid_tokens"] == 3


async def test_f9_token_of_an_expired_lease_still_acks(gateway: GatewayFactory) -> None:
    """Decided here: acking works whichever delivery the token came from."""
    async with gateway(lease_seconds=0.3) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(1)])
        old = (await client.pull())[0]
        new = (await client.pull(wait_seconds=30))[0]  # returns once the sweep requeues it
        assert new.delivery_count == 2
        assert (await client.ack([old.ack_token])).acked == 1
        assert list((await client.ack([new.ack_token])).already_gone) == [new.ack_token]


# -- F10 Pull ------------------------------------------------------------------------------
async def test_f10_pull_with_wait_zero_returns_at_once_empty(gateway: GatewayFactory) -> None:
    async with gateway() as gw, _client(gw) as client:
        started = time.monotonic()
        assert await client.pull(wait_seconds=0) == []
        assert time.monotonic() - started < 5.0  # a pull that waited would take 20 s


async def test_f10_long_poll_returns_as_soon_as_a_receipt_arrives(
    gateway: GatewayFactory,
) -> None:
    async with gateway() as gw, _client(gw) as client:
        started = time.monotonic()
        pull = asyncio.create_task(client.pull(wait_seconds=10))
        await asyncio.sleep(0.3)
        assert not pull.done()
        await gw.inject(LOGIN, [receipt_body(1)])
        receipts = await pull
        assert [r.id for r in receipts] == ["m1"]
        assert time.monotonic() - started < 8.0  # not the pull's 10 s wait


async def test_f10_max_and_wait_are_clamped(gateway: GatewayFactory) -> None:
    """Above 1000 receipts is clamped to 1000; wait above the maximum is clamped to it."""
    async with gateway(max_pull_wait_seconds=0.3) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(1200)])
        first = await client.pull(max_receipts=5000)
        assert len(first) == 1000
        assert [r.id for r in first[:3]] == ["m0", "m1", "m2"]  # oldest first
        assert len(await client.pull(max_receipts=5000)) == 200
        started = time.monotonic()
        assert await client.pull(wait_seconds=100) == []
        assert 0.2 < time.monotonic() - started < 30.0  # 0.3 s, not the 100 s asked


# -- F11 Subscribe window ------------------------------------------------------------------
async def test_f11_stream_sends_backlog_then_live(gateway: GatewayFactory) -> None:
    async with gateway() as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(1)])
        reader = StreamReader(client)
        await wait_until(lambda: len(reader.receipts) == 1)
        await gw.inject(LOGIN, [receipt_body(2)])
        await wait_until(lambda: len(reader.receipts) == 2)
        assert [r.id for r in reader.receipts] == ["m1", "m2"]
        await reader.stop()


async def test_f11_stream_pauses_at_window_and_resumes_on_ack_from_another_channel(
    gateway: GatewayFactory,
) -> None:
    async with gateway() as gw, _client(gw) as streamer, _client(gw) as acker:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(10)])
        reader = StreamReader(streamer, window=3)
        await wait_until(lambda: len(reader.receipts) == 3)
        await asyncio.sleep(0.3)
        assert len(reader.receipts) == 3  # paused exactly at the window
        await acker.ack([r.ack_token for r in reader.receipts[:2]])
        await wait_until(lambda: len(reader.receipts) == 5)
        await asyncio.sleep(0.2)
        assert len(reader.receipts) == 5
        await reader.stop()


async def test_f11_unset_or_oversized_window_uses_the_maximum(gateway: GatewayFactory) -> None:
    async with gateway(max_window=4) as gw, _client(gw) as client:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(20)])
        unset = StreamReader(client, window=0)
        await wait_until(lambda: len(unset.receipts) == 4)
        huge = StreamReader(client, window=10_000)
        await wait_until(lambda: len(huge.receipts) == 4)
        await asyncio.sleep(0.2)
        assert (len(unset.receipts), len(huge.receipts)) == (4, 4)
        await unset.stop()
        await huge.stop()


# -- F12 several readers -------------------------------------------------------------------
async def test_f12_three_readers_share_a_login_each_receipt_to_one_reader(
    gateway: GatewayFactory,
) -> None:
    total = 300
    async with gateway(lease_seconds=60) as gw:
        await gw.inject(LOGIN, [receipt_body(i) for i in range(total)])
        clients = [feed_client(gw.target) for _ in range(3)]
        readers = [StreamReader(clients[0], window=20), StreamReader(clients[1], window=20)]
        pulled: list[feed_pb2.Receipt] = []
        held: dict[str, str] = {}
        double_held: list[str] = []

        async def ack_loop() -> None:
            seen = [0, 0]
            while gw.stats(LOGIN)["acked"] < total:
                batch = await clients[2].pull(max_receipts=7)
                pulled.extend(batch)
                for receipt in batch:
                    if receipt.id in held:
                        double_held.append(receipt.id)
                    held[receipt.id] = "pull"
                tokens = [r.ack_token for r in batch]
                for index, reader in enumerate(readers):
                    for receipt in reader.receipts[seen[index] :]:
                        if receipt.id in held:
                            double_held.append(receipt.id)
                        held[receipt.id] = f"stream{index}"
                        tokens.append(receipt.ack_token)
                    seen[index] = len(reader.receipts)
                if tokens:
                    await clients[2].ack(tokens)
                await asyncio.sleep(0.01)

        await asyncio.wait_for(ack_loop(), 20)
        for reader in readers:
            await reader.stop()
        for client in clients:
            await client.close()
        delivered = [r.id for reader in readers for r in reader.receipts] + [r.id for r in pulled]
        assert double_held == []
        assert sorted(delivered) == sorted(f"m{i}" for i in range(total))
        assert all(reader.receipts for reader in readers)  # the work was really shared
        assert gw.stats(LOGIN)["redelivered"] == 0


# -- F15 cap, F16 retention -----------------------------------------------------------------
async def test_f15_at_the_cap_new_receipts_are_dropped_and_counted(
    gateway: GatewayFactory,
) -> None:
    async with gateway(cap=3) as gw, _client(gw) as client:
        result = await gw.inject(LOGIN, [receipt_body(i) for i in range(5)])
        assert result == {"enqueued": 3, "dropped_at_cap": 2, "callbacks": 0}
        stats = gw.stats(LOGIN)
        assert (stats["total"], stats["dropped_at_cap"]) == (3, 2)
        receipts = await client.pull()
        assert [r.id for r in receipts] == ["m0", "m1", "m2"]  # the old ones are kept
        await client.ack([receipts[0].ack_token])
        assert (await gw.inject(LOGIN, [receipt_body(9)]))["enqueued"] == 1


async def test_f16_retention_removes_old_unread_receipts(gateway: GatewayFactory) -> None:
    async with (
        gateway(retention_seconds=0.3, housekeeping_seconds=0.05) as gw,
        _client(gw) as client,
    ):
        await gw.inject(LOGIN, [receipt_body(i) for i in range(3)])
        leased = await client.pull(max_receipts=1)
        await wait_until(lambda: gw.stats(LOGIN)["removed_by_retention"] == 2)
        stats = gw.stats(LOGIN)
        assert (stats["queued"], stats["in_flight"], stats["removed_by_retention"]) == (0, 1, 2)
        assert (await client.ack([leased[0].ack_token])).acked == 1


# -- authentication (FD1) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("login", "password"),
    [(LOGIN, "wrong"), ("nobody", PASSWORD), (OTHER_LOGIN, PASSWORD)],
)
async def test_wrong_credentials_are_unauthenticated_on_every_rpc(
    gateway: GatewayFactory, login: str, password: str
) -> None:
    async with gateway() as gw, _client(gw, login, password) as client:
        with pytest.raises(grpc.aio.AioRpcError) as pulled:
            await client.pull()
        assert pulled.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as acked:
            await client.ack(["x"])
        assert acked.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reader = StreamReader(client)
        await reader.task
        assert reader.error is not None
        assert reader.error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_missing_credentials_are_unauthenticated_and_admin_header_is_not_feed_auth(
    gateway: GatewayFactory,
) -> None:
    async with gateway() as gw:
        channel = grpc.aio.insecure_channel(gw.target)
        pull = channel.unary_unary(
            "/gateway.receipts.v1.ReceiptFeed/Pull",
            request_serializer=feed_pb2.PullRequest.SerializeToString,
            response_deserializer=feed_pb2.PullResponse.FromString,
        )
        for metadata in [(), loopback_login_metadata(LOGIN)]:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pull(feed_pb2.PullRequest(), metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await channel.close(grace=None)
        async with AdminClient(gw.target, LOGIN, "wrong") as admin:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await admin.stats()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
