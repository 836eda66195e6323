"""Auto mode's backlog rule (issue 4 §4, §12): a Subscribe stream's rate is judged over the
real length of each span, so a burst followed by a long quiet spell is not a backlog.

The reader runs against a scripted stream and a clock the test moves; no gRPC, no database.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.feed import reader as reader_module
from dlrfeed.feed.client import FeedClient
from dlrfeed.feed.reader import FeedReader, Mode, ReaderSettings

RECEIPT = Receipt(
    message_id=MessageId("m1"), level=2, stat="DELIVRD", err=None, sub=None, dlvrd=None,
    submit_date=None, done_date=None, text=None, source_addr=None, destination_addr=None,
    smsc_message_id=None, connector=None, delivery_count=1, ack_token=AckToken("t"), raw=b"",
    received_at=0.0,
)  # fmt: skip


class Clock:
    now = 1_000.0

    def monotonic(self) -> float:
        return self.now


class ScriptedStream:
    """Delivers one receipt at each scripted clock time, then stays quiet (a caught-up stream)."""

    def __init__(self, clock: Clock, arrivals: list[float]) -> None:
        self._clock = clock
        self._arrivals = [clock.now + at for at in arrivals]
        self.cancelled_by_us = False
        self.exhausted = asyncio.Event()  # all read, and the reader waits for more: it stayed

    async def read(self) -> Receipt:
        if not self._arrivals:
            self.exhausted.set()
            await asyncio.Event().wait()
        self._clock.now = self._arrivals.pop(0)
        return RECEIPT

    def cancel(self) -> None:
        self.cancelled_by_us = True


class Sink:
    """A batcher whose batches never close full: only the stream's rate can show a backlog."""

    def __init__(self) -> None:
        self.drained = False

    async def accept(self, receipts: list[Receipt]) -> None:
        await asyncio.sleep(0)

    def discard_pending(self) -> int:
        return 0

    async def drain(self) -> None:
        self.drained = True

    async def wait_writable(self) -> None:
        return None

    def backlogged(self) -> bool:
        return False

    def forget_backlog(self) -> None:
        return None


async def switches_to_pull(
    monkeypatch: pytest.MonkeyPatch, arrivals: list[float], rate: float = 2000.0
) -> bool:
    """Whether auto leaves this stream for Pull (its Subscribe loop returns after a drain)."""
    clock = Clock()
    monkeypatch.setattr(reader_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    stream = ScriptedStream(clock, arrivals)
    client = cast(FeedClient, SimpleNamespace(subscribe=lambda window: stream))
    sink = Sink()
    reader = FeedReader("r0", client, sink, ReaderSettings(mode=Mode.AUTO, auto_pull_rate=rate))
    run_subscribe: Any = reader._run_subscribe  # the policy under test, without reconnects
    # Decided by what the reader does, not by a timer: it either leaves (the loop returns) or
    # reads past the last scripted receipt (it stays on the stream).
    subscribing = asyncio.create_task(run_subscribe())
    stayed = asyncio.create_task(stream.exhausted.wait())
    await asyncio.wait({subscribing, stayed}, return_when=asyncio.FIRST_COMPLETED)
    stayed.cancel()
    if not subscribing.done():
        subscribing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await subscribing
        assert not sink.drained
        return False
    subscribing.result()  # raises what the loop raised
    assert sink.drained  # F7: what it holds is committed and acked before the stream closes
    return True


async def test_a_fast_stream_moves_to_pull_within_half_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,200 receipts in 0.5 s (2,400/s) against a threshold of 2,000/s: a backlog."""
    assert await switches_to_pull(monkeypatch, [i * 0.5 / 1_200 for i in range(1, 1_202)])


async def test_a_stream_below_the_rate_stays_on_subscribe(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,800/s for 2 s: a heavy live flow below the threshold keeps Subscribe's latency."""
    assert not await switches_to_pull(monkeypatch, [i / 1_800 for i in range(1, 3_600)])


async def test_a_burst_then_a_long_quiet_spell_is_not_a_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """999 receipts in 0.1 s, then one a minute later: 1,000 over 60 s, not over half a second
    (the count must be taken over the span's real length, found by review)."""
    arrivals = [i * 0.1 / 999 for i in range(1, 1_000)] + [60.1]
    assert not await switches_to_pull(monkeypatch, arrivals)
