"""The Acker: one per process, acks tokens of committed batches in large, few calls (F8, F9).

Only tokens whose receipts are committed reach `submit()`. The Acker flushes when `ack_batch`
tokens are waiting or `ack_linger` has passed since the oldest arrived, one Ack call at a time.
A transient failure (UNAVAILABLE, DEADLINE_EXCEEDED) is retried with exponential backoff and
jitter for as long as the lease of the oldest receipt in the call could still be alive (F6);
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
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from dlrfeed.errors import FeedUnavailableError
from dlrfeed.feed.client import MAX_ACK_TOKENS, AckOutcome
from dlrfeed.lingering import linger

log = structlog.get_logger("dlrfeed.acker")


class AckSender(Protocol):
    """What the Acker needs of the feed client (FeedClient satisfies it)."""

    async def ack(self, tokens: Sequence[str]) -> AckOutcome: ...


@dataclass(slots=True)
class AckerStats:
    """Running totals, read by metrics and the periodic summary."""

    tokens_acked: int = 0
    already_gone: int = 0
    ack_calls: int = 0
    ack_retries: int = 0
    tokens_given_up: int = 0
    pending: int = 0


@dataclass(slots=True)
class _Waiter:
    target: int
    future: asyncio.Future[None] = field(repr=False)


AckObserver = Callable[[Sequence[float], float], None]
"""Called after each successful Ack with the receive times of its receipts and the ack time."""


class Acker:
    """Batches committed tokens into Ack calls; see the module docstring for the policy."""

    def __init__(
        self,
        sender: AckSender,
        *,
        ack_batch: int = 500,
        ack_linger: float = 0.05,
        lease_seconds: float = 120.0,
        max_pending: int = 20_000,
        observe: AckObserver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= ack_batch <= MAX_ACK_TOKENS:
            raise ValueError(f"ack_batch must be 1..{MAX_ACK_TOKENS}")
        self._sender = sender
        self._ack_batch = ack_batch
        self._ack_linger = ack_linger
        self._lease = lease_seconds
        self._max_pending = max(max_pending, ack_batch)
        self._observe = observe
        self._clock = clock
        self._tokens: list[str] = []
        self._received_at: list[float] = []
        self._first_pending_at = 0.0  # monotonic time the oldest pending token arrived
        self._submitted = 0  # tokens ever submitted
        self._done = 0  # tokens acked, already gone or given up, in submission order
        self._waiters: list[_Waiter] = []
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._flush_now = False
        self._closing = False
        self.stats = AckerStats()

    async def submit(self, tokens: Sequence[str], received_at: Sequence[float]) -> None:
        """Queue the tokens of one committed batch; waits only while `max_pending` are queued."""
        while len(self._tokens) >= self._max_pending:
            self._space.clear()
            await self._space.wait()
        if not self._tokens:
            self._first_pending_at = time.monotonic()
        self._tokens.extend(tokens)
        self._received_at.extend(received_at)
        self._submitted += len(tokens)
        self.stats.pending = len(self._tokens)
        if len(self._tokens) >= self._ack_batch or len(self._tokens) == len(tokens):
            # Full, or the first tokens after idle: the flusher starts its linger clock.
            self._wakeup.set()

    async def flush(self) -> None:
        """Return when every token submitted before this call is acked (or given up)."""
        target = self._submitted
        if self._done >= target:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(target, future))
        self._flush_now = True
        self._wakeup.set()
        await future

    def close(self) -> None:
        """After the final `flush()`: the flusher task ends once nothing is pending."""
        self._closing = True
        self._wakeup.set()

    async def run(self) -> None:
        """The flusher: one Ack call at a time, until `close()` and nothing is left."""
        while True:
            if not self._tokens:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await linger(self._wakeup, self._first_pending_at + self._ack_linger, self._call_ready)
            chunk = self._tokens[: self._ack_batch]
            times = self._received_at[: self._ack_batch]
            del self._tokens[: self._ack_batch]
            del self._received_at[: self._ack_batch]
            if self._tokens:
                self._first_pending_at = time.monotonic()
            else:
                self._flush_now = False
            self.stats.pending = len(self._tokens)
            self._space.set()
            await self._send(chunk, times)
            self._done += len(chunk)
            self._release_waiters()

    def _call_ready(self) -> bool:
        """A full call is waiting, or a flush or close asks for whatever is there."""
        return len(self._tokens) >= self._ack_batch or self._flush_now or self._closing

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

        def count_retry(state: RetryCallState) -> None:
            self.stats.ack_retries += 1
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "ack_retry", tokens=len(tokens), attempt=state.attempt_number, error=str(exc)
            )

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(FeedUnavailableError),
                wait=wait_exponential_jitter(multiplier=0.05, max=5.0, jitter=0.2),
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
