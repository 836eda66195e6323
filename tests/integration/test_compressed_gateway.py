"""The daemon against a gateway that is not fakegw and gzips every message it sends.

A minimal `ReceiptFeed` on grpcio's own server (grpc core) with `compression=Gzip`, written
here: a queue, Subscribe's window and its release at stream end (F7, F11), Pull's long poll
(F10), and an Ack that checks each token's receipt is already stored when it arrives (F8). The
receipts carry long, repetitive text, so every message goes out compressed.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import grpc
import grpc.aio
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    settings_for,
    store_counts,
    stored_tokens,
    wait_until,
)
from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc

_CREDENTIAL = "Basic " + base64.b64encode(f"{LOGIN}:{PASSWORD}".encode()).decode()
_TEXT = "Your verification code is 123456. Do not share it with anyone. " * 8


class CompressingGateway(feed_pb2_grpc.ReceiptFeedServicer):
    """Just enough of the feed's rules to drain a queue by either RPC, every message gzipped."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._receipts: dict[str, feed_pb2.Receipt] = {}
        self._waiting: list[str] = []  # tokens neither delivered nor acked, oldest first
        self._changed = asyncio.Event()
        self.acked: set[str] = set()
        self.acked_before_stored: set[str] = set()
        self.delivered = {"Subscribe": 0, "Pull": 0}

    def enqueue(self, count: int, prefix: str) -> None:
        for n in range(count):
            token = f"{prefix}-token-{n}"
            self._receipts[token] = feed_pb2.Receipt(
                id=f"{prefix}{n:05d}",
                level=2,
                stat="DELIVRD",
                err="000",
                text=_TEXT,
                destination_addr="34600000000",
                ack_token=token,
                delivery_count=1,
            )
            self._waiting.append(token)
        self._notify()

    async def drained(self) -> bool:
        return len(self.acked) == len(self._receipts)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def _login(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        if dict(context.invocation_metadata() or ()).get("authorization") != _CREDENTIAL:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad credentials")

    async def Subscribe(  # noqa: N802 - the generated servicer's name
        self,
        request: feed_pb2.SubscribeRequest,
        context: grpc.aio.ServicerContext[feed_pb2.SubscribeRequest, feed_pb2.Receipt],
    ) -> AsyncIterator[feed_pb2.Receipt]:
        await self._login(context)  # type: ignore[arg-type]
        window = request.window or 1000
        held: list[str] = []
        try:
            while True:
                await self._until(
                    lambda: (
                        bool(self._waiting)
                        and sum(token not in self.acked for token in held) < window
                    )
                )
                token = self._waiting.pop(0)
                held.append(token)
                self.delivered["Subscribe"] += 1
                yield self._receipts[token]
        finally:
            # F7: the stream's end releases what it held and was not acked, at once.
            self._waiting[:0] = [token for token in held if token not in self.acked]
            self._notify()

    async def Pull(  # noqa: N802 - the generated servicer's name
        self,
        request: feed_pb2.PullRequest,
        context: grpc.aio.ServicerContext[feed_pb2.PullRequest, feed_pb2.PullResponse],
    ) -> feed_pb2.PullResponse:
        await self._login(context)  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(min(request.wait_seconds, 20)):
                await self._until(lambda: bool(self._waiting))
        except TimeoutError:
            return feed_pb2.PullResponse()
        taken, self._waiting = self._waiting[: request.max], self._waiting[request.max :]
        self.delivered["Pull"] += len(taken)
        return feed_pb2.PullResponse(receipts=[self._receipts[token] for token in taken])

    async def Ack(  # noqa: N802 - the generated servicer's name
        self,
        request: feed_pb2.AckRequest,
        context: grpc.aio.ServicerContext[feed_pb2.AckRequest, feed_pb2.AckResponse],
    ) -> feed_pb2.AckResponse:
        await self._login(context)  # type: ignore[arg-type]
        if not request.tokens:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no tokens")  # F9
        # F8: an ack follows the commit that stored its receipt.
        self.acked_before_stored |= set(request.tokens) - await stored_tokens(self._database_url)
        fresh = set(request.tokens) - self.acked
        self.acked |= fresh
        self._notify()
        return feed_pb2.AckResponse(
            acked=len(fresh), already_gone=[t for t in request.tokens if t not in fresh]
        )


@asynccontextmanager
async def compressing_gateway(database_url: str) -> AsyncIterator[tuple[CompressingGateway, str]]:
    gateway = CompressingGateway(database_url)
    server = grpc.aio.server(compression=grpc.Compression.Gzip)
    feed_pb2_grpc.add_ReceiptFeedServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield gateway, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _run_until(
    daemon: Daemon, done: Callable[[], Awaitable[bool]], what: str
) -> asyncio.Task[int]:
    task = asyncio.create_task(daemon.run(), name="daemon-under-test")

    async def check() -> bool:
        if task.done():
            raise AssertionError(f"the daemon stopped early with {task.result()}")
        return await done()

    await wait_until(check, 60, what)
    return task


async def _stop(daemon: Daemon, task: asyncio.Task[int]) -> None:
    daemon.stop()
    assert await asyncio.wait_for(task, 15) == 0


async def test_subscribe_reads_a_gzipping_gateway(database_url: str) -> None:
    """`--mode subscribe` takes every compressed message on its streams: no reconnect loop."""
    async with compressing_gateway(database_url) as (gateway, target):
        gateway.enqueue(300, "backlog")
        daemon = Daemon(settings_for(target, database_url, "--mode", "subscribe"))
        with capture_logs() as logs:
            task = await _run_until(daemon, gateway.drained, "the backlog to be acked")
            gateway.enqueue(20, "live")
            await wait_until(gateway.drained, 30, "the live receipts")
            await _stop(daemon, task)
    assert gateway.delivered == {"Subscribe": 320, "Pull": 0}
    assert [e for e in logs if e["event"] == "reader_reconnect"] == []
    await _assert_stored_then_acked(gateway, database_url, 320)


async def test_auto_reads_a_gzipping_gateway_by_pull_then_subscribe(database_url: str) -> None:
    """`--mode auto` drains the backlog by Pull and the live receipts by Subscribe, both
    compressed; one reader, a low --auto-pull-rate, a short cool-down and a short long poll make
    both switches certain and quick."""
    async with compressing_gateway(database_url) as (gateway, target):
        gateway.enqueue(2000, "backlog")
        settings = settings_for(
            target,
            database_url,
            *("--mode", "auto", "--auto-pull-rate", "10", "--auto-cooldown", "1"),
            *("--pull-wait-seconds", "1", "--streams", "1"),
        )
        daemon = Daemon(settings)
        with capture_logs() as logs:

            async def back_on_subscribe() -> bool:
                return any(e["event"] == "auto_switch" and e["to"] == "subscribe" for e in logs)

            task = await _run_until(daemon, gateway.drained, "the backlog to be acked")
            await wait_until(back_on_subscribe, 30, "auto back on Subscribe")
            streamed = gateway.delivered["Subscribe"]
            gateway.enqueue(5, "live")
            await wait_until(gateway.drained, 30, "the live receipts")
            await _stop(daemon, task)
    assert gateway.delivered["Pull"] >= 1
    assert gateway.delivered["Subscribe"] - streamed == 5
    assert [e for e in logs if e["event"] == "reader_reconnect"] == []
    await _assert_stored_then_acked(gateway, database_url, 2005)


async def _assert_stored_then_acked(
    gateway: CompressingGateway, database_url: str, count: int
) -> None:
    assert len(gateway.acked) == count
    assert gateway.acked_before_stored == set()
    assert await stored_tokens(database_url) == gateway.acked
    assert (await store_counts(database_url))["events"] == count
