"""The Subscribe transport's frame reader (dlrfeed.feed.http2.Connection) against arbitrary
segmentation: however TCP cuts the server's bytes and however the server cuts its messages
into DATA frames (padded or not), the call gets the same messages, in order, and ends cleanly;
SETTINGS and PING are answered whatever segment they straddle."""

from __future__ import annotations

import asyncio
import struct
from itertools import cycle

import hpack
from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.feed.http2 import STREAM_WINDOW, Connection, StreamCall
from support.http2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    PING,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    frames_in,
    message,
)

STREAM = 1  # a connection's first call


class RecordingTransport:
    """The asyncio transport surface the connection uses, keeping what it writes."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def server_bytes(bodies: list[bytes], frame_sizes: list[int], padding: int) -> bytes:
    """What a server sends for one call: settings, a ping, headers, the messages cut into
    DATA frames of `frame_sizes` (cycled; padded by `padding` bytes when non-zero), and
    trailers split over HEADERS and CONTINUATION."""
    encoder = hpack.Encoder()
    stream = b"".join(message(body) for body in bodies)
    frames = [
        frame(SETTINGS, 0, 0, struct.pack(">HL", 1, 4096)),
        frame(PING, 0, 0, b"pingpong"),
        frame(HEADERS, END_HEADERS, STREAM, encoder.encode([(":status", "200")])),
    ]
    sizes = cycle(frame_sizes)
    offset = 0
    while offset < len(stream):
        size = next(sizes)
        chunk = stream[offset : offset + size]
        offset += size
        if padding:
            frames.append(frame(DATA, PADDED, STREAM, bytes([padding]) + chunk + bytes(padding)))
        else:
            frames.append(frame(DATA, 0, STREAM, chunk))
    trailers = encoder.encode([("grpc-status", "0")])
    frames.append(frame(HEADERS, END_STREAM, STREAM, trailers[:1]))
    frames.append(frame(CONTINUATION, END_HEADERS, STREAM, trailers[1:]))
    return b"".join(frames)


def connected() -> tuple[Connection, RecordingTransport]:
    connection = Connection("http", "gateway:443", 300.0, 20.0)
    transport = RecordingTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def open_call(connection: Connection) -> StreamCall:
    call = StreamCall()
    connection.start(call, "/svc/Subscribe", b"\x08\x01", [("authorization", "Basic eDp5")])
    return call


async def receive(data: bytes, cuts: list[int]) -> tuple[StreamCall, bytes]:
    """Feed `data` to a connection with one open call, cut at `cuts`; the call and what the
    connection wrote."""
    connection, transport = connected()
    call = open_call(connection)
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        if start < cut <= len(data):
            connection.data_received(data[start:cut])
            start = cut
    connection.connection_lost(None)
    return call, bytes(transport.written)


@given(
    bodies=st.lists(st.binary(max_size=40_000), min_size=1, max_size=6),
    frame_sizes=st.lists(st.integers(1, 16_384 - 256), min_size=1, max_size=5),
    padding=st.sampled_from([0, 0, 1, 255]),
    cuts=st.lists(st.integers(0, 300_000), max_size=40),
)
def test_any_segmentation_gives_the_same_messages_and_answers(
    bodies: list[bytes], frame_sizes: list[int], padding: int, cuts: list[int]
) -> None:
    data = server_bytes(bodies, frame_sizes, padding)
    call, written = asyncio.run(receive(data, cuts))
    assert list(call.take()) == bodies
    assert call.ended
    assert call.error is None
    sent = frames_in(written[24:])  # after the connection preface
    assert (SETTINGS, ACK, 0, b"") in sent
    assert (PING, ACK, 0, b"pingpong") in sent
    request = [f for f in sent if f[0] == DATA and f[2] == STREAM]
    assert request == [(DATA, END_STREAM, STREAM, message(b"\x08\x01"))]


async def test_a_smaller_header_table_announced_twice_still_reaches_the_next_request() -> None:
    """RFC 7541 §4.2: after the server shrinks the table, our next header block must start
    with the size update, however many times the SETTINGS said it."""
    connection, transport = connected()
    shrink = frame(SETTINGS, 0, 0, struct.pack(">HL", 1, 0))
    connection.data_received(shrink + shrink)
    transport.written.clear()
    open_call(connection)
    headers = [f for f in frames_in(bytes(transport.written)) if f[0] == HEADERS]
    assert headers[0][3][0] == 0x20  # "dynamic table size update" to 0


async def test_a_large_message_is_credited_only_while_no_whole_one_waits() -> None:
    """A message larger than the window gets its room back as it arrives, or it could never
    finish; but not while whole messages wait for the reader, or a stalled reader's queue
    would grow without bound."""
    connection, transport = connected()
    call = open_call(connection)
    response = hpack.Encoder().encode([(":status", "200")])
    connection.data_received(frame(HEADERS, END_HEADERS, STREAM, response))
    big = message(bytes(STREAM_WINDOW // 2))
    waiting = message(b"first")
    transport.written.clear()
    for start in range(0, len(waiting) + STREAM_WINDOW // 4 + 10, 16_000):
        chunk = (waiting + big)[start : start + 16_000]
        connection.data_received(frame(DATA, 0, STREAM, chunk))
    credits = [f for f in frames_in(bytes(transport.written)) if f[0] == WINDOW_UPDATE]
    assert not [f for f in credits if f[2] == STREAM]
    assert list(call.take()) == [b"first"]  # the reader takes it: the room goes back
    credits = [f for f in frames_in(bytes(transport.written)) if f[0] == WINDOW_UPDATE]
    assert [f[2] for f in credits] == [STREAM]
    connection.connection_lost(None)
