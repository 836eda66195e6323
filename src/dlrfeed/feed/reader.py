"""FeedReader: one reader of the login's queue, on Subscribe or Pull, reconnecting politely.

A reader hands what it receives to a `ReceiptSink` (the daemon's batcher), which commits and
acks. The reader owns only the feed side: which RPC to use (`--mode`), reconnect backoff with
jitter and a cap on reopens per 10 s (reconnect storms are the most reported failure of peer
clients), the automatic fallback from Subscribe to Pull, and closing its stream when the store
has been down long enough that the gateway should give the receipts to someone else (F7).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from dlrfeed.backoff import backoff_delay
from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import FeedUnavailableError
from dlrfeed.feed.client import (
    FeedClient,
    FeedUnimplementedError,
    PullCall,
    SubscribeStream,
    is_own_cancellation,
)

log = structlog.get_logger("dlrfeed.reader")


AUTO_RATE_SPAN_SECONDS = 0.5
"""Auto judges a Subscribe stream's rate over spans this long: short enough that a backlog
moves to Pull within its first few thousand receipts."""

AUTO_MIN_PULL_SECONDS = 10.0
"""After a backlog switch, auto stays on Pull at least this long (capped by --auto-cooldown),
so a steady flow near the threshold does not flap between the RPCs."""


class Mode(enum.StrEnum):
    """`--mode`: which RPC readers use."""

    SUBSCRIBE = "subscribe"
    PULL = "pull"
    AUTO = "auto"


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

    def backlogged(self) -> bool:
        """True while batches keep closing full (receipts arrive faster than they commit)."""

    def forget_backlog(self) -> None:
        """A stream opens: only batches closed from now on say whether it is backlogged."""


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


class StreamReleased(Exception):  # noqa: N818 - a signal between reader and sink, not a fault
    """The sink dropped what it held (store outage past --release-after): reopen later (F7)."""


class _Released(Exception):  # noqa: N818 - internal control flow
    """Internal: our own cancel() ended the current call (release or stop)."""


class FeedReader:
    """One reader task; `run()` until `stop_reading()` + `close()`, raising only fatal errors."""

    def __init__(
        self,
        name: str,
        client: FeedClient,
        sink: ReceiptSink,
        settings: ReaderSettings,
        on_state: Callable[[str, Mode | None], None] | None = None,
        on_received: Callable[[Mode, int], None] | None = None,
    ) -> None:
        self.name = name
        self._client = client
        self._sink = sink
        self._settings = settings
        self._on_state = on_state
        self._on_received = on_received
        self._stopping = False
        self._closed = asyncio.Event()
        self._release_requested = False
        self._current: SubscribeStream | PullCall | None = None
        self._pull_done = asyncio.Event()
        self._pull_done.set()
        self._opens: deque[float] = deque()
        self._stream_failures: deque[float] = deque()
        self._subscribe_blocked_until = 0.0
        self._prefer_pull = settings.mode == Mode.PULL
        self._pull_at_least_until = 0.0
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
        receipts at once to readers that can store them (F7); reopen when the store is back."""
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
            mode = self._choose_mode()
            try:
                if mode == Mode.SUBSCRIBE:
                    await self._run_subscribe()
                else:
                    await self._run_pull()
            except (_Released, StreamReleased):
                dropped = self._sink.discard_pending()
                if self._release_requested:
                    self._release_requested = False
                    log.warning("stream_released", reader=self.name, mode=mode, dropped=dropped)
                continue
            except FeedUnimplementedError:
                if self._settings.mode != Mode.AUTO or mode == Mode.PULL:
                    raise
                self._subscribe_blocked_until = time.monotonic() + self._settings.auto_cooldown
                log.warning("subscribe_unimplemented", reader=self.name, fallback="pull")
                continue
            except FeedUnavailableError as exc:
                self._set_state(None)
                dropped = self._sink.discard_pending() if mode == Mode.SUBSCRIBE else 0
                self._note_failure(mode)
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
            finally:
                self._set_state(None)

    def _choose_mode(self) -> Mode:
        if self._settings.mode != Mode.AUTO:
            return self._settings.mode
        if time.monotonic() < self._subscribe_blocked_until or self._prefer_pull:
            return Mode.PULL
        return Mode.SUBSCRIBE

    async def _run_subscribe(self) -> None:
        stream = self._client.subscribe(self._settings.window)
        self._current = stream
        self._set_state(Mode.SUBSCRIBE)
        auto = self._settings.mode == Mode.AUTO
        if auto:
            self._sink.forget_backlog()
        span_start = time.monotonic()
        received = 0
        try:
            while True:
                try:
                    receipt = await stream.read()
                except asyncio.CancelledError:
                    if is_own_cancellation(stream.cancelled_by_us):
                        raise _Released from None
                    raise
                if receipt is None:
                    raise FeedUnavailableError("the gateway ended the Subscribe stream")
                if self._stopping:
                    # F7: what arrives after stop stays unacked and is released at close.
                    await self._closed.wait()
                    return
                self._attempt = 0
                if self._on_received is not None:
                    self._on_received(Mode.SUBSCRIBE, 1)
                await self._sink.accept([receipt])
                if not auto:
                    continue
                # Two signs of a backlog: batches closing full (the feed outruns the commits),
                # seen at once; or the stream's rate over a short span (the feed is the limit:
                # a stream opened on a backlog delivers its window back to back).
                backlog = self._sink.backlogged()
                received += 1
                now = time.monotonic()
                if not backlog and now - span_start >= AUTO_RATE_SPAN_SECONDS:
                    backlog = received / (now - span_start) >= self._settings.auto_pull_rate
                    span_start, received = now, 0
                if backlog:
                    # A backlog (batches closing full, or a fast stream): Pull drains it for a
                    # fraction of the CPU per receipt (docs/daemon.md). Commit and ack what we
                    # hold first, so closing the stream releases nothing already stored (F7).
                    await self._sink.drain()
                    self._prefer_pull = True
                    self._pull_at_least_until = time.monotonic() + min(
                        AUTO_MIN_PULL_SECONDS, self._settings.auto_cooldown
                    )
                    log.info("auto_switch", reader=self.name, to="pull", reason="backlog")
                    return
        finally:
            self._current = None
            stream.cancel()

    async def _run_pull(self) -> None:
        settings = self._settings
        auto = settings.mode == Mode.AUTO
        self._set_state(Mode.PULL)
        short_pulls = 0
        while not self._stopping:
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
            if not auto:
                continue
            # Caught up when Pulls come back well short of `max`: Subscribe then gives the
            # lowest latency for the live trickle, unless Subscribe is on cool-down.
            short_pulls = short_pulls + 1 if len(receipts) < settings.pull_max // 2 else 0
            now = time.monotonic()
            if (
                short_pulls >= 3
                and now >= self._subscribe_blocked_until
                and now >= self._pull_at_least_until
            ):
                self._prefer_pull = False
                log.info("auto_switch", reader=self.name, to="subscribe", reason="caught_up")
                return

    def _stop_requested(self) -> bool:
        # A method, not the attribute, so that type narrowing does not outlive an await.
        return self._stopping

    # -- reconnect policy -----------------------------------------------------------------
    def _note_failure(self, mode: Mode) -> None:
        if self._settings.mode != Mode.AUTO or mode != Mode.SUBSCRIBE:
            return
        now = time.monotonic()
        window = self._settings.auto_cooldown
        self._stream_failures.append(now)
        while self._stream_failures and now - self._stream_failures[0] > window:
            self._stream_failures.popleft()
        if len(self._stream_failures) >= self._settings.auto_failures:
            self._stream_failures.clear()
            self._subscribe_blocked_until = now + window
            log.warning(
                "auto_switch",
                reader=self.name,
                to="pull",
                reason="stream_failures",
                cooldown_s=window,
            )

    def _backoff(self) -> float:
        """Exponential backoff with equal jitter (half to all of the step), capped."""
        self._attempt += 1
        return backoff_delay(
            self._attempt, self._settings.backoff_initial, self._settings.backoff_max
        )

    async def _respect_reopen_cap(self) -> None:
        """At most `max_reopens_per_10s` opens per 10 s, whatever the backoff says."""
        now = time.monotonic()
        while self._opens and now - self._opens[0] >= 10.0:
            self._opens.popleft()
        if len(self._opens) >= self._settings.max_reopens_per_10s:
            wait = 10.0 - (now - self._opens[0])
            log.warning("reopen_capped", reader=self.name, wait_s=round(wait, 3))
            await self._sleep(wait)
        self._opens.append(time.monotonic())

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
