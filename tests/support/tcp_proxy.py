"""A loopback TCP proxy whose connections a test can cut with a reset (RST), as a firewall, a
NAT or a load balancer that forgets a flow does: both ends see "connection reset by peer"
mid-conversation, with no goodbye from the server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

_CHUNK = 65536
# SO_LINGER on, timeout 0: close() sends RST instead of FIN.
_LINGER_RESET = struct.pack("ii", 1, 0)


class TcpProxy:
    """Forwards every connection to `target_port` on 127.0.0.1; `reset_all()` cuts them."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def reset_all(self) -> int:
        """Reset every connection through the proxy, on both sides; how many were cut."""
        pairs = list(self._pairs)
        for pair in pairs:
            for writer in pair:
                _reset(writer)
        self._pairs.clear()
        return len(pairs)

    async def close(self) -> None:
        self.reset_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            _reset(writer)  # the server is not there: the client learns it as a reset
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        pumps = [
            asyncio.create_task(_pump(reader, up_writer)),
            asyncio.create_task(_pump(up_reader, writer)),
        ]
        self._pumps.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._pumps.difference_update(pumps)
            self._pairs.discard(pair)
            for end in pair:
                end.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()
