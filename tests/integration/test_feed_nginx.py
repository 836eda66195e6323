"""The feed through nginx `grpc_pass`, run for real: what `grpc_read_timeout` does to an idle
Subscribe stream and to Pull's long poll, and that raising it keeps the stream (docs/daemon.md,
"Behind nginx grpc_pass")."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dlrfeed.errors import FeedUnavailableError
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient
from dlrfeed_tools.pgcluster import free_port
from fakegw.server import FakeGateway
from support.fakegw_support import LOGIN, LOGINS, PASSWORD, receipt_body, wait_until

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
SHORT = 2  # seconds of grpc_read_timeout that an idle stream outlives in these tests


@asynccontextmanager
async def _behind_nginx(
    directory: Path, read_timeout: str
) -> AsyncIterator[tuple[FakeGateway, FeedClient]]:
    """fakegw behind nginx (plaintext HTTP/2 on both hops) and a client dialling nginx."""
    async with FakeGateway(LOGINS).running() as gateway:
        port = free_port()
        scratch = directory / "scratch"
        scratch.mkdir()
        scratch.chmod(0o777)  # nginx's workers drop to `nobody` when the master runs as root
        (directory / "nginx.conf").write_text(
            f"""
            daemon off;
            pid {directory}/nginx.pid;
            error_log {directory}/error.log warn;
            events {{ worker_connections 64; }}
            http {{
                access_log off;
                client_body_temp_path {scratch}/body;
                proxy_temp_path {scratch}/proxy;
                fastcgi_temp_path {scratch}/fastcgi;
                uwsgi_temp_path {scratch}/uwsgi;
                scgi_temp_path {scratch}/scgi;
                server {{
                    listen 127.0.0.1:{port} http2;
                    location /gateway.receipts.v1.ReceiptFeed/ {{
                        grpc_pass grpc://{gateway.target};
                        grpc_read_timeout {read_timeout};
                        grpc_send_timeout {read_timeout};
                    }}
                }}
            }}
            """
        )
        command = [NGINX, "-p", str(directory), "-c", str(directory / "nginx.conf")]
        syntax = await asyncio.create_subprocess_exec(*command, "-t", stderr=subprocess.PIPE)
        assert await syntax.wait() == 0, "nginx -t refused the configuration"
        nginx = await asyncio.create_subprocess_exec(*command)
        channel = open_channel(f"127.0.0.1:{port}", None)
        stream_channel = open_stream_channel(f"127.0.0.1:{port}", None)
        try:
            client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
            for _ in range(100):  # nginx binds its port just after it starts
                try:
                    await client.check_access(deadline_s=1)
                    break
                except FeedUnavailableError:
                    await asyncio.sleep(0.05)
            yield gateway, client
        finally:
            stream_channel.close()
            await channel.close(grace=None)
            nginx.terminate()
            await nginx.wait()


async def test_an_idle_stream_past_grpc_read_timeout_is_reset_and_retried(tmp_path: Path) -> None:
    """nginx resets a stream whose gateway said nothing for `grpc_read_timeout` (RST_STREAM,
    INTERNAL): a transient error the reader reconnects from, and the gateway releases what the
    stream held (F7). A long poll longer than the timeout is answered 504 (UNAVAILABLE)."""
    async with _behind_nginx(tmp_path, f"{SHORT}s") as (gateway, client):
        await gateway.inject(LOGIN, [receipt_body(0)])
        stream = client.subscribe(window=10)
        first = await stream.read()
        with pytest.raises(FeedUnavailableError, match="INTERNAL"):
            await asyncio.wait_for(stream.read(), 30)
        await wait_until(lambda: gateway.stats(LOGIN)["queued"] == 1)
        released = await client.pull(10, 0).receipts()
        with pytest.raises(FeedUnavailableError, match="504"):
            await client.pull(10, SHORT + 3).receipts()  # the queue is empty: it waits
    assert [(r.message_id, r.delivery_count) for r in first or []] == [("m0", 1)]
    assert [(r.message_id, r.delivery_count) for r in released] == [("m0", 2)]


async def test_a_raised_grpc_read_timeout_keeps_an_idle_stream(tmp_path: Path) -> None:
    """With grpc_read_timeout raised (docs/daemon.md), a stream idle for twice what reset it
    above still carries the next receipt, on the same call."""
    async with _behind_nginx(tmp_path, "1h") as (gateway, client):
        await gateway.inject(LOGIN, [receipt_body(0)])
        stream = client.subscribe(window=10)
        first = await stream.read()
        await asyncio.sleep(2 * SHORT)  # idle, as a quiet night is
        await gateway.inject(LOGIN, [receipt_body(1)])
        second = await asyncio.wait_for(stream.read(), 30)
        stream.cancel()
    assert [r.message_id for r in (first or []) + (second or [])] == ["m0", "m1"]
    assert [r.delivery_count for r in (first or []) + (second or [])] == [1, 1]
