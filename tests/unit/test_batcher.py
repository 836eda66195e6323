"""The Batcher (F8: ack only after commit): flush on size and on time, drain on stop, a commit
shielded from cancellation, a batch put back while the store is down, release (F7).

Unit tests: a real event loop and the real StoreGate, with an in-test store implementing the
batcher's `BatchStore` port and an in-test ack queue implementing `AckQueue`. The integration
tests run the same code against PostgreSQL and gRPC.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from dlrfeed.backoff import Backoff
from dlrfeed.daemon.batcher import Batcher
from dlrfeed.daemon.store_gate import StoreGate
from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.feed.reader import StreamReleased
from support.frozen_clock import FrozenClock

WITHIN = 5.0
"""Generous bound for something that must happen (the machine is shared and slow)."""


def receipt(message_id: str) -> Receipt:
    return Receipt(
        message_id=MessageId(message_id), level=2, stat="DELIVRD", err=None, sub=None,
        dlvrd=None, submit_date=None, done_date=None, text=None, source_addr=None,
        destination_addr=None, smsc_message_id=None, connector=None, delivery_count=1,
        ack_token=AckToken(f"tok-{message_id}"), raw=b"", received_at=0.0,
    )  # fmt: skip


def receipts(n: int, prefix: str = "m") -> list[Receipt]:
    return [receipt(f"{prefix}{i}") for i in range(n)]


@dataclass
class FakeStore:
    """Commits batches in memory; can hold a commit open, or be down (commits and pings fail)."""

    committed: list[list[str]] = field(default_factory=list)
    hold: asyncio.Event | None = None  # set: commits wait for it
    down: bool = False
    refusing: bool = False  # commits fail, pings pass: a table locked past lock_timeout
    started: asyncio.Event = field(default_factory=asyncio.Event)
    attempts: int = 0

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> object:
        self.attempts += 1
        self.started.set()
        if self.down:
            raise StoreUnavailableError("connection refused")
        if self.refusing:
            raise StoreUnavailableError("SQLSTATE 55P03 LockNotAvailableError: lock timeout")
        if self.hold is not None:
            await self.hold.wait()
        self.committed.append([r.ack_token for r in receipts])
        return object()

    async def ping(self) -> None:
        if self.down:
            raise StoreUnavailableError("still down")

    def committed_tokens(self) -> set[str]:
        return {token for batch in self.committed for token in batch}


@dataclass
class FakeAcks:
    """An ack queue that checks F8 at the door: every token it gets is committed already."""

    store: FakeStore
    submitted: list[str] = field(default_factory=list)
    flushes: int = 0
    acked_before_commit: list[str] = field(default_factory=list)

    async def submit(self, tokens: Sequence[str], received_at: Sequence[float]) -> None:
        committed = self.store.committed_tokens()
        self.acked_before_commit += [t for t in tokens if t not in committed]
        self.submitted += tokens

    async def flush(self) -> None:
        self.flushes += 1


@dataclass
class Rig:
    batcher: Batcher
    store: FakeStore
    acks: FakeAcks
    gate: StoreGate
    clock: FrozenClock
    task: asyncio.Task[None]
    released: list[int] = field(default_factory=list)


QUICK_RETRY = Backoff(0.001, 0.01, rng=random.Random(1))


@asynccontextmanager
async def rig(
    *,
    batch_size: int = 3,
    linger: float = 3600.0,
    store: FakeStore | None = None,
    retry_delay: Backoff = QUICK_RETRY,
) -> AsyncIterator[Rig]:
    store = store or FakeStore()
    acks = FakeAcks(store)
    clock = FrozenClock()
    gate = StoreGate(
        store.ping,
        release_after=3600.0,
        on_release=lambda: None,
        ping_delay=Backoff(0.001, 0.01, rng=random.Random(1)),
        clock=clock,
    )
    batcher = Batcher(
        "r0",
        login="acme",
        store=store,
        acker=acks,
        gate=gate,
        batch_size=batch_size,
        linger=linger,
        retry_delay=retry_delay,
        clock=clock,
    )
    task = asyncio.create_task(batcher.run(), name="batcher-under-test")
    prober = asyncio.create_task(gate.run(), name="gate-under-test")
    try:
        yield Rig(batcher, store, acks, gate, clock, task)
    finally:
        for running in (task, prober):
            running.cancel()
        await asyncio.gather(task, prober, return_exceptions=True)


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for `condition`, failing the test past WITHIN seconds."""
    deadline = time.monotonic() + WITHIN
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


async def test_a_full_batch_is_committed_then_acked_without_waiting_for_the_linger() -> None:
    async with rig(batch_size=3) as r:
        await asyncio.wait_for(r.batcher.accept(receipts(3)), WITHIN)
        await eventually(lambda: len(r.acks.submitted) == 3, "the batch's acks")
        assert r.store.committed == [["tok-m0", "tok-m1", "tok-m2"]]
        assert r.acks.acked_before_commit == []


async def test_a_partial_batch_is_committed_once_its_linger_has_passed_and_not_before() -> None:
    async with rig(batch_size=100, linger=0.01) as r:
        await r.batcher.accept(receipts(2))
        await asyncio.sleep(0.1)  # the clock is frozen: however long this takes, no linger
        assert r.store.attempts == 0
        r.clock.now += 0.01
        await eventually(lambda: len(r.acks.submitted) == 2, "the lingered batch's acks")
        assert r.store.committed == [["tok-m0", "tok-m1"]]


async def test_no_token_reaches_the_acker_before_its_batch_has_committed() -> None:
    """F8: while the commit is open, nothing is acked; after it, everything is."""
    store = FakeStore(hold=asyncio.Event())
    async with rig(batch_size=2, store=store) as r:
        await r.batcher.accept(receipts(2))
        await asyncio.wait_for(store.started.wait(), WITHIN)
        await asyncio.sleep(0.05)
        assert r.acks.submitted == []
        assert store.hold is not None
        store.hold.set()
        await eventually(lambda: len(r.acks.submitted) == 2, "the acks after the commit")
        assert r.acks.acked_before_commit == []


async def test_a_cancelled_batcher_finishes_the_commit_and_its_acks_before_it_ends() -> None:
    """A batch never stops between commit and ack: cancelling (twice, as a teardown may)
    waits for the commit in progress and hands its tokens to the Acker first."""
    store = FakeStore(hold=asyncio.Event())
    async with rig(batch_size=2, store=store) as r:
        acks_when_ended: list[str] = []
        r.task.add_done_callback(lambda _: acks_when_ended.extend(r.acks.submitted))
        await r.batcher.accept(receipts(2))
        await asyncio.wait_for(store.started.wait(), WITHIN)
        for _ in range(2):
            r.task.cancel()
            done, _ = await asyncio.wait([r.task], timeout=0.05)
            assert not done, "the batcher ended with a commit still open"
        assert store.hold is not None
        store.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(r.task, WITHIN)
        assert store.committed == [["tok-m0", "tok-m1"]]
        assert acks_when_ended == ["tok-m0", "tok-m1"]


async def test_drain_commits_the_batch_in_hand_at_once_then_flushes_the_acks() -> None:
    async with rig(batch_size=100, linger=3600.0) as r:
        await r.batcher.accept(receipts(2))
        await asyncio.wait_for(r.batcher.drain(), WITHIN)
        assert r.store.committed == [["tok-m0", "tok-m1"]]
        assert r.acks.submitted == ["tok-m0", "tok-m1"]
        assert r.acks.flushes == 1
        assert r.batcher.in_hand == 0


async def test_a_batch_that_found_the_store_down_is_put_back_and_committed_once() -> None:
    """Nothing was committed, so the same batch is retried whole once the gate sees the
    store again; it is acked once, after that commit."""
    store = FakeStore(down=True)
    async with rig(batch_size=2, store=store) as r:
        await r.batcher.accept(receipts(2))
        await eventually(lambda: store.attempts >= 1 and not r.gate.is_up, "a failed commit")
        await asyncio.sleep(0.05)  # pings fail meanwhile; the batch waits, put back
        assert r.batcher.in_hand == 2
        assert r.acks.submitted == []
        store.down = False
        await eventually(lambda: len(r.acks.submitted) == 2, "the batch after the outage")
        assert store.committed == [["tok-m0", "tok-m1"]]
        assert r.acks.submitted == ["tok-m0", "tok-m1"]
        assert r.gate.is_up
        assert r.gate.outages == 1


async def test_a_batch_refused_by_a_store_that_answers_pings_is_retried_after_a_backoff() -> None:
    """A lock timeout leaves the server answering pings, so the gate reopens at once: the batch
    waits its own backoff between attempts instead of retrying in a tight loop, and is committed
    once the lock is gone."""
    store = FakeStore(refusing=True)
    delay = Backoff(0.2, 0.2, rng=random.Random(1))  # each wait 0.1-0.2 s
    async with rig(batch_size=2, store=store, retry_delay=delay) as r:
        await r.batcher.accept(receipts(2))
        await eventually(lambda: store.attempts >= 1, "a refused commit")
        await asyncio.sleep(0.3)
        assert store.attempts <= 4, "retried without a backoff"  # the first + at most 3
        assert r.acks.submitted == []
        store.refusing = False
        await eventually(lambda: len(r.acks.submitted) == 2, "the batch once the lock is gone")
        assert store.committed == [["tok-m0", "tok-m1"]]


async def test_release_drops_the_batch_in_hand_unacked_and_tells_the_reader() -> None:
    """F7: past --release-after what is held is dropped for the gateway to redeliver; the
    reader waiting to hand over more is told to reopen later."""
    store = FakeStore(down=True)
    async with rig(batch_size=2, store=store) as r:
        first = receipts(2, "a")
        await r.batcher.accept(first)
        await eventually(lambda: not r.gate.is_up, "the gate to see the store down")
        waiting = asyncio.create_task(r.batcher.accept(receipts(2, "b")))
        done, _ = await asyncio.wait([waiting], timeout=0.05)
        assert not done, "the reader must wait while the batch in hand cannot commit"
        r.batcher.release()
        with pytest.raises(StreamReleased):
            await asyncio.wait_for(waiting, WITHIN)
        assert r.batcher.in_hand == 0
        assert r.acks.submitted == []
