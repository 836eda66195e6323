"""The Acker (F8, F9, F6): batching, linger, retries within the lease, already_gone as done."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import pytest

from dlrfeed.backoff import Backoff
from dlrfeed.errors import AuthenticationError, FeedUnavailableError
from dlrfeed.feed.acker import Acker
from dlrfeed.feed.client import AckOutcome


class RecordingGateway:
    """Answers Ack calls like the gateway would; can fail the first `failures` calls."""

    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.failures = failures
        self.error = error or FeedUnavailableError("UNAVAILABLE")
        self.gone: set[str] = set()
        self.called = asyncio.Event()

    async def ack(self, tokens: Sequence[str]) -> AckOutcome:
        if self.failures:
            self.failures -= 1
            raise self.error
        self.calls.append(list(tokens))
        self.called.set()
        gone = sum(1 for t in tokens if t in self.gone)
        self.gone.update(tokens)
        return AckOutcome(acked=len(tokens) - gone, already_gone=gone)


def quick_retries() -> Backoff:
    """The Acker's retry delay, shortened and seeded for tests."""
    return Backoff(0.001, 0.01, rng=random.Random(5))


def tokens(n: int, prefix: str = "t") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


async def run_acker(acker: Acker) -> asyncio.Task[None]:
    return asyncio.create_task(acker.run(), name="acker-under-test")


async def stop(acker: Acker, task: asyncio.Task[None]) -> None:
    await acker.flush()
    acker.close()
    await asyncio.wait_for(task, 5)


async def test_flushes_full_calls_at_ack_batch_never_above_1000() -> None:
    """F9: batches of `ack_batch` tokens; a call never carries more than 1000."""
    gateway = RecordingGateway()
    acker = Acker(gateway, ack_batch=500, ack_linger=10.0)
    task = await run_acker(acker)
    now = time.time()
    await acker.submit(tokens(1200), [now] * 1200)
    await stop(acker, task)
    assert [len(call) for call in gateway.calls] == [500, 500, 200]
    assert acker.stats.tokens_acked == 1200


async def test_partial_batch_waits_at_most_the_linger() -> None:
    """--ack-linger-ms: ten tokens go out after the linger, not when the batch fills."""
    gateway = RecordingGateway()
    acker = Acker(gateway, ack_batch=500, ack_linger=0.05)
    task = await run_acker(acker)
    started = time.monotonic()
    await acker.submit(tokens(10), [time.time()] * 10)
    await asyncio.wait_for(gateway.called.wait(), 5)
    waited = time.monotonic() - started
    assert len(gateway.calls) == 1
    assert 0.04 <= waited < 3.0  # well under the 5 s a batch that waits to fill would take
    await stop(acker, task)


async def test_the_linger_is_timed_by_the_injected_clock() -> None:
    """A partial call waits for the linger on the Acker's own monotonic clock, not the loop's."""
    now = [500.0]
    gateway = RecordingGateway()
    acker = Acker(gateway, ack_batch=500, ack_linger=0.01, monotonic=lambda: now[0])
    task = await run_acker(acker)
    await acker.submit(tokens(3), [time.time()] * 3)
    done, _ = await asyncio.wait([asyncio.ensure_future(gateway.called.wait())], timeout=0.1)
    assert not done  # the clock stands still: however long the loop waits, no linger passed
    assert acker.pending == 3
    now[0] += 0.01
    await asyncio.wait_for(gateway.called.wait(), 5)
    assert gateway.calls == [tokens(3)]
    await stop(acker, task)


async def test_submit_waits_while_max_pending_tokens_are_queued() -> None:
    """Bounded memory: a committed batch waits for room rather than growing the queue."""
    gateway = RecordingGateway()
    acker = Acker(gateway, ack_batch=10, ack_linger=3600.0, max_pending=10)
    submitting = asyncio.create_task(acker.submit(tokens(10), [time.time()] * 10))
    done, _ = await asyncio.wait([submitting], timeout=0.05)
    assert not done
    task = await run_acker(acker)
    await asyncio.wait_for(submitting, 5)
    await stop(acker, task)
    assert gateway.calls == [tokens(10)]


async def test_transient_failures_are_retried_and_already_gone_counts_as_done() -> None:
    """F9: a repeated Ack after UNAVAILABLE is safe; already_gone is not an error."""
    gateway = RecordingGateway(failures=2)
    gateway.gone = {"t0", "t1"}
    acker = Acker(gateway, ack_batch=10, ack_linger=0.0, retry_delay=quick_retries())
    task = await run_acker(acker)
    await acker.submit(tokens(5), [time.time()] * 5)
    await stop(acker, task)
    assert acker.stats.ack_retries == 2
    assert acker.stats.already_gone == 2
    assert acker.stats.tokens_acked == 3


async def test_gives_up_once_the_lease_has_surely_run_out() -> None:
    """F6: past the lease the gateway redelivers anyway (C7); the Acker stops retrying and
    flush() still returns."""
    gateway = RecordingGateway(failures=10_000)
    acker = Acker(
        gateway, ack_batch=10, ack_linger=0.0, lease_seconds=0.3, retry_delay=quick_retries()
    )
    task = await run_acker(acker)
    await acker.submit(tokens(5), [time.time()] * 5)
    await asyncio.wait_for(acker.flush(), 10)
    assert acker.stats.tokens_given_up == 5
    assert gateway.calls == []
    acker.close()
    await task


async def test_fatal_errors_stop_the_acker() -> None:
    """UNAUTHENTICATED is not retried: the error ends the task and so the daemon."""
    gateway = RecordingGateway(failures=1, error=AuthenticationError("refused"))
    acker = Acker(gateway, ack_batch=10, ack_linger=0.0)
    task = await run_acker(acker)
    await acker.submit(tokens(3), [time.time()] * 3)
    with pytest.raises(AuthenticationError):
        await asyncio.wait_for(task, 5)


async def test_observer_sees_receive_to_ack_latency() -> None:
    """Receive→ack latency is measured per receipt (F6)."""
    seen: list[float] = []
    acker = Acker(
        RecordingGateway(),
        ack_batch=10,
        ack_linger=0.0,
        observe=lambda received, acked: seen.extend(acked - t for t in received),
    )
    task = await run_acker(acker)
    await acker.submit(tokens(3), [time.time() - 2.0] * 3)
    await stop(acker, task)
    assert len(seen) == 3
    assert all(1.9 < latency < 5 for latency in seen)


def test_ack_batch_above_the_gateway_limit_is_refused() -> None:
    """F9: more than 1000 tokens per call is INVALID_ARGUMENT at the gateway."""
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        Acker(RecordingGateway(), ack_batch=1001)
