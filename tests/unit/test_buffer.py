"""TimedBuffer, under the Batcher and the Acker: a batch goes on size, on time (by the injected
clock), on request and at close; a batch put back is taken first again; producers wait while
the buffer is full. A real event loop, a clock the test moves, no network."""

from __future__ import annotations

import asyncio

import pytest

from dlrfeed.buffer import TimedBuffer
from support.frozen_clock import FrozenClock

WITHIN = 5.0
"""Generous bound for something that must happen (the machine is shared and slow)."""


def buffer(
    clock: FrozenClock, *, batch_size: int = 3, linger: float = 0.01, capacity: int = 100
) -> TimedBuffer[int]:
    return TimedBuffer(batch_size=batch_size, linger=linger, capacity=capacity, clock=clock)


async def still_waiting(task: asyncio.Task[list[int]]) -> bool:
    """True if the task has not finished after a few of the buffer's timer periods. With the
    clock frozen the answer cannot depend on the machine's speed."""
    done, _ = await asyncio.wait([task], timeout=0.1)
    return not done


async def test_a_full_batch_goes_at_once_without_waiting_for_the_linger() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=3, linger=3600.0)
    await pending.put([1, 2, 3, 4])
    assert await asyncio.wait_for(pending.next_batch(), WITHIN) == [1, 2, 3]
    assert len(pending) == 1


async def test_a_partial_batch_goes_when_the_clock_passes_the_linger_and_not_before() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=3, linger=0.01)
    await pending.put([1])
    taking = asyncio.create_task(pending.next_batch())
    # The loop's timer fires many times over; the injected clock says the linger has not passed.
    assert await still_waiting(taking)
    clock.now += 0.01
    assert await asyncio.wait_for(taking, WITHIN) == [1]


async def test_a_batch_put_back_is_taken_first_again_and_at_once() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=2, linger=3600.0)
    await pending.put([1, 2, 3])
    failed = await pending.next_batch()
    pending.put_back(failed)
    # Its linger had passed when it was first taken: it does not wait for it again.
    assert await asyncio.wait_for(pending.next_batch(), WITHIN) == [1, 2]
    assert len(pending) == 1


async def test_a_partial_batch_put_back_does_not_wait_for_its_linger_again() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=3, linger=3600.0)
    await pending.put([1])
    pending.flush_soon()
    failed = await pending.next_batch()
    pending.put_back(failed)
    assert await asyncio.wait_for(pending.next_batch(), WITHIN) == [1]


async def test_flush_soon_lets_a_partial_batch_go_and_then_lingers_again() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=3, linger=3600.0)
    await pending.put([1])
    pending.flush_soon()
    assert await asyncio.wait_for(pending.next_batch(), WITHIN) == [1]
    await pending.put([2])
    assert await still_waiting(asyncio.create_task(pending.next_batch()))


async def test_close_hands_over_what_is_left_then_an_empty_batch() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=2, linger=3600.0)
    await pending.put([1, 2, 3])
    pending.close()
    batches = [await asyncio.wait_for(pending.next_batch(), WITHIN) for _ in range(3)]
    assert batches == [[1, 2], [3], []]


async def test_close_wakes_a_flusher_waiting_on_an_empty_buffer() -> None:
    pending = buffer(FrozenClock())
    taking = asyncio.create_task(pending.next_batch())
    await asyncio.sleep(0)
    pending.close()
    assert await asyncio.wait_for(taking, WITHIN) == []


async def test_a_producer_waits_while_the_buffer_is_full_until_a_batch_is_taken() -> None:
    clock = FrozenClock()
    pending = buffer(clock, batch_size=2, linger=3600.0, capacity=2)
    putting = asyncio.create_task(pending.put([1, 2]))
    done, _ = await asyncio.wait([putting], timeout=0.1)
    assert not done  # two held, capacity two: the producer waits (backpressure)
    assert await pending.next_batch() == [1, 2]
    await asyncio.wait_for(putting, WITHIN)


async def test_clear_drops_everything_and_releases_a_waiting_producer() -> None:
    pending = buffer(FrozenClock(), batch_size=5, linger=3600.0, capacity=2)
    putting = asyncio.create_task(pending.put([1, 2, 3]))
    await asyncio.sleep(0)
    assert pending.clear() == 3
    await asyncio.wait_for(putting, WITHIN)
    assert len(pending) == 0


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TimedBuffer[int](batch_size=0, linger=1.0, capacity=1)
