"""Batcher: one per reader — groups receipts, commits each batch once, then hands tokens to the
Acker (F8: ack only after commit).

Receipts wait in a `TimedBuffer`: a batch closes at `batch_size` receipts or `linger` seconds
after its first receipt. While one batch commits the reader fills the next (one in hand, one
committing), and waits when both are full — that is how readers "stop taking receipts" when the
store is slow or down. The commit of a batch runs as its own task: a cancelled batcher awaits it
before re-raising, so a batch is never abandoned half-way between commit and ack. A commit that
fails with `StoreUnavailableError` (any transient SQLSTATE class, or a lost connection)
committed nothing: the batch is put back in front of the buffer and taken again once the gate
sees the store up and a backoff delay has passed — or, on a Subscribe reader, it is dropped
unacked when the outage outlasts `--release-after` and the reader closes its stream (F7), for
the gateway to redeliver at once. A Pull reader's batch is kept and retried however long the
outage: the gateway gives pulled receipts back only when their lease ends (F6). The delay
matters when the server answers pings but refuses the batch (a table lock past lock_timeout, a
statement timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog

from dlrfeed.backoff import Backoff
from dlrfeed.buffer import TimedBuffer
from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.feed.modes import BACKLOG_FULL_BATCHES
from dlrfeed.feed.reader import StreamReleased

log = structlog.get_logger("dlrfeed.batcher")


class BatchStore(Protocol):
    """What the batcher needs of the store (dlrfeed.store.Store satisfies it)."""

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> Any: ...


class AckQueue(Protocol):
    """What the batcher needs of the Acker (dlrfeed.feed.acker.Acker satisfies it)."""

    async def submit(self, tokens: Sequence[str], received_at: Sequence[float]) -> None: ...

    async def flush(self) -> None: ...


class WriteGate(Protocol):
    """What the batcher needs of the store gate (StoreGate satisfies it)."""

    def mark_down(self, error: StoreUnavailableError) -> None: ...

    def mark_up(self) -> None: ...

    async def wait_up(self) -> None: ...


COMMIT_RETRY_DELAY = Backoff(initial=0.1, maximum=5.0)
"""Between attempts of a batch whose commit failed (the gate's wait for the store comes first)."""

CommitObserver = Callable[[Sequence[Receipt], Any, float], None]
"""Called after each commit with the batch, the store's IngestResult and the commit seconds."""


class Batcher:
    """Size/linger batching, shielded commit-then-ack, outage retry; see the module docstring.

    `on_batch_closed(size)` hears the size of every batch taken for a commit (auto mode's
    backlog sign); `clock` times the linger and the commits."""

    def __init__(
        self,
        name: str,
        *,
        login: str,
        store: BatchStore,
        acker: AckQueue,
        gate: WriteGate,
        batch_size: int,
        linger: float,
        on_commit: CommitObserver | None = None,
        on_batch_closed: Callable[[int], None] | None = None,
        retry_delay: Backoff = COMMIT_RETRY_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._login = login
        self._store = store
        self._acker = acker
        self._gate = gate
        self._on_commit = on_commit
        self._on_batch_closed = on_batch_closed
        self._retry_delay = retry_delay
        self._clock = clock
        self._pending: TimedBuffer[Receipt] = TimedBuffer(
            batch_size=batch_size, linger=linger, capacity=batch_size, clock=clock
        )
        self._idle = asyncio.Event()  # nothing pending and nothing committing
        self._idle.set()
        self._generation = 0  # bumped by release(): batches of an older one are dropped
        self._committing_size = 0
        self._failed_attempts = 0  # consecutive commits that found the store down
        self._batch_size = batch_size
        self._full_streak = 0  # batches in a row that closed full: the feed has more waiting

    @property
    def backlogged(self) -> bool:
        """Holding receipts while the last batches closed full: the gateway has more waiting
        (its backlog as this reader sees it). Holding is part of it: once the backlog is drained
        and the feed idles, no batch closes to end the streak."""
        return self._full_streak >= BACKLOG_FULL_BATCHES and self.in_hand > 0

    @property
    def in_hand(self) -> int:
        """Receipts received and not yet handed to the Acker (pending + committing)."""
        return len(self._pending) + self._committing_size

    # -- the reader's side (ReceiptSink) ------------------------------------------------------
    async def accept(self, receipts: list[Receipt]) -> None:
        """Add receipts to the batch in hand; waits while it is full and another commits."""
        if not receipts:
            return
        generation = self._generation
        self._idle.clear()
        await self._pending.put(receipts)
        if generation != self._generation:
            raise StreamReleased

    def discard_pending(self) -> int:
        """Forget receipts not yet committing: their stream ended, the gateway redelivers (F7)."""
        dropped = self._pending.clear()
        self._update_idle()
        return dropped

    async def drain(self) -> None:
        """Commit the batch in hand now, wait for every commit, then for their acks."""
        self._pending.flush_soon()
        await self._idle.wait()
        await self._acker.flush()

    async def wait_writable(self) -> None:
        await self._gate.wait_up()

    def release(self) -> None:
        """The store has been down past `--release-after` and the reader closes its stream:
        drop everything in hand, unacked; the gateway redelivers (F7)."""
        self._generation += 1
        dropped = self.discard_pending()
        log.warning("batch_released", batcher=self.name, dropped=dropped)

    # -- the daemon's side ----------------------------------------------------------------

    def abandon(self) -> None:
        """Teardown after a failure or timeout: drop what is in hand, unacked (redelivered)."""
        self._generation += 1
        self.discard_pending()

    async def run(self) -> None:
        """The flusher task: take batches on size or linger and commit them one at a time."""
        while True:
            batch = await self._pending.next_batch()
            self._full_streak = self._full_streak + 1 if len(batch) >= self._batch_size else 0
            if self._on_batch_closed is not None:
                self._on_batch_closed(len(batch))
            committed = await self._commit_shielded(batch)
            self._update_idle()
            if not committed:
                # The gate's prober pings with backoff while the store is down; a store that
                # answers but refused the batch is tried again after a backoff of its own.
                pause = self._retry_delay.delay(self._failed_attempts)
                await asyncio.gather(self._gate.wait_up(), asyncio.sleep(pause))

    def _update_idle(self) -> None:
        if not self._pending and not self._committing_size:
            self._idle.set()

    async def _commit_shielded(self, batch: list[Receipt]) -> bool:
        """Run store-then-ack as its own task; if we are cancelled, finish it, then re-raise."""
        task = asyncio.create_task(
            self._store_then_ack(batch, self._generation), name=f"commit-{self.name}"
        )
        self._committing_size = len(batch)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # A half-done batch is never abandoned: between commit and ack it must reach the
            # Acker, or the receipts stay stored-but-unacked (C7 would still hold, but later).
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    continue
            raise
        finally:
            self._committing_size = 0

    async def _store_then_ack(self, batch: list[Receipt], generation: int) -> bool:
        """One commit attempt; False when the store was down (the batch is put back)."""
        started = self._clock()
        try:
            result = await self._store.ingest(self._login, batch)
        except StoreUnavailableError as exc:
            self._gate.mark_down(exc)
            if generation != self._generation:
                # F7: the stream was released while the store was down: nothing committed,
                # nothing acked; the gateway redelivers these receipts.
                log.warning("batch_dropped", batcher=self.name, receipts=len(batch))
                return False
            self._failed_attempts += 1
            log.warning(
                "batch_retry",
                batcher=self.name,
                receipts=len(batch),
                attempt=self._failed_attempts,
                error=str(exc),
            )
            self._pending.put_back(batch)
            return False
        self._failed_attempts = 0
        self._gate.mark_up()
        seconds = self._clock() - started
        if self._on_commit is not None:
            self._on_commit(batch, result, seconds)
        log.debug("batch_committed", batcher=self.name, receipts=len(batch), ms=seconds * 1000)
        # F8: only now may the tokens be acked.
        await self._acker.submit(
            [receipt.ack_token for receipt in batch], [receipt.received_at for receipt in batch]
        )
        return True
