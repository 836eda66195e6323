"""The Acker: one per process, acks tokens of committed batches in large, few calls (F8, F9).

Only tokens whose receipts are committed reach `submit()`. The Acker flushes when `ack_batch`
tokens are waiting or `ack_linger` has passed since the oldest arrived (a `TimedBuffer`), one Ack
call at a time. A transient failure (UNAVAILABLE, DEADLINE_EXCEEDED) is retried after the
project's one retry delay (`dlrfeed.backoff`, 50 ms doubling to 5 s, jittered) for as long as the
lease of the oldest receipt in the call could still be alive (F6);
after that the gateway redelivers them anyway and the store recognises the repeats (C1, C7).
`already_gone` counts as done (F9).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from dlrfeed.backoff import Backoff
from dlrfeed.buffer import TimedBuffer
from dlrfeed.errors import FeedUnavailableError
from dlrfeed.feed.client import MAX_ACK_TOKENS, AckOutcome

log = structlog.get_logger("dlrfeed.acker")


class AckSender(Protocol):
    """What the Acker needs of the feed client (FeedClient satisfies it)."""

    async def ack(self, tokens: Sequence[str]) -> AckOutcome: ...


@dataclass(slots=True)
class AckerStats:
    """Running totals: the one source of the ack counters, read by metrics and the summary."""

    tokens_acked: int = 0
    already_gone: int = 0
    ack_calls: int = 0
    ack_retries: int = 0
    tokens_given_up: int = 0


@dataclass(slots=True)
class _Waiter:
    target: int
    future: asyncio.Future[None] = field(repr=False)


ACK_RETRY_DELAY = Backoff(initial=0.05, maximum=5.0)
"""Between Ack attempts: short at first (a blip), capped well inside the lease (F6)."""

AckObserver = Callable[[Sequence[float], float], None]
"""Called after each successful Ack with the receive times of its receipts and the ack time."""


class Acker:
    """Batches committed tokens into Ack calls; see the module docstring for the policy.

    `clock` is the wall clock the receive times were taken with (lease, latency); `monotonic`
    times the linger."""

    def __init__(
        self,
        sender: AckSender,
        *,
        ack_batch: int = 500,
        ack_linger: float = 0.05,
        lease_seconds: float = 120.0,
        max_pending: int = 20_000,
        observe: AckObserver | None = None,
        retry_delay: Backoff = ACK_RETRY_DELAY,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= ack_batch <= MAX_ACK_TOKENS:
            raise ValueError(f"ack_batch must be 1..{MAX_ACK_TOKENS}")
        self._sender = sender
        self._lease = lease_seconds
        self._observe = observe
        self._retry_delay = retry_delay
        self._clock = clock
        # (token, received_at) pairs: the receive time travels with its token.
        self._pending: TimedBuffer[tuple[str, float]] = TimedBuffer(
            batch_size=ack_batch,
            linger=ack_linger,
            capacity=max(max_pending, ack_batch),
            clock=monotonic,
        )
        self._submitted = 0  # tokens ever submitted
        self._done = 0  # tokens acked, already gone or given up, in submission order
        self._waiters: list[_Waiter] = []
        self.stats = AckerStats()

    async def submit(self, tokens: Sequence[str], received_at: Sequence[float]) -> None:
        """Queue the tokens of one committed batch; waits only while `max_pending` are queued."""
        self._submitted += len(tokens)
        await self._pending.put(list(zip(tokens, received_at, strict=True)))

    @property
    def pending(self) -> int:
        """Tokens queued and not yet in an Ack call (part of the in-flight gauge)."""
        return len(self._pending)

    async def flush(self) -> None:
        """Return when every token submitted before this call is acked (or given up)."""
        target = self._submitted
        if self._done >= target:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(target, future))
        self._pending.flush_soon()
        await future

    def close(self) -> None:
        """After the final `flush()`: the flusher task ends once nothing is pending."""
        self._pending.close()

    async def run(self) -> None:
        """The flusher: one Ack call at a time, until `close()` and nothing is left."""
        while chunk := await self._pending.next_batch():
            tokens = [token for token, _ in chunk]
            received_at = [at for _, at in chunk]
            await self._send(tokens, received_at)
            self._done += len(chunk)
            self._release_waiters()

    def _release_waiters(self) -> None:
        still: list[_Waiter] = []
        for waiter in self._waiters:
            if waiter.target <= self._done:
                if not waiter.future.done():
                    waiter.future.set_result(None)
            else:
                still.append(waiter)
        self._waiters = still

    async def _send(self, tokens: list[str], received_at: list[float]) -> None:
        oldest = min(received_at)
        lease_deadline = oldest + self._lease

        def lease_has_run_out(state: RetryCallState) -> bool:
            # Stop retrying once the oldest receipt's lease has surely run out (F6): the
            # gateway then redelivers, and the store recognises the repeat (C7).
            return self._clock() >= lease_deadline

        def delay(state: RetryCallState) -> float:
            return self._retry_delay.delay(state.attempt_number)

        def count_retry(state: RetryCallState) -> None:
            self.stats.ack_retries += 1
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "ack_retry", tokens=len(tokens), attempt=state.attempt_number, error=str(exc)
            )

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(FeedUnavailableError),
                wait=delay,
                stop=lease_has_run_out,
                before_sleep=count_retry,
                reraise=True,
            ):
                with attempt:
                    outcome = await self._sender.ack(tokens)
        except FeedUnavailableError as exc:
            self.stats.tokens_given_up += len(tokens)
            log.error("ack_given_up", tokens=len(tokens), error=str(exc))  # noqa: TRY400 - expected outcome, no traceback
            return
        now = self._clock()
        self.stats.ack_calls += 1
        self.stats.tokens_acked += outcome.acked
        self.stats.already_gone += outcome.already_gone
        if self._observe is not None:
            self._observe(received_at, now)
        log.debug(
            "ack_sent",
            tokens=len(tokens),
            acked=outcome.acked,
            already_gone=outcome.already_gone,
            oldest_age_s=round(now - oldest, 3),
        )
