"""Both channels to the gateway go through the egress proxy grpcio is given (`grpc_proxy`, an
HTTP CONNECT tunnel): Subscribe as well as Pull and Ack (docs/daemon.md, "Behind a proxy")."""

from __future__ import annotations

import asyncio

import pytest

from dlrfeed.domain.receipt import Receipt
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient
from fakegw.server import FakeGateway
from support.fakegw_support import LOGIN, LOGINS, PASSWORD, receipt_body


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on loopback that records each tunnel's target."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self._pipes: set[asyncio.Task[None]] = set()

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        request = await client_r.readuntil(b"\r\n\r\n")
        method, target, _ = request.split(b"\r\n", 1)[0].decode().split(" ", 2)
        if method != "CONNECT":
            client_w.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            client_w.close()
            return
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        server_r, server_w = await asyncio.open_connection(host, int(port))
        client_w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for reader, writer in ((client_r, server_w), (server_r, client_w)):
            task = asyncio.create_task(self._pipe(reader, writer), name="proxy-pipe")
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


async def test_subscribe_pull_and_ack_all_go_through_grpc_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = ConnectProxy()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for name in ("no_grpc_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("grpc_proxy", f"http://127.0.0.1:{port}")
    try:
        async with FakeGateway(LOGINS).running() as gateway:
            await gateway.inject(LOGIN, [receipt_body(n) for n in range(4)])
            channel = open_channel(gateway.target, None)
            stream_channel = open_stream_channel(gateway.target, None)
            try:
                client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
                stream = client.subscribe(window=3)
                streamed: list[Receipt] = []
                while len(streamed) < 3:
                    group = await asyncio.wait_for(stream.read(), 10)
                    assert group is not None
                    streamed += group
                acked_streamed = await client.ack([r.ack_token for r in streamed])
                stream.cancel()
                pulled = await client.pull(10, 5).receipts()
                acked_pulled = await client.ack([r.ack_token for r in pulled])
            finally:
                stream_channel.close()
                await channel.close(grace=None)
            target = gateway.target
    finally:
        server.close()
        await proxy.close()
    assert [r.message_id for r in streamed] == ["m0", "m1", "m2"]
    assert [r.message_id for r in pulled] == ["m3"]
    assert (acked_streamed.acked, acked_pulled.acked) == (3, 1)
    assert proxy.tunnels == [target, target]  # one tunnel per channel, nothing around it
