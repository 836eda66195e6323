"""Server-streaming gRPC calls over HTTP/2, read on the event loop: the Subscribe transport.

A Subscribe stream carries one receipt per gRPC message, and a gRPC server writes each message
in an HTTP/2 DATA frame of its own, so whatever the client pays per frame it pays per receipt.
A general HTTP/2 library pays a state machine, an event object and a stream-buffer hop per
frame; this module pays a header unpack and a slice. It is deliberately small: the client side
of server-streaming calls only (a request of a few bytes, then messages until the trailers),
and it leaves header compression to `hpack`.

What it does, per RFC 9113 and the gRPC HTTP/2 protocol:
- one connection shared by every call (odd stream ids), opened at the first call and again
  after it is lost, after the server sent GOAWAY, or when it carries as many calls as the
  server's SETTINGS_MAX_CONCURRENT_STREAMS allows (an older one closes after its last call);
- flow control: a 4 MiB window per stream, credited as the reader takes messages, so a reader
  that stops reading stops the server and holds no more than that per stream (a single message
  larger than the window is credited as it arrives: it can only be read whole);
- SETTINGS acknowledged, PING answered, a keepalive PING while calls are open (a silent dead
  connection fails its calls instead of hanging them);
- a call ends by its trailers (`grpc-status`), by RST_STREAM, by GOAWAY, or by the connection's
  loss; `cancel()` sends RST_STREAM(CANCEL), which is how the gateway learns a stream ended (F7).
Anything else the server sends that the protocol forbids closes the connection with GOAWAY and
fails its calls as a transient error: the reader reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections import deque
from collections.abc import Sequence
from typing import cast
from urllib.parse import unquote

import hpack

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (RFC 9113 §6) and flags.
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE = 0x0, 0x1, 0x3, 0x4, 0x5
_PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0x6, 0x7, 0x8, 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_SETTINGS_HEADER_TABLE_SIZE, _SETTINGS_ENABLE_PUSH, _SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
_SETTINGS_INITIAL_WINDOW_SIZE = 0x4
_NO_ERROR, _PROTOCOL_ERROR, _FRAME_SIZE_ERROR, _CANCEL, _COMPRESSION_ERROR = 0, 1, 6, 8, 9

_FRAME_HEADER = struct.Struct(">BHBBL")  # 24-bit length as 8 + 16 bits, type, flags, stream id
_MESSAGE_PREFIX = struct.Struct(">BL")  # gRPC: compressed flag, length
_MAX_FRAME_SIZE = 16_384  # the default; not raised, so the server never sends larger frames
_DEFAULT_WINDOW = 65_535
STREAM_WINDOW = 4 * 1024 * 1024
"""Bytes a call's server may send ahead of the reader: large, so that the server never waits
for a window update on a healthy reader, bounded, so that a stalled one holds no more."""
_CONNECTION_WINDOW = 4 * STREAM_WINDOW
_MAX_STREAM_ID = 2**31 - 1

# The gRPC status of an HTTP response that is not gRPC (the gRPC HTTP/2 spec's mapping).
_HTTP_STATUS_CODES = {"400": 13, "401": 16, "403": 7, "404": 12, "429": 14, "502": 14, "503": 14}
_UNKNOWN, _INTERNAL = 2, 13


class GrpcStatus(Exception):  # noqa: N818 - a call's outcome as the server stated it
    """A call ended with a non-zero gRPC status (`code` is its number), or an HTTP status that
    maps to one."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"gRPC status {code}: {message}")
        self.code = code
        self.message = message


class ConnectionFailed(Exception):  # noqa: N818 - a transport outcome, not a fault of ours
    """The connection under a call was lost, refused, reset or broke the protocol."""


class StreamCall:
    """One server-streaming call: `arrived` holds the messages not taken yet, `wakeup` is set
    when some arrive or the call ends; `ended` and `error` say how it ended."""

    def __init__(self) -> None:
        self.arrived: deque[bytes] = deque()
        self.wakeup = asyncio.Event()
        self.ended = False
        self.error: BaseException | None = None
        self._connection: Connection | None = None
        self._stream_id = 0
        self._partial = bytearray()  # the start of a message whose end has not arrived
        self._got_headers = False
        self._uncredited = 0  # bytes received, not yet returned to the server's window
        self._starting: asyncio.Task[None] | None = None  # connecting, then sending the request

    def take(self) -> deque[bytes]:
        """Every message that has arrived, oldest first; their room goes back to the server."""
        arrived = self.arrived
        self.arrived = deque()
        connection = self._connection
        if self._uncredited >= STREAM_WINDOW // 4 and connection is not None and not self.ended:
            connection.credit(self._stream_id, self._uncredited)
            self._uncredited = 0
        return arrived

    def cancel(self) -> None:
        """End the call: RST_STREAM(CANCEL) when it is open; what arrives after is dropped."""
        if self._starting is not None:
            self._starting.cancel()
        if not self.ended and self._connection is not None:
            self._connection.reset(self._stream_id)
        self._end(None)

    # -- called by the connection ---------------------------------------------------------
    def _opened(self, connection: Connection, stream_id: int) -> None:
        self._connection = connection
        self._stream_id = stream_id

    def _data(self, data: bytes, start: int, end: int, flow_controlled: int) -> None:
        self._uncredited += flow_controlled
        if self._partial:
            partial = self._partial
            partial += memoryview(data)[start:end]
            if len(partial) < 5 or len(partial) < 5 + _MESSAGE_PREFIX.unpack_from(partial)[1]:
                self._credit_large(partial)
                return  # appended in place: a large message costs its size once, not per frame
            data, start, end = bytes(partial), 0, len(partial)
            self._partial = bytearray()
        arrived = self.arrived
        before = len(arrived)
        while end - start >= 5:
            compressed, length = _MESSAGE_PREFIX.unpack_from(data, start)
            if start + 5 + length > end:
                break
            if compressed:
                # No grpc-accept-encoding was sent: a compressed message breaks the protocol.
                self._fail(GrpcStatus(_INTERNAL, "a compressed message, no encoding was agreed"))
                return
            arrived.append(data[start + 5 : start + 5 + length])
            start += 5 + length
        if start < end:
            self._partial = bytearray(memoryview(data)[start:end])
            self._credit_large(self._partial)
        if len(arrived) > before:
            self.wakeup.set()

    def _credit_large(self, partial: bytearray) -> None:
        """A message this large can only be read whole: its room goes back as it arrives, or
        one larger than the window would never finish arriving."""
        # Only while no whole message waits: those are the reader's to take (and credit), and
        # crediting past them would let a stalled reader's queue grow without bound.
        if (
            len(partial) >= STREAM_WINDOW // 4
            and not self.arrived
            and self._uncredited
            and self._connection is not None
        ):
            self._connection.credit(self._stream_id, self._uncredited)
            self._uncredited = 0

    def _headers(self, headers: dict[str, str], end_stream: bool) -> None:
        if not self._got_headers:
            self._got_headers = True
            status = headers.get(":status", "")
            if status != "200":
                code = _HTTP_STATUS_CODES.get(status, _UNKNOWN)
                self._finish(GrpcStatus(code, f"HTTP status {status or 'missing'}"), end_stream)
                return
            if not end_stream:
                return
        elif not end_stream:
            self._fail(ConnectionFailed("headers after the response headers did not end the call"))
            return
        # Trailers, or a trailers-only response: the call's status.
        # The server's END_STREAM closed the stream: the call ends, nothing is reset.
        try:
            code = int(headers.get("grpc-status", ""))
        except ValueError:
            self._end(GrpcStatus(_UNKNOWN, "the call ended without a grpc-status"))
            return
        if self._partial:
            self._end(GrpcStatus(_INTERNAL, "the call ended inside a message"))
        elif code:
            self._end(GrpcStatus(code, unquote(headers.get("grpc-message", ""))))
        else:
            self._end(None)

    def _finish(self, error: BaseException, end_stream: bool) -> None:
        """End with `error`: a stream the server has not closed is reset first."""
        if end_stream:
            self._end(error)
        else:
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        if self._connection is not None and not self.ended:
            self._connection.reset(self._stream_id)
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.error = error
        if self._connection is not None:
            self._connection.forget(self._stream_id)
        self.wakeup.set()


class StreamChannel:
    """The HTTP/2 connection every call of a process shares, (re)opened when a call needs it."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        server_name: str | None,
        keepalive_seconds: float,
        keepalive_timeout: float,
    ) -> None:
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._server_name = server_name
        self._keepalive = (keepalive_seconds, keepalive_timeout)
        self._connection: Connection | None = None  # the one new calls go to
        self._draining: list[Connection] = []  # older ones, open while their calls last
        self._connecting = asyncio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self, path: str, request: bytes, metadata: Sequence[tuple[str, str]]) -> StreamCall:
        """Start a server-streaming call of `path` with one request message."""
        call = StreamCall()
        call._starting = asyncio.create_task(self._start(call, path, request, metadata))
        return call

    def close(self) -> None:
        """Close the connection; open calls end as lost connections."""
        self._closed = True
        for connection in [*self._draining, self._connection]:
            if connection is not None:
                connection.close()

    async def _start(
        self, call: StreamCall, path: str, request: bytes, metadata: Sequence[tuple[str, str]]
    ) -> None:
        try:
            connection = await self._usable_connection()
            connection.start(call, path, request, metadata)
        except Exception as exc:  # noqa: BLE001 - refused, TLS, closed: the call's outcome
            call._end(exc)

    async def _usable_connection(self) -> Connection:
        async with self._connecting:
            if self._closed:
                raise ConnectionFailed("the channel is closed")
            if self._connection is None or not self._connection.accepts_calls:
                if self._connection is not None:
                    self._connection.retire()
                    self._draining.append(self._connection)
                self._draining = [c for c in self._draining if c.is_open]
                loop = asyncio.get_running_loop()
                keepalive, timeout = self._keepalive
                scheme = "https" if self._ssl is not None else "http"
                host = f"[{self._host}]" if ":" in self._host else self._host  # IPv6
                authority = f"{host}:{self._port}"
                # A gateway address that drops packets fails in `timeout` seconds, as a silent
                # connection does, not after the system's minutes of SYN retries.
                try:
                    async with asyncio.timeout(timeout):
                        _, connection = await loop.create_connection(
                            lambda: Connection(scheme, authority, keepalive, timeout),
                            self._host,
                            self._port,
                            ssl=self._ssl,
                            server_hostname=(self._server_name or self._host)
                            if self._ssl
                            else None,
                        )
                except TimeoutError:
                    raise ConnectionFailed(
                        f"no connection to {authority} within {timeout:g} s"
                    ) from None
                connection.check_alpn()
                if self.closed:  # closed while this connection was being opened
                    connection.close()
                    raise ConnectionFailed("the channel is closed")
                self._connection = connection
            return self._connection


class Connection(asyncio.Protocol):
    """One HTTP/2 client connection: frames in, calls' messages and endings out."""

    def __init__(
        self, scheme: str, authority: str, keepalive: float, keepalive_timeout: float
    ) -> None:
        self._scheme = scheme
        self._authority = authority
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, StreamCall] = {}
        self._next_stream_id = 1
        self._inbox = b""
        self._encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self._header_block: tuple[int, int, bytearray] | None = None  # stream, flags, fragments
        self._going_away = False
        self._retired = False  # the channel opened a newer one: close once the last call ends
        self._max_calls = _MAX_STREAM_ID  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        self._lost = False
        self._uncredited = 0
        self._keepalive = (keepalive, keepalive_timeout)
        self._pong = asyncio.Event()
        self._keepalive_task: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return not self._lost

    @property
    def accepts_calls(self) -> bool:
        return not (
            self._lost
            or self._going_away
            or self._next_stream_id > _MAX_STREAM_ID
            or self._retired
            or len(self._calls) >= self._max_calls  # a server's limit: more go on another
        )

    def retire(self) -> None:
        """New calls go elsewhere now; close once the calls in progress have ended."""
        self._retired = True
        if not self._calls:
            self.close()

    def check_alpn(self) -> None:
        assert self._transport is not None
        tls = self._transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() != "h2":
            self.close()
            raise ssl.SSLError("the gateway did not agree to HTTP/2 (ALPN h2) over TLS")

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self._transport = cast(asyncio.Transport, transport)
        settings = struct.pack(
            ">HLHL", _SETTINGS_ENABLE_PUSH, 0, _SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW
        )
        self._transport.write(
            _PREFACE
            + _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, struct.pack(">L", _CONNECTION_WINDOW - _DEFAULT_WINDOW))
        )
        self._keepalive_task = asyncio.get_running_loop().create_task(self._keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        reason = f"the connection was lost: {exc}" if exc else "the gateway closed the connection"
        self._end_calls(reason)

    def data_received(self, data: bytes) -> None:
        if self._inbox:
            data = self._inbox + data
        try:
            parsed = self._on_frames(data)
        except _ProtocolError as exc:
            self._abort(exc.error_code, f"HTTP/2 protocol error from the gateway: {exc}")
            return
        self._inbox = data[parsed:]

    # -- frames in ------------------------------------------------------------------------
    def _on_frames(self, data: bytes) -> int:
        """Handle every whole frame in `data`; returns where the first incomplete one starts."""
        offset, size = 0, len(data)
        while size - offset >= 9:
            high, low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(data, offset)
            length = high << 16 | low
            if length > _MAX_FRAME_SIZE:
                raise _ProtocolError(_FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            end = offset + 9 + length
            if end > size:
                break
            stream_id &= _MAX_STREAM_ID
            if self._header_block is not None and kind != _CONTINUATION:
                raise _ProtocolError(_PROTOCOL_ERROR, "a header block was interrupted")
            if kind == _DATA:
                self._on_data(data, offset + 9, end, flags, stream_id)
            else:
                self._on_frame(kind, flags, stream_id, data[offset + 9 : end])
            offset = end
        return offset

    def _on_data(self, data: bytes, start: int, end: int, flags: int, stream_id: int) -> None:
        if stream_id == 0:
            raise _ProtocolError(_PROTOCOL_ERROR, "DATA on stream 0")
        flow_controlled = end - start
        if flags & _PADDED:
            if flow_controlled == 0 or data[start] >= flow_controlled:
                raise _ProtocolError(_PROTOCOL_ERROR, "invalid padding")
            end -= data[start]
            start += 1
        self._uncredited += flow_controlled
        if self._uncredited >= _CONNECTION_WINDOW // 4:
            # The connection's room comes back at once: each call's own window bounds what
            # its reader holds.
            self._write(_frame(_WINDOW_UPDATE, 0, 0, struct.pack(">L", self._uncredited)))
            self._uncredited = 0
        call = self._calls.get(stream_id)
        if call is None:
            return  # a call we reset or that ended: its data counted for the connection only
        call._data(data, start, end, flow_controlled)
        if flags & _END_STREAM and not call.ended:
            call._end(GrpcStatus(_INTERNAL, "the call ended without trailers"))

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == _HEADERS:
            if flags & _PADDED:
                if not payload or payload[0] >= len(payload):
                    raise _ProtocolError(_PROTOCOL_ERROR, "invalid padding")
                payload = payload[1 : len(payload) - payload[0]]
            if flags & _PRIORITY:
                payload = payload[5:]
            self._header_block = (stream_id, flags, bytearray(payload))
            if flags & _END_HEADERS:
                self._on_header_block()
        elif kind == _CONTINUATION:
            block = self._header_block
            if block is None or block[0] != stream_id:
                raise _ProtocolError(_PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            block[2].extend(payload)
            if flags & _END_HEADERS:
                self._on_header_block()
        elif kind == _RST_STREAM:
            if len(payload) != 4 or stream_id == 0:
                raise _ProtocolError(_PROTOCOL_ERROR, "a malformed RST_STREAM")
            call = self._calls.get(stream_id)
            if call is not None:
                (code,) = struct.unpack(">L", payload)
                call._end(ConnectionFailed(f"the gateway reset the call (HTTP/2 error {code})"))
        elif kind == _SETTINGS:
            self._on_settings(flags, payload)
        elif kind == _PING:
            if not flags & _ACK:
                self._write(_frame(_PING, _ACK, 0, payload))
            else:
                self._pong.set()
        elif kind == _GOAWAY:
            if len(payload) < 8:
                raise _ProtocolError(_FRAME_SIZE_ERROR, "a GOAWAY of fewer than 8 bytes")
            last_stream_id, code = struct.unpack(">LL", payload[:8])
            self._going_away = True
            for other_id, call in list(self._calls.items()):
                if other_id > last_stream_id & _MAX_STREAM_ID:
                    call._end(ConnectionFailed(f"the gateway is going away (HTTP/2 error {code})"))
        elif kind == _PUSH_PROMISE:
            raise _ProtocolError(_PROTOCOL_ERROR, "PUSH_PROMISE, though push is disabled")
        # WINDOW_UPDATE: a call sends one small request, well inside any window. PRIORITY and
        # unknown types are ignored, as the protocol asks.

    def _on_header_block(self) -> None:
        assert self._header_block is not None
        stream_id, flags, block = self._header_block
        self._header_block = None
        try:
            # Decoded even for a call that is gone: the decoder's table must see every block.
            # Names and values are str unless raw=True, whatever hpack's annotations say.
            headers = cast(dict[str, str], dict(self._decoder.decode(bytes(block))))
        except hpack.HPACKError as exc:
            raise _ProtocolError(_COMPRESSION_ERROR, f"undecodable headers: {exc}") from None
        call = self._calls.get(stream_id)
        if call is not None:
            call._headers(headers, bool(flags & _END_STREAM))

    def _on_settings(self, flags: int, payload: bytes) -> None:
        if flags & _ACK:
            return
        if len(payload) % 6:
            raise _ProtocolError(_FRAME_SIZE_ERROR, "a SETTINGS frame of odd size")
        for identifier, value in struct.iter_unpack(">HL", payload):
            if identifier == _SETTINGS_HEADER_TABLE_SIZE:
                # hpack forgets a pending size update when set again to the same value.
                if value != self._encoder.header_table_size:
                    self._encoder.header_table_size = value
            elif identifier == _SETTINGS_MAX_CONCURRENT_STREAMS:
                self._max_calls = value
        self._write(_frame(_SETTINGS, _ACK, 0, b""))

    # -- frames out -----------------------------------------------------------------------
    def start(
        self, call: StreamCall, path: str, request: bytes, metadata: Sequence[tuple[str, str]]
    ) -> None:
        stream_id = self._next_stream_id
        self._next_stream_id += 2
        headers: list[hpack.HeaderTuple | tuple[str, str]] = [
            (":method", "POST"),
            (":scheme", self._scheme),
            (":path", path),
            (":authority", self._authority),
            ("te", "trailers"),
            ("content-type", "application/grpc+proto"),
            ("user-agent", "dlrfeed"),
        ]
        # Credentials never enter the compression table (RFC 7541 §7.1.3).
        headers += [hpack.NeverIndexedHeaderTuple(name, value) for name, value in metadata]
        block = self._encoder.encode(headers)
        self._calls[stream_id] = call
        call._opened(self, stream_id)
        body = _MESSAGE_PREFIX.pack(0, len(request)) + request
        self._write(
            _frame(_HEADERS, _END_HEADERS, stream_id, block)
            + _frame(_DATA, _END_STREAM, stream_id, body)
        )

    def credit(self, stream_id: int, size: int) -> None:
        """Give `size` bytes of room back to the server on `stream_id`."""
        self._write(_frame(_WINDOW_UPDATE, 0, stream_id, struct.pack(">L", size)))

    def reset(self, stream_id: int) -> None:
        if stream_id in self._calls:
            self._write(_frame(_RST_STREAM, 0, stream_id, struct.pack(">L", _CANCEL)))

    def forget(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        if (self._going_away or self._retired) and not self._calls:
            self.close()  # its last call ended: nothing more will come on it

    def close(self) -> None:
        self._write(_frame(_GOAWAY, 0, 0, struct.pack(">LL", 0, _NO_ERROR)))
        if self._transport is not None:
            self._transport.close()

    def _write(self, frames: bytes) -> None:
        transport = self._transport
        if transport is not None and not self._lost and not transport.is_closing():
            transport.write(frames)

    def _abort(self, error_code: int, reason: str) -> None:
        self._write(_frame(_GOAWAY, 0, 0, struct.pack(">LL", 0, error_code)))
        self._end_calls(reason)
        self._lost = True
        if self._transport is not None:
            self._transport.abort()

    async def _keep_alive(self) -> None:
        interval, timeout = self._keepalive
        while True:
            await asyncio.sleep(interval)
            if not self._calls:
                continue  # a server may refuse pings on an idle connection ("too_many_pings")
            self._pong.clear()
            self._write(_frame(_PING, 0, 0, bytes(8)))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._pong.wait()
                    continue
            self._abort(_NO_ERROR, f"no answer to a keepalive ping within {timeout:g} s")
            return

    def _end_calls(self, reason: str) -> None:
        for call in list(self._calls.values()):
            call._end(ConnectionFailed(reason))
        self._calls.clear()


class _ProtocolError(Exception):
    def __init__(self, error_code: int, reason: str) -> None:
        super().__init__(reason)
        self.error_code = error_code


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    length = len(payload)
    return _FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload
