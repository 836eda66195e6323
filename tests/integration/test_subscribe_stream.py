"""`SubscribeStream` over real loopback gRPC: the groups of messages the reader takes at once,
the window and how a stream ends against fakegw (F7, F11), and each status a gateway or a proxy
can end it with, as the project's errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import pytest

from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import AuthenticationError, FatalError, FeedUnavailableError
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient, FeedTlsError, FeedUnimplementedError, SubscribeStream
from fakegw.server import FakeGateway
from gateway.receipts.v1 import feed_pb2
from support.fakegw_support import LOGIN, LOGINS, PASSWORD, receipt_body, wait_until


@asynccontextmanager
async def _feed(password: str = PASSWORD) -> AsyncIterator[tuple[FakeGateway, FeedClient]]:
    async with FakeGateway(LOGINS).running() as gw:
        channel = open_channel(gw.target, None)
        stream_channel = open_stream_channel(gw.target, None)
        try:
            yield gw, FeedClient(channel, LOGIN, password, stream_channel=stream_channel)
        finally:
            stream_channel.close()
            await channel.close(grace=None)


async def _read(stream: SubscribeStream, count: int) -> list[list[Receipt]]:
    """Each read()'s receipts until `count` have come."""
    groups: list[list[Receipt]] = []
    while sum(map(len, groups)) < count:
        receipts = await stream.read()
        assert receipts is not None
        groups.append(receipts)
    return groups


async def test_receipts_that_arrived_while_the_loop_was_busy_come_in_one_read() -> None:
    async with _feed() as (gw, client):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(50)])
        stream = client.subscribe(window=100)
        await wait_until(lambda: gw.stats(LOGIN)["in_flight"] == 50)
        await asyncio.sleep(0.2)  # the loop reads nothing meanwhile: the connection queues them
        groups = await _read(stream, 50)
        stream.cancel()
    assert [r.message_id for group in groups for r in group] == [f"m{n}" for n in range(50)]
    assert len(groups) < 50
    assert all(len({r.received_at for r in group}) == 1 for group in groups)


async def test_the_stream_holds_its_window_and_resumes_after_an_ack() -> None:
    """F11: what the connection queues is bounded by the window, not by the backlog."""
    async with _feed() as (gw, client):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(30)])
        stream = client.subscribe(window=10)
        first = [r for group in await _read(stream, 10) for r in group]
        await asyncio.sleep(0.2)
        assert gw.stats(LOGIN)["in_flight"] == 10
        assert (await client.ack([r.ack_token for r in first])).acked == 10
        second = [r for group in await _read(stream, 10) for r in group]
        stream.cancel()
    assert [r.message_id for r in first + second] == [f"m{n}" for n in range(20)]


async def test_cancel_ends_the_read_and_the_call_and_releases_the_receipts() -> None:
    """F7: our cancel() resets the call, and the gateway releases what it held at once."""
    async with _feed() as (gw, client):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(5)])
        stream = client.subscribe(window=100)
        await _read(stream, 5)
        waiting = asyncio.create_task(stream.read())
        await asyncio.sleep(0.1)
        stream.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert stream.cancelled_by_us
        await wait_until(lambda: gw.stats(LOGIN)["queued"] == 5)
        await wait_until(lambda: gw.stats(LOGIN)["streams"] == 0)


async def test_a_cut_stream_gives_its_receipts_then_a_feed_error() -> None:
    async with _feed() as (gw, client):
        gw.faults.cut_stream_every = 20
        await gw.inject(LOGIN, [receipt_body(n) for n in range(30)])
        stream = client.subscribe(window=100)
        received = [r for group in await _read(stream, 20) for r in group]
        with pytest.raises(FeedUnavailableError):
            await stream.read()
        await wait_until(lambda: gw.stats(LOGIN)["streams"] == 0)
    assert [r.message_id for r in received] == [f"m{n}" for n in range(20)]


async def test_a_refused_login_is_an_authentication_error() -> None:
    async with _feed(password="wrong") as (_gw, client):
        stream = client.subscribe(window=10)
        with pytest.raises(AuthenticationError):
            await stream.read()


@pytest.mark.parametrize(
    ("code", "details", "error"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "queue paused", FatalError),
        (grpc.StatusCode.UNIMPLEMENTED, "", FeedUnimplementedError),
        (grpc.StatusCode.UNAUTHENTICATED, "", AuthenticationError),
        (grpc.StatusCode.INTERNAL, "stream broke", FeedUnavailableError),
        (grpc.StatusCode.CANCELLED, "server shutting down", FeedUnavailableError),
        # A proxy's word about its own TLS hop to the gateway: retried, not our handshake.
        (
            grpc.StatusCode.UNAVAILABLE,
            "upstream connect error: TLS error: CERTIFICATE_VERIFY_FAILED",
            FeedUnavailableError,
        ),
    ],
)
async def test_each_status_a_stream_ends_with_is_the_projects_error(
    code: grpc.StatusCode, details: str, error: type[Exception]
) -> None:
    """What arrived before the ending is read first; then the status, translated."""
    sent = feed_pb2.Receipt(id="m0", level=2, stat="DELIVRD", ack_token="t0")

    async def subscribe(
        _request: feed_pb2.SubscribeRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[feed_pb2.Receipt]:
        yield sent
        await context.abort(code, details)

    handler = grpc.method_handlers_generic_handler(
        "gateway.receipts.v1.ReceiptFeed",
        {
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                subscribe,
                request_deserializer=feed_pb2.SubscribeRequest.FromString,
                response_serializer=feed_pb2.Receipt.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}", None)
    stream_channel = open_stream_channel(f"127.0.0.1:{port}", None)
    try:
        client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
        stream = client.subscribe(window=10)
        first = await stream.read()
        with pytest.raises(error) as caught:
            await stream.read()
    finally:
        stream_channel.close()
        await channel.close(grace=None)
        await server.stop(None)
    assert [r.message_id for r in first or []] == ["m0"]
    assert not isinstance(caught.value, FeedTlsError)
    assert PASSWORD not in str(caught.value)


async def test_a_gateway_that_never_answers_the_handshake_fails_the_stream_in_time() -> None:
    """A black-holed or wedged gateway (TCP accepted, no HTTP/2 SETTINGS) is a transient error
    the reader retries after grpcio's connect timeout, not a stream that waits for ever."""
    accepted: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    silent = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    channel = open_channel(f"127.0.0.1:{port}", None)
    stream_channel = open_stream_channel(f"127.0.0.1:{port}", None)
    try:
        client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
        stream = client.subscribe(window=10)
        with pytest.raises(FeedUnavailableError, match="SETTINGS"):
            await asyncio.wait_for(stream.read(), 60)
    finally:
        stream_channel.close()
        await channel.close(grace=None)
        # Stop accepting first: grpcio may still be reconnecting, and a connection accepted
        # after its writer was closed would leak its transport into a later test.
        silent.close()
        await asyncio.sleep(0.1)
        for writer in accepted:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await silent.wait_closed()
    assert accepted


async def test_a_client_without_a_stream_channel_cannot_subscribe() -> None:
    async with FakeGateway(LOGINS).running() as gw:
        channel = open_channel(gw.target, None)
        try:
            with pytest.raises(TypeError, match="stream_channel"):
                FeedClient(channel, LOGIN, PASSWORD).subscribe(window=10)
        finally:
            await channel.close(grace=None)
