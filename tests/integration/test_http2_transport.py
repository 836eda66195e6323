"""The Subscribe transport (dlrfeed.feed.http2) against a scripted HTTP/2 server on loopback.

fakegw's gRPC server only ever sends well-formed, one-message-per-frame streams; these
scenarios send what a protocol allows and a real gateway (or a proxy in front of it) may do
instead — split and padded frames, CONTINUATION, trailers-only answers, resets, GOAWAY, pings,
silence — and what it forbids, and check what the reader gets: the same receipts, or the
project's error for the ending.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc.aio
import hpack
import pytest

from dlrfeed.errors import FatalError, FeedUnavailableError
from dlrfeed.feed.client import FeedClient, FeedUnimplementedError
from dlrfeed.feed.http2 import STREAM_WINDOW, StreamChannel
from gateway.receipts.v1 import feed_pb2
from support.fakegw_support import receipt_body
from support.http2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    message,
)

RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def receipt(n: int) -> bytes:
    return feed_pb2.Receipt(**receipt_body(n), ack_token=f"t{n}").SerializeToString()


@dataclass
class Peer:
    """The server's side of one accepted connection: frames to send, frames received."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)

    async def next_frame(self) -> tuple[int, int, int, bytes]:
        high, low, kind, flags, stream_id = struct.unpack(
            ">BHBBL", await self.reader.readexactly(9)
        )
        return kind, flags, stream_id, await self.reader.readexactly(high << 16 | low)

    async def expect(self, kind: int, *, skip: tuple[int, ...] = ()) -> tuple[int, int, bytes]:
        """The next frame of `kind` (flags, stream, payload), skipping those listed in `skip`."""
        while True:
            got, flags, stream_id, payload = await self.next_frame()
            if got == kind:
                return flags, stream_id, payload
            assert got in skip, f"expected frame type {kind}, got {got}"

    async def accept_call(self, settings: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """Read the preface, send SETTINGS, and take one call: its stream, headers and body."""
        assert await self.reader.readexactly(24) == b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        self.send(frame(SETTINGS, 0, 0, settings))
        headers: dict[str, str] = {}
        body = b""
        while True:
            kind, flags, stream_id, payload = await self.next_frame()
            if kind == HEADERS:
                headers = {str(k): str(v) for k, v in self.decoder.decode(payload)}
            elif kind == DATA:
                body += payload
                if flags & END_STREAM:
                    return stream_id, headers, body

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    def headers(self, stream_id: int, headers: list[tuple[str, str]], flags: int) -> bytes:
        return frame(HEADERS, flags | END_HEADERS, stream_id, self.encoder.encode(headers))

    def trailers(self, stream_id: int, status: int, text: str = "") -> bytes:
        fields = [("grpc-status", str(status))] + ([("grpc-message", text)] if text else [])
        return self.headers(stream_id, fields, END_STREAM)


Script = Callable[[Peer], Awaitable[None]]


@asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[tuple[StreamChannel, list[Peer]]]:
    """A loopback server running `script` on each connection, and a channel to it."""
    peers: list[Peer] = []
    done: list[asyncio.Task[None]] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        peers.append(peer)
        task = asyncio.current_task()
        assert task is not None
        done.append(task)
        try:
            await script(peer)
            await reader.read()  # hold the connection until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = StreamChannel(
        "127.0.0.1",
        port,
        ssl_context=None,
        server_name=None,
        keepalive_seconds=300.0,
        keepalive_timeout=20.0,
    )
    try:
        yield channel, peers
    finally:
        channel.close()
        server.close()
        await asyncio.wait(done, timeout=5)


def client(channel: StreamChannel) -> FeedClient:
    # Pull and Ack go elsewhere (grpcio); this channel is never dialled.
    unused = grpc.aio.insecure_channel("127.0.0.1:9")
    return FeedClient(unused, "acme", "secret", stream_channel=channel)


async def read_into(channel: StreamChannel, ids: list[str]) -> None:
    """Subscribe and append each receipt's message id to `ids` until the stream ends."""
    stream = client(channel).subscribe(window=100)
    while (receipts := await asyncio.wait_for(stream.read(), 10)) is not None:
        ids += [r.message_id for r in receipts]


async def read_all(channel: StreamChannel) -> list[str]:
    ids: list[str] = []
    await read_into(channel, ids)
    return ids


async def test_split_padded_and_continued_frames_give_the_same_receipts() -> None:
    seen: dict[str, object] = {}

    async def script(peer: Peer) -> None:
        stream_id, headers, body = await peer.accept_call()
        seen.update(headers=headers, body=body)
        first, second, third = message(receipt(0)), message(receipt(1)), message(receipt(2))
        trailer_block = peer.encoder.encode([("grpc-status", "0")])
        peer.send(
            peer.headers(stream_id, RESPONSE_HEADERS, 0),
            frame(DATA, 0, stream_id, first[:3]),  # a message split inside its prefix
            frame(DATA, 0, stream_id, first[3:] + second[:40]),
            frame(DATA, PADDED, stream_id, bytes([7]) + second[40:] + third + bytes(7)),
            frame(HEADERS, END_STREAM, stream_id, trailer_block[:1]),
            frame(CONTINUATION, END_HEADERS, stream_id, trailer_block[1:]),
        )

    async with scripted_server(script) as (channel, _):
        assert await read_all(channel) == ["m0", "m1", "m2"]
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert headers[":path"] == "/gateway.receipts.v1.ReceiptFeed/Subscribe"
    assert headers["te"] == "trailers"
    assert headers["authorization"].startswith("Basic ")
    assert seen["body"] == message(feed_pb2.SubscribeRequest(window=100).SerializeToString())


@pytest.mark.parametrize(
    ("ending", "error", "text"),
    [
        ("status 9", FatalError, "FAILED_PRECONDITION: queue paused"),
        ("trailers only 12", FeedUnimplementedError, "does not implement Subscribe"),
        ("http 503", FeedUnavailableError, "HTTP status 503"),
        ("proxy tls 14", FeedUnavailableError, "TLS error"),  # a proxy's hop, not ours
        ("short reset", FeedUnavailableError, "malformed RST_STREAM"),
        ("reset", FeedUnavailableError, "reset the call"),
        ("goaway", FeedUnavailableError, "going away"),
        ("compressed", FeedUnavailableError, "compressed message"),
        ("no trailers", FeedUnavailableError, "without trailers"),
        ("oversized frame", FeedUnavailableError, "protocol error"),
        ("closed", FeedUnavailableError, "closed the connection"),
    ],
)
async def test_each_way_a_call_can_end_is_the_projects_error(
    ending: str, error: type[Exception], text: str
) -> None:
    async def script(peer: Peer) -> None:
        stream_id, _, _ = await peer.accept_call()
        one = frame(DATA, 0, stream_id, message(receipt(0)))

        def start() -> bytes:  # encoded when sent: the header table must see what is sent only
            return peer.headers(stream_id, RESPONSE_HEADERS, 0)

        match ending:
            case "status 9":
                peer.send(start(), one, peer.trailers(stream_id, 9, "queue%20paused"))
            case "trailers only 12":
                peer.send(peer.headers(stream_id, [*RESPONSE_HEADERS, ("grpc-status", "12")], 1))
            case "http 503":
                peer.send(peer.headers(stream_id, [(":status", "503")], END_STREAM))
            case "proxy tls 14":
                text = "upstream connect error: TLS error: CERTIFICATE_VERIFY_FAILED"
                peer.send(start(), peer.trailers(stream_id, 14, text.replace(" ", "%20")))
            case "short reset":
                peer.send(start(), frame(RST_STREAM, 0, stream_id, b"\x00\x00"))
            case "reset":
                peer.send(start(), one, frame(RST_STREAM, 0, stream_id, struct.pack(">L", 2)))
            case "goaway":
                peer.send(start(), one, frame(GOAWAY, 0, 0, struct.pack(">LL", 0, 0)))
            case "compressed":
                peer.send(start(), frame(DATA, 0, stream_id, message(receipt(0), compressed=1)))
            case "no trailers":
                peer.send(start(), one, frame(DATA, END_STREAM, stream_id, b""))
            case "oversized frame":
                peer.send(start(), frame(DATA, 0, stream_id, message(bytes(20_000))))
            case "closed":
                peer.send(start(), one)
                await peer.writer.drain()
                peer.writer.close()

    async with scripted_server(script) as (channel, _):
        received: list[str] = []
        with pytest.raises(error) as caught:
            await read_into(channel, received)
    assert text in str(caught.value)
    # What arrived before the ending is read first, never dropped with it.
    if ending in ("status 9", "reset", "goaway", "no trailers", "closed"):
        assert received == ["m0"]


async def test_settings_and_pings_are_answered_and_windows_are_credited() -> None:
    big = receipt(0)
    count = STREAM_WINDOW // 4 // len(message(big)) + 10  # past the point where room is given back
    checks: dict[str, object] = {}
    read_them = asyncio.Event()

    async def script(peer: Peer) -> None:
        stream_id, _, _ = await peer.accept_call()
        peer.send(
            frame(SETTINGS, 0, 0, struct.pack(">HL", 1, 0)),  # no header table, as a peer may say
            frame(PING, 0, 0, b"12345678"),
            peer.headers(stream_id, RESPONSE_HEADERS, 0),
        )
        flags, _, _ = await peer.expect(SETTINGS, skip=(WINDOW_UPDATE,))
        checks["settings acked"] = flags == ACK
        flags, _, payload = await peer.expect(PING, skip=(SETTINGS, WINDOW_UPDATE))
        checks["ping answered"] = (flags, payload) == (ACK, b"12345678")
        for _ in range(count):
            peer.send(frame(DATA, 0, stream_id, message(big)))
        await read_them.wait()
        _, credited_stream, payload = await peer.expect(WINDOW_UPDATE, skip=(SETTINGS, PING))
        while credited_stream != stream_id:
            _, credited_stream, payload = await peer.expect(WINDOW_UPDATE)
        checks["credited"] = struct.unpack(">L", payload)[0]
        peer.send(peer.trailers(stream_id, 0))

    async with scripted_server(script) as (channel, _):
        stream = client(channel).subscribe(window=10)
        got = 0
        while got < count:
            receipts = await asyncio.wait_for(stream.read(), 10)
            assert receipts is not None
            got += len(receipts)
        read_them.set()
        assert await asyncio.wait_for(stream.read(), 10) is None
    assert checks["settings acked"]
    assert checks["ping answered"]
    assert isinstance(checks["credited"], int)
    assert STREAM_WINDOW // 4 <= checks["credited"] <= count * len(message(big))


async def test_cancel_resets_the_call_and_goaway_moves_new_calls_to_a_new_connection() -> None:
    resets: list[int] = []

    async def script(peer: Peer) -> None:
        stream_id, _, _ = await peer.accept_call()
        peer.send(peer.headers(stream_id, RESPONSE_HEADERS, 0))
        _, reset_stream, payload = await peer.expect(RST_STREAM, skip=(SETTINGS, WINDOW_UPDATE))
        resets.append(struct.unpack(">L", payload)[0])
        peer.send(frame(GOAWAY, 0, 0, struct.pack(">LL", reset_stream, 0)))

    async with scripted_server(script) as (channel, peers):
        first = client(channel).subscribe(window=10)
        await asyncio.sleep(0.2)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first.read()
        await asyncio.sleep(0.2)  # the GOAWAY arrives
        second = client(channel).subscribe(window=10)
        await asyncio.sleep(0.2)
        second.cancel()
        await asyncio.sleep(0.2)
        assert len(peers) == 2
    assert resets == [8, 8]  # CANCEL: the gateway releases the stream's receipts (F7)


async def test_a_connection_that_stops_answering_pings_fails_its_calls() -> None:
    async def script(peer: Peer) -> None:
        stream_id, _, _ = await peer.accept_call()
        peer.send(peer.headers(stream_id, RESPONSE_HEADERS, 0))
        await peer.reader.read()  # alive on the socket, silent on the protocol

    async with scripted_server(script) as (channel, _):
        silent = StreamChannel(
            "127.0.0.1",
            channel._port,
            ssl_context=None,
            server_name=None,
            keepalive_seconds=0.2,
            keepalive_timeout=0.2,
        )
        stream = client(silent).subscribe(window=10)
        with pytest.raises(FeedUnavailableError, match="keepalive"):
            await asyncio.wait_for(stream.read(), 10)
        silent.close()


async def test_calls_beyond_the_servers_stream_limit_go_on_another_connection() -> None:
    """A gateway allowing one stream per connection still gets both of a process's streams:
    the second opens a connection of its own instead of being refused again and again."""

    async def script(peer: Peer) -> None:
        stream_id, _, _ = await peer.accept_call(settings=struct.pack(">HL", 3, 1))
        peer.send(
            peer.headers(stream_id, RESPONSE_HEADERS, 0),
            frame(DATA, 0, stream_id, message(receipt(len(peers)))),
        )

    async with scripted_server(script) as (channel, peers):
        first = client(channel).subscribe(window=10)
        first_receipts = await asyncio.wait_for(first.read(), 10)
        second = client(channel).subscribe(window=10)
        second_receipts = await asyncio.wait_for(second.read(), 10)
        assert len(peers) == 2
        first.cancel()
        second.cancel()
    assert first_receipts is not None
    assert second_receipts is not None
    assert [r.message_id for r in first_receipts + second_receipts] == ["m1", "m2"]


async def test_a_gateway_that_never_answers_the_handshake_fails_the_call_in_time() -> None:
    """Connecting (TCP and TLS) has the keepalive timeout too: a black-holed or wedged gateway
    is a transient error the reader retries, not a stream that waits for minutes."""

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = StreamChannel(
        "127.0.0.1", port, ssl_context=ssl.create_default_context(), server_name=None,
        keepalive_seconds=300.0, keepalive_timeout=0.3,
    )  # fmt: skip
    try:
        stream = client(channel).subscribe(window=10)
        with pytest.raises(FeedUnavailableError, match=r"no connection to 127\.0\.0\.1"):
            await asyncio.wait_for(stream.read(), 10)
    finally:
        channel.close()
        server.close()
