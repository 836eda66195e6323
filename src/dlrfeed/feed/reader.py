"""FeedReader: one reader of the login's queue, on Subscribe or Pull, reconnecting politely.

A reader hands what it receives to a `ReceiptSink` (the daemon's batcher), which commits and
acks. The reader owns only the feed side: running the RPC its `ModePolicy` names
(`dlrfeed.feed.modes`: fixed, or auto), reconnect backoff with jitter (`dlrfeed.backoff`) and a
cap on reopens per 10 s (reconnect storms are the most reported failure of peer clients), and
closing its stream when the store has been down long enough that the gateway should give the
receipts to someone else (F7). It tells the policy what happens and asks it which RPC to use;
the policy decides.

A store outage past `--release-after` gives back only what a closed stream gives back: a
Subscribe reader drops what it holds and closes its stream, and the gateway redelivers at once
(F7). A Pull reader keeps what it pulled and stores it once the store is back: the gateway
would hold those receipts leased until their lease ended (F6), since no call of the feed gives
a lease back. The sink therefore never holds pulled receipts while a stream is open: a reader
commits what it pulled before it subscribes. And a Pull reader pulls only while the store
takes writes, so it leases nothing it cannot store.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from dlrfeed.backoff import Backoff
from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import FeedUnavailableError
from dlrfeed.feed.client import (
    FeedClient,
    FeedUnimplementedError,
    PullCall,
    SubscribeStream,
    is_own_cancellation,
)
from dlrfeed.feed.modes import AutoPolicy, AutoSettings, FixedMode, ModePolicy
from dlrfeed.feed.modes import Mode as Mode  # re-exported: `--mode` is the reader's setting

log = structlog.get_logger("dlrfeed.reader")


class ReceiptSink(Protocol):
    """Where a reader puts receipts (the daemon's per-reader batcher)."""

    async def accept(self, receipts: list[Receipt]) -> None:
        """Take receipts; waits while the batch in hand is full (backpressure)."""

    def discard_pending(self) -> int:
        """Forget receipts not yet handed to a commit (their stream was released, F7)."""

    async def drain(self) -> None:
        """Commit what is in hand and wait until its tokens are acked."""

    async def wait_writable(self) -> None:
        """Return when the store accepts writes (at once when it is up)."""

    @property
    def in_hand(self) -> int:
        """Receipts accepted and not yet acked."""

    def release(self) -> None:
        """Drop what is in hand unacked (a commit already in flight is acked if it succeeds);
        the reader closes its stream and the gateway redelivers (F7)."""


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    """The knobs of one reader; see `dlrfeed run --help` for their meaning."""

    mode: Mode = Mode.AUTO
    window: int = 1000
    pull_max: int = 500
    pull_wait_seconds: int = 20
    max_reopens_per_10s: int = 5
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    auto_cooldown: float = 60.0
    auto_pull_rate: float = 2000.0
    """In auto mode, a Subscribe stream carrying this many receipts/s over half a second is
    draining a backlog (or a heavy live flow): Pull costs far less CPU per receipt."""
    auto_failures: int = 3
    """In auto mode, this many stream failures within `auto_cooldown` switch to Pull."""


def mode_policy(settings: ReaderSettings, batch_size: int) -> ModePolicy:
    """The policy `settings.mode` asks for; `batch_size` is the reader's batcher's (a full
    batch is one of auto's backlog signs)."""
    if settings.mode is not Mode.AUTO:
        return FixedMode(settings.mode)
    return AutoPolicy(
        AutoSettings(
            batch_size=batch_size,
            pull_max=settings.pull_max,
            cooldown=settings.auto_cooldown,
            pull_rate=settings.auto_pull_rate,
            failures=settings.auto_failures,
        )
    )


class StreamReleased(Exception):  # noqa: N818 - a signal between reader and sink, not a fault
    """The sink dropped what it held (store outage past --release-after): reopen later (F7)."""


class _Released(Exception):  # noqa: N818 - internal control flow
    """Internal: our own cancel() ended the current call (release or stop)."""


class FeedReader:
    """One reader task; `run()` until `stop_reading()` + `close()`, raising only fatal errors.

    `policy` defaults to `mode_policy(settings, settings.pull_max)`; the daemon passes the one
    its batcher also feeds. `clock` is the monotonic time the policy and the reopen cap see."""

    def __init__(
        self,
        name: str,
        client: FeedClient,
        sink: ReceiptSink,
        settings: ReaderSettings,
        *,
        policy: ModePolicy | None = None,
        on_state: Callable[[str, Mode | None], None] | None = None,
        on_received: Callable[[Mode, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._client = client
        self._sink = sink
        self._settings = settings
        self._policy = policy if policy is not None else mode_policy(settings, settings.pull_max)
        self._on_state = on_state
        self._on_received = on_received
        self._clock = clock
        self._reconnect_delay = Backoff(settings.backoff_initial, settings.backoff_max)
        self._stopping = False
        self._closed = asyncio.Event()
        self._release_requested = False
        self._current: SubscribeStream | PullCall | None = None
        self._holding: Mode | None = None  # the RPC whose receipts the sink may hold
        self._pull_done = asyncio.Event()
        self._pull_done.set()
        self._opens: deque[float] = deque()
        self._attempt = 0
        self.reconnects = 0
        """Streams/Pull loops reopened after a transient failure (a metric)."""
        self.mode: Mode | None = None
        """The RPC in use right now (None while reconnecting); read by /healthz and metrics."""

    # -- control, called by the daemon -------------------------------------------------------
    def stop_reading(self) -> None:
        """Take no more receipts; the open stream stays open until `close()` (acks first)."""
        self._stopping = True

    async def settle(self, grace: float) -> None:
        """Give an in-flight Pull up to `grace` seconds to return, so its leased receipts are
        committed rather than left leased until the lease runs out (F6)."""
        if self._pull_done.is_set():
            return
        try:
            async with asyncio.timeout(grace):
                await self._pull_done.wait()
        except TimeoutError:
            return

    def close(self) -> None:
        """End the current call; `run()` returns. Only after the acks are flushed (F7)."""
        self._stopping = True
        self._closed.set()
        if self._current is not None:
            self._current.cancel()

    def release(self) -> None:
        """The store has been down too long: close the stream so the gateway releases our
        receipts at once to readers that can store them (F7); reopen when the store is back.

        A Pull reader keeps what it pulled (see the module docstring): dropped, those receipts
        would stay leased until their lease ended (F6). Its Pull in flight is left to return:
        cancelled, what the gateway had leased for it would be lost the same way."""
        if self._holding is Mode.PULL:
            if not self._stopping:
                log.warning("pulled_receipts_kept", reader=self.name, kept=self._sink.in_hand)
            return
        # Even while stopping: the drain of a stop cannot commit them either, and dropped
        # unacked they go to other readers at once (F7) instead of at the stop's timeout.
        self._sink.release()
        if self._stopping:
            return
        self._release_requested = True
        if self._current is not None:
            self._current.cancel()

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Read until closed; transient feed errors reconnect, fatal ones propagate."""
        while not self._stopping:
            await self._sink.wait_writable()
            if self._stop_requested():
                break
            await self._respect_reopen_cap()
            if self._stop_requested():
                break
            mode = self._policy.mode(self._clock())
            try:
                if mode == Mode.SUBSCRIBE:
                    if self._holding is Mode.PULL:
                        # A stream's release drops what the sink holds: commit what was pulled
                        # first (the module docstring).
                        await self._sink.drain()
                        if self._stop_requested():
                            continue  # no stream opened while stopping
                    await self._run_subscribe()
                else:
                    await self._run_pull()
            except (_Released, StreamReleased):
                self._policy.closed()
                dropped = self._sink.discard_pending()
                if self._release_requested:
                    self._release_requested = False
                    log.warning("stream_released", reader=self.name, mode=mode, dropped=dropped)
                continue
            except FeedUnimplementedError:
                if self._settings.mode != Mode.AUTO or mode == Mode.PULL:
                    raise
                self._policy.unimplemented(self._clock())
                log.warning("subscribe_unimplemented", reader=self.name, fallback="pull")
                continue
            except FeedUnavailableError as exc:
                self._set_state(None)
                dropped = self._sink.discard_pending() if mode == Mode.SUBSCRIBE else 0
                self._policy.failed(mode, self._clock())
                self._log_switch()
                self.reconnects += 1
                delay = self._backoff()
                log.warning(
                    "reader_reconnect",
                    reader=self.name,
                    mode=mode,
                    error=str(exc),
                    dropped=dropped,
                    retry_in_s=round(delay, 3),
                )
                await self._sleep(delay)
            else:
                self._policy.closed()
            finally:
                self._set_state(None)

    async def _run_subscribe(self) -> None:
        stream = self._client.subscribe(self._settings.window)
        self._current = stream
        self._holding = Mode.SUBSCRIBE
        self._set_state(Mode.SUBSCRIBE)
        policy = self._policy
        policy.opened(Mode.SUBSCRIBE, self._clock())
        try:
            while True:
                try:
                    receipts = await stream.read()
                except asyncio.CancelledError:
                    if is_own_cancellation(stream.cancelled_by_us):
                        raise _Released from None
                    raise
                if receipts is None:
                    raise FeedUnavailableError("the gateway ended the Subscribe stream")
                if self._stopping:
                    # F7: what arrives after stop stays unacked and is released at close.
                    await self._closed.wait()
                    return
                self._attempt = 0
                # One hand-off per group of stream messages, like a Pull's response.
                if self._on_received is not None:
                    self._on_received(Mode.SUBSCRIBE, len(receipts))
                await self._sink.accept(receipts)
                now = self._clock()
                policy.streamed(len(receipts), now)
                if policy.mode(now) is not Mode.SUBSCRIBE:
                    # A backlog: Pull drains it for a fraction of the CPU per receipt
                    # (docs/daemon.md). Commit and ack what we hold first, so closing the
                    # stream releases nothing already stored (F7).
                    await self._sink.drain()
                    self._log_switch()
                    return
        finally:
            self._current = None
            stream.cancel()

    async def _run_pull(self) -> None:
        settings = self._settings
        policy = self._policy
        self._holding = Mode.PULL
        self._set_state(Mode.PULL)
        policy.opened(Mode.PULL, self._clock())
        while not self._stopping:
            # Lease nothing the store cannot take now: the receipts stay queued for readers
            # that can store them.
            await self._sink.wait_writable()
            if self._stop_requested():
                return
            call = self._client.pull(settings.pull_max, settings.pull_wait_seconds)
            self._current = call
            self._pull_done.clear()
            try:
                receipts = await call.receipts()
            except asyncio.CancelledError:
                if is_own_cancellation(call.cancelled_by_us):
                    raise _Released from None
                raise
            finally:
                self._current = None
                self._pull_done.set()
            self._attempt = 0
            if receipts:
                if self._on_received is not None:
                    self._on_received(Mode.PULL, len(receipts))
                await self._sink.accept(receipts)
            now = self._clock()
            policy.pulled(len(receipts), now)
            if policy.mode(now) is not Mode.PULL:
                # Caught up: Subscribe gives the lowest latency for the live trickle.
                self._log_switch()
                return

    def _stop_requested(self) -> bool:
        # A method, not the attribute, so that type narrowing does not outlive an await.
        return self._stopping

    # -- reconnect policy -----------------------------------------------------------------
    def _log_switch(self) -> None:
        switch = self._policy.take_switch()
        if switch is None:
            return
        if switch.cooldown_s is not None:
            # Subscribe keeps failing: worth a warning, unlike a backlog or a catch-up.
            log.warning(
                "auto_switch",
                reader=self.name,
                to=switch.to.value,
                reason=switch.reason,
                cooldown_s=switch.cooldown_s,
            )
        else:
            log.info("auto_switch", reader=self.name, to=switch.to.value, reason=switch.reason)

    def _backoff(self) -> float:
        """The next reconnect delay (`dlrfeed.backoff`); reset by every receipt or Pull."""
        self._attempt += 1
        return self._reconnect_delay.delay(self._attempt)

    async def _respect_reopen_cap(self) -> None:
        """At most `max_reopens_per_10s` opens per 10 s, whatever the backoff says."""
        now = self._clock()
        while self._opens and now - self._opens[0] >= 10.0:
            self._opens.popleft()
        if len(self._opens) >= self._settings.max_reopens_per_10s:
            wait = 10.0 - (now - self._opens[0])
            log.warning("reopen_capped", reader=self.name, wait_s=round(wait, 3))
            await self._sleep(wait)
        self._opens.append(self._clock())

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the reader is closed."""
        try:
            async with asyncio.timeout(seconds):
                await self._closed.wait()
        except TimeoutError:
            return

    def _set_state(self, mode: Mode | None) -> None:
        if mode == self.mode:
            return
        self.mode = mode
        if self._on_state is not None:
            self._on_state(self.name, mode)
