"""What a `FeedReader` gives back when a store outage outlasts --release-after, against fakegw
over loopback gRPC: a Subscribe reader drops what it holds and closes its stream, which the
gateway releases at once (F7); a Pull reader keeps what it pulled, since no call gives a lease
back (F6), and pulls nothing while the store is down; auto commits what it pulled before it
subscribes, so a stream's release never drops pulled receipts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from dlrfeed.domain.receipt import Receipt
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient
from dlrfeed.feed.reader import FeedReader, Mode, ReaderSettings
from fakegw.server import FakeGateway
from support.fakegw_support import LOGIN, LOGINS, PASSWORD, receipt_body, wait_until


class RecordingSink:
    """A reader's sink that holds what it is given until `drain()` acks it; every call is
    written to `events`, which the reader's state changes also go to."""

    def __init__(self, client: FeedClient, events: list[str]) -> None:
        self._client = client
        self.events = events
        self.held: list[Receipt] = []
        self.writable = asyncio.Event()
        self.writable.set()

    @property
    def in_hand(self) -> int:
        return len(self.held)

    async def accept(self, receipts: list[Receipt]) -> None:
        self.held.extend(receipts)
        self.events.append(f"accept {len(receipts)}")

    def discard_pending(self) -> int:
        dropped, self.held = len(self.held), []
        return dropped

    async def drain(self) -> None:
        if self.held:
            await self._client.ack([receipt.ack_token for receipt in self.held])
        self.held = []
        self.events.append("drain")

    async def wait_writable(self) -> None:
        await self.writable.wait()

    def release(self) -> None:
        self.held = []
        self.events.append("release")


@asynccontextmanager
async def reading(
    mode: Mode, pull_wait_seconds: int = 20
) -> AsyncIterator[tuple[FakeGateway, FeedReader, RecordingSink]]:
    """A reader in `mode` running against a fresh fakegw; stopped and closed on exit."""
    async with FakeGateway(LOGINS).running() as gw:
        channel = open_channel(gw.target, None)
        stream_channel = open_stream_channel(gw.target, None)
        client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
        events: list[str] = []
        sink = RecordingSink(client, events)
        reader = FeedReader(
            "r0",
            client,
            sink,
            ReaderSettings(mode=mode, pull_wait_seconds=pull_wait_seconds),
            on_state=lambda _, state: events.append(f"state {state}"),
        )
        task = asyncio.create_task(reader.run(), name="reader-under-test")
        try:
            yield gw, reader, sink
        finally:
            reader.stop_reading()
            reader.close()
            await asyncio.wait_for(task, 10)
            stream_channel.close()
            await channel.close(grace=None)


def holding(sink: RecordingSink, count: int) -> Callable[[], bool]:
    return lambda: len(sink.held) == count


async def test_a_pull_reader_keeps_what_it_pulled_and_pulls_nothing_while_the_store_is_down() -> (
    None
):
    async with reading(Mode.PULL, pull_wait_seconds=1) as (gw, reader, sink):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(10)])
        await wait_until(holding(sink, 10))
        sink.writable.clear()  # the store is down
        reader.release()
        await reader.settle(10.0)  # the long poll in flight ends empty; no other starts
        await gw.inject(LOGIN, [receipt_body(n) for n in range(10, 15)])
        await asyncio.sleep(0.5)
        stats = gw.stats(LOGIN)
        assert "release" not in sink.events
        assert len(sink.held) == 10
        assert (stats["in_flight"], stats["queued"]) == (10, 5)
        assert stats["released_on_stream_end"] == 0
        assert reader.mode is Mode.PULL
        sink.writable.set()  # the store is back: the reader pulls on where it was
        await wait_until(holding(sink, 15))
        await sink.drain()
        assert gw.stats(LOGIN)["acked"] == 15
        assert gw.stats(LOGIN)["redelivered"] == 0


async def test_a_subscribe_reader_drops_what_it_holds_and_closes_its_stream() -> None:
    async with reading(Mode.SUBSCRIBE) as (gw, reader, sink):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(10)])
        await wait_until(holding(sink, 10))
        sink.writable.clear()
        reader.release()
        await wait_until(lambda: gw.stats(LOGIN)["released_on_stream_end"] == 10)
        assert "release" in sink.events
        assert sink.held == []
        sink.writable.set()  # the reader reopens and the gateway delivers them again
        await wait_until(holding(sink, 10))
        assert gw.stats(LOGIN)["redelivered"] == 10


async def test_auto_commits_what_it_pulled_before_it_opens_a_stream() -> None:
    async with reading(Mode.AUTO, pull_wait_seconds=1) as (gw, _, sink):
        await gw.inject(LOGIN, [receipt_body(n) for n in range(3)])
        await wait_until(lambda: "state subscribe" in sink.events)
        events = sink.events
        assert events.index("accept 3") < events.index("drain") < events.index("state subscribe")
        assert gw.stats(LOGIN)["acked"] == 3
