"""HTTP/2 frames and gRPC messages as bytes, for tests that play the server's side of the
Subscribe transport (dlrfeed.feed.http2) byte by byte."""

from __future__ import annotations

import struct

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0,
    1,
    3,
    4,
    6,
    7,
    8,
    9,
)
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
FRAME_HEADER = struct.Struct(">BHBBL")  # 24-bit length as 8 + 16 bits, type, flags, stream id


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def message(body: bytes, compressed: int = 0) -> bytes:
    """One gRPC length-prefixed message."""
    return struct.pack(">BL", compressed, len(body)) + body


def frames_in(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """Every whole frame in `data`: (type, flags, stream id, payload)."""
    frames = []
    offset = 0
    while offset + 9 <= len(data):
        high, low, kind, flags, stream_id = FRAME_HEADER.unpack_from(data, offset)
        end = offset + 9 + (high << 16 | low)
        frames.append((kind, flags, stream_id, data[offset + 9 : end]))
        offset = end
    return frames
