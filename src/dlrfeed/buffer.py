"""TimedBuffer: the one "flush on size or on time" of dlrfeed, under the Batcher and the Acker.

Items wait in order until a batch is due: `batch_size` of them are there, `linger` seconds have
passed since the oldest arrived, or a flush was asked for (`flush_soon`, `close`). One flusher
takes batches with `next_batch()`; if it cannot deliver one it may `put_back` the batch in
front, to be taken again first. Producers wait in `put()` while `capacity` items are held —
that is the backpressure that makes readers stop taking receipts when the store is slow or
down. After `close()` the flusher gets what is left without waiting, then an empty batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class TimedBuffer(Generic[T]):
    """Size-or-time batches with put-back and a bounded wait for space; see the module doc."""

    def __init__(
        self,
        *,
        batch_size: int,
        linger: float,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if batch_size < 1 or capacity < 1:
            raise ValueError("batch_size and capacity must be at least 1")
        self._batch_size = batch_size
        self._linger = linger
        self._capacity = capacity
        self._clock = clock
        self._items: list[T] = []
        self._oldest_at = 0.0  # clock time the oldest item arrived (or was put back)
        self._flush_requested = False
        self._closed = False
        self._clears = 0  # bumped by clear(): a producer waiting for space stops waiting
        self._wakeup = asyncio.Event()  # new items, a flush request, close
        self._space = asyncio.Event()
        self._space.set()

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, items: Sequence[T]) -> None:
        """Add items at the back, then wait while `capacity` items are held (until the flusher
        takes a batch, or `clear()` empties the buffer)."""
        if not items:
            return
        was_empty = not self._items
        if was_empty:
            self._oldest_at = self._clock()
        self._items.extend(items)
        if was_empty or len(self._items) >= self._batch_size:
            self._wakeup.set()  # the flusher starts its linger clock, or a batch is full
        clears = self._clears
        while len(self._items) >= self._capacity and clears == self._clears:
            self._space.clear()
            await self._space.wait()

    def put_back(self, batch: Sequence[T]) -> None:
        """Return a batch the flusher could not deliver, in front: it is taken first again, and
        at once (its linger has passed already)."""
        if not batch:
            return
        self._oldest_at = self._clock() - self._linger
        self._items[:0] = batch
        self._wakeup.set()

    def flush_soon(self) -> None:
        """Let every held item go without waiting for size or time (until the buffer is empty)."""
        if self._items:
            self._flush_requested = True
            self._wakeup.set()

    def clear(self) -> int:
        """Forget every held item (their owner gave up on them); returns how many."""
        dropped = len(self._items)
        self._items = []
        self._flush_requested = False
        self._clears += 1
        self._space.set()
        return dropped

    def close(self) -> None:
        """No more waiting: the flusher gets what is left at once, then an empty batch."""
        self._closed = True
        self._wakeup.set()

    async def next_batch(self) -> list[T]:
        """Wait until a batch is due and take it (at most `batch_size` items, oldest first);
        an empty list once closed and empty."""
        while True:
            if not self._items:
                if self._closed:
                    return []
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._due():
                break
            remaining = self._oldest_at + self._linger - self._clock()
            if remaining <= 0:
                break
            self._wakeup.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                continue  # look at the clock again: it, not the loop's timer, says when
        batch = self._items[: self._batch_size]
        del self._items[: self._batch_size]
        if self._items:
            self._oldest_at = self._clock()
        else:
            self._flush_requested = False
        self._space.set()
        return batch

    def _due(self) -> bool:
        return len(self._items) >= self._batch_size or self._flush_requested or self._closed
