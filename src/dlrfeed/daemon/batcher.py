"""Batcher: one per reader — groups receipts, commits each batch once, then hands tokens to the
Acker (F8: ack only after commit).

A batch closes at `batch_size` receipts or `linger` seconds after its first receipt. While one
batch commits the reader fills the next (one in hand, one committing), and waits when both are
full — that is how readers "stop taking receipts" when the store is slow or down. The commit of
a batch runs as its own task: a cancelled batcher awaits it before re-raising, so a batch is
never abandoned half-way between commit and ack. A commit that fails with
`StoreUnavailableError` committed nothing and is retried whole, with backoff, until the store is
back — or until the gate releases the streams (F7), when the batch is dropped unacked for the
gateway to redeliver.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog

from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.feed.acker import Acker
from dlrfeed.feed.reader import StreamReleased
from dlrfeed.lingering import linger

from .store_gate import StoreGate

log = structlog.get_logger("dlrfeed.batcher")

BACKLOG_FULL_BATCHES = 2
"""Consecutive full batches that mean "a backlog" to auto mode (the reader then uses Pull)."""


class BatchStore(Protocol):
    """What the batcher needs of the store (dlrfeed.store.Store satisfies it)."""

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> Any: ...


CommitObserver = Callable[[Sequence[Receipt], Any, float], None]
"""Called after each commit with the batch, the store's IngestResult and the commit seconds."""


class Batcher:
    """Size/linger batching, shielded commit-then-ack, outage retry; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        login: str,
        store: BatchStore,
        acker: Acker,
        gate: StoreGate,
        batch_size: int,
        linger: float,
        on_commit: CommitObserver | None = None,
    ) -> None:
        self.name = name
        self._login = login
        self._store = store
        self._acker = acker
        self._gate = gate
        self._batch_size = batch_size
        self._linger_s = linger
        self._on_commit = on_commit
        self._pending: list[Receipt] = []
        self._first_at = 0.0
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()  # nothing pending and nothing committing
        self._idle.set()
        self._flush_now = False
        self._generation = 0  # bumped by release(): batches of an older one are dropped
        self._committing: asyncio.Task[None] | None = None
        self._committing_size = 0
        self._full_streak = 0  # consecutive batches closed by size, not by linger

    @property
    def in_hand(self) -> int:
        """Receipts received and not yet handed to the Acker (pending + committing)."""
        return len(self._pending) + self._committing_size

    # -- the reader's side (ReceiptSink) ------------------------------------------------------
    async def accept(self, receipts: list[Receipt]) -> None:
        """Add receipts to the batch in hand; waits while it is full and another commits."""
        generation = self._generation
        if not self._pending:
            self._first_at = time.monotonic()
            self._idle.clear()
            self._wakeup.set()
        self._pending.extend(receipts)
        if len(self._pending) >= self._batch_size:
            self._wakeup.set()
            while len(self._pending) >= self._batch_size and generation == self._generation:
                self._space.clear()
                await self._space.wait()
        if generation != self._generation:
            raise StreamReleased

    def discard_pending(self) -> int:
        """Forget receipts not yet committing: their stream ended, the gateway redelivers (F7)."""
        dropped = len(self._pending)
        self._pending = []
        self._space.set()
        self._update_idle()
        return dropped

    async def drain(self) -> None:
        """Commit the batch in hand now, wait for every commit, then for their acks."""
        if self._pending:
            self._flush_now = True
            self._wakeup.set()
        await self._idle.wait()
        await self._acker.flush()

    async def wait_writable(self) -> None:
        await self._gate.wait_up()

    def backlogged(self) -> bool:
        """Two batches in a row closed full: the feed outruns the commits (a backlog)."""
        return self._full_streak >= BACKLOG_FULL_BATCHES

    def forget_backlog(self) -> None:
        """A stream opens: batches closed before it (e.g. of Pulls) say nothing about it."""
        self._full_streak = 0

    # -- the daemon's side ----------------------------------------------------------------
    def release(self) -> None:
        """The store has been down past `--release-after`: drop everything in hand, unacked;
        the reader closes its stream and the gateway redelivers (F7)."""
        self._generation += 1
        dropped = self.discard_pending()
        log.warning("batch_released", batcher=self.name, dropped=dropped)

    def abandon(self) -> None:
        """Teardown after a failure or timeout: drop what is in hand, unacked (redelivered)."""
        self._generation += 1
        self.discard_pending()

    async def run(self) -> None:
        """The flusher task: close batches on size or linger and commit them one at a time."""
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await linger(self._wakeup, self._first_at + self._linger_s, self._batch_ready)
            if not self._pending:
                continue
            batch = self._pending[: self._batch_size]
            del self._pending[: self._batch_size]
            self._full_streak = self._full_streak + 1 if len(batch) == self._batch_size else 0
            if self._pending:
                self._first_at = time.monotonic()
            else:
                self._flush_now = False
            self._space.set()
            await self._commit_shielded(batch)
            self._update_idle()

    def _batch_ready(self) -> bool:
        return len(self._pending) >= self._batch_size or self._flush_now

    def _update_idle(self) -> None:
        if not self._pending and self._committing is None:
            self._idle.set()

    async def _commit_shielded(self, batch: list[Receipt]) -> None:
        """Run store-then-ack as its own task; if we are cancelled, finish it, then re-raise."""
        task = asyncio.create_task(
            self._store_then_ack(batch, self._generation), name=f"commit-{self.name}"
        )
        self._committing = task
        self._committing_size = len(batch)
        try:
            await asyncio.shield(task)
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
            self._committing = None
            self._committing_size = 0

    async def _store_then_ack(self, batch: list[Receipt], generation: int) -> None:
        attempt = 0
        while True:
            if generation != self._generation:
                # F7: the stream was released while the store was down: nothing committed,
                # nothing acked; the gateway redelivers these receipts.
                log.warning("batch_dropped", batcher=self.name, receipts=len(batch))
                return
            started = time.monotonic()
            try:
                result = await self._store.ingest(self._login, batch)
            except StoreUnavailableError as exc:
                self._gate.mark_down(exc)
                attempt += 1
                log.warning("batch_retry", batcher=self.name, receipts=len(batch), attempt=attempt)
                # The gate's prober pings with backoff; retry as soon as it sees the store.
                while generation == self._generation and not await self._gate.wait_up_for(0.5):
                    pass
                continue
            self._gate.mark_up()
            break
        seconds = time.monotonic() - started
        if self._on_commit is not None:
            self._on_commit(batch, result, seconds)
        log.debug("batch_committed", batcher=self.name, receipts=len(batch), ms=seconds * 1000)
        # F8: only now may the tokens be acked.
        await self._acker.submit(
            [receipt.ack_token for receipt in batch], [receipt.received_at for receipt in batch]
        )
