"""`dlrfeed webhook` as its own process under idle, slow and partial clients: each is cut off
by its deadline, other callers are served meanwhile, and memory stays bounded.

The receiver runs as `dlrfeed webhook` (its descriptors and memory are its own: the RSS read
from /proc is the receiver's); the clients are raw sockets of the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from support.webhook_harness import LOGIN

IDLE_CONNECTIONS = 2000
DEADLINES = ("--header-timeout", "2", "--body-timeout", "2")


@pytest.fixture(autouse=True)
def _descriptors() -> None:
    """Room for thousands of sockets on both sides: the soft limit raised to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 16384)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < 3 * IDLE_CONNECTIONS:
        pytest.skip(f"the hard open-files limit ({hard}) is too low for the test")


class Receiver:
    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process, self.port = process, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/dlr"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        (line,) = [row for row in status.splitlines() if row.startswith("VmRSS:")]
        return int(line.split()[1])


@contextlib.asynccontextmanager
async def receiver(database_url: str, tmp_path: Path, *extra: str) -> AsyncIterator[Receiver]:
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "dlrfeed"),
            "webhook", "--listen", "127.0.0.1:0", "--login", LOGIN,
            "--database-url", database_url, "--log-format", "json", *extra,
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        port = None
        for _ in range(600):
            for line in log.read_bytes().splitlines():
                if line.startswith(b"{") and json.loads(line).get("event") == "webhook_ready":
                    port = int(json.loads(line)["port"])
            if port is not None or process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert port is not None, log.read_text()
        yield Receiver(process, port)
    finally:
        if process.returncode is None:
            process.terminate()
        assert await asyncio.wait_for(process.wait(), 60) == 0, log.read_text()
    # One JSON event per line, whatever the clients did: no traceback, no plain text.
    lines = log.read_bytes().splitlines()
    assert all(line.startswith(b"{") and json.loads(line) for line in lines), log.read_text()


async def _served(receiver: Receiver, message_id: str) -> None:
    """An ordinary caller posts a callback and is answered after its commit."""
    body = json.dumps({"id": message_id, "level": 2, "stat": "DELIVRD"}).encode()
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(receiver.url, content=body)
    assert answer.status_code == 200, answer.text


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before closing the connection; fails if it stays open."""
    return await asyncio.wait_for(reader.read(), seconds)


async def test_thousands_of_idle_connections_lock_nobody_out_and_are_closed(
    database_url: str, tmp_path: Path
) -> None:
    """2,000 connections that never send a byte: other callers are served while they are
    open, each is closed by the header deadline, and the receiver's memory stays small."""
    async with receiver(database_url, tmp_path, *DEADLINES) as served:
        before = served.rss_kib()
        idle = [
            await asyncio.open_connection("127.0.0.1", served.port) for _ in range(IDLE_CONNECTIONS)
        ]
        await _served(served, "while-idle")
        with_idle = served.rss_kib()
        print(f"receiver RSS: {before} KiB, with {IDLE_CONNECTIONS} idle: {with_idle} KiB")
        closed = await asyncio.gather(*(_closed_within(r, 30) for r, _ in idle))
        assert closed == [b""] * IDLE_CONNECTIONS
        for _, writer in idle:
            writer.close()
        await _served(served, "after-idle")
        assert with_idle - before < 64 * 1024, "under 32 KiB a connection"


async def test_slowloris_and_partial_bodies_are_cut_off_and_others_served(
    database_url: str, tmp_path: Path
) -> None:
    """Headers trickled one line a second are cut at the header deadline; bodies that stop
    half-way are answered 408 at the body deadline; callers meanwhile are served."""
    async with receiver(database_url, tmp_path, *DEADLINES) as served:
        before = served.rss_kib()
        trickled = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(50)]
        for _, writer in trickled:
            writer.write(b"POST /dlr HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:
            for n in range(60):
                for _, writer in trickled:
                    with contextlib.suppress(ConnectionError):
                        writer.write(f"X-Slow-{n}: 1\r\n".encode())
                await asyncio.sleep(0.5)

        trickling = asyncio.create_task(trickle())
        partial = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(200)]
        for _, writer in partial:
            writer.write(
                b"POST /dlr HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n"
                + b'{"id": "p", '
                + b" " * 20000
            )
        broken = await asyncio.open_connection("127.0.0.1", served.port)
        broken[1].write(
            b"POST /dlr HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'5\r\n{"id"\r\nZZ\r\n'
        )
        gone = await asyncio.open_connection("127.0.0.1", served.port)
        gone[1].write(b"POST /dlr HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        gone[1].transport.abort()  # a client dropped mid-body
        await _served(served, "amid-slow-clients")
        assert (await _closed_within(broken[0], 20)).startswith(b"HTTP/1.")
        broken[1].close()
        amid = served.rss_kib()
        print(f"receiver RSS: {before} KiB, with 50 slowloris and 200 partial bodies: {amid} KiB")
        assert amid - before < 64 * 1024
        cut = await asyncio.gather(*(_closed_within(r, 20) for r, _ in trickled))
        assert all(not answer.startswith(b"HTTP/1.1 2") for answer in cut)
        answers = await asyncio.gather(*(_closed_within(r, 20) for r, _ in partial))
        assert {a.split(b" ")[1] for a in answers} == {b"408"}
        trickling.cancel()
        for _, writer in trickled + partial:
            writer.close()
        await _served(served, "after-slow-clients")


async def test_connections_past_the_cap_are_told_to_retry(
    database_url: str, tmp_path: Path
) -> None:
    """--max-connections: one past the cap is answered 503 at once and closed; once the idle
    ones are cut, callers are served again."""
    async with receiver(database_url, tmp_path, *DEADLINES, "--max-connections", "100") as served:
        idle = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(100)]
        # Connected is not yet accepted: probe until the receiver has taken the 100 (a probe
        # it takes is one more idle connection, left to its deadline).
        refused = b""
        for _ in range(50):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            with contextlib.suppress(TimeoutError):
                refused = await _closed_within(reader, 1)
            if refused:
                break
            idle.append((reader, writer))
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"Retry-After:" in refused
        writer.close()
        await asyncio.gather(*(_closed_within(r, 30) for r, _ in idle))
        for _, each in idle:
            each.close()
        await _served(served, "after-cap")
