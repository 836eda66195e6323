"""StoreGate: the process's view of whether PostgreSQL takes writes, shared by every reader.

A batch whose commit fails with `StoreUnavailableError` (any transient SQLSTATE class, or a
lost connection) marks the gate down. While it is down, readers take no new receipts (their
batch in hand is retried), a prober pings the store with backoff and jitter, and once the
outage has lasted `release_after` seconds the gate fires the release callbacks: Subscribe
readers close their streams so the gateway hands the receipts to readers that can store them
(F7; Pull readers keep theirs, `FeedReader.release`). The first successful ping or commit opens
the gate again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from dlrfeed.backoff import Backoff
from dlrfeed.errors import StoreUnavailableError

log = structlog.get_logger("dlrfeed.store_gate")

PING_DELAY = Backoff(initial=0.2, maximum=5.0)
"""Between pings while the store is down."""


class StoreGate:
    """Up/down state of the store with a prober and a release timer; see the module docstring.

    `clock` times the outage (for `release_after` and the `store_available` log)."""

    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        *,
        release_after: float,
        on_release: Callable[[], None],
        ping_delay: Backoff = PING_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ping = ping
        self._release_after = release_after
        self._on_release = on_release
        self._ping_delay = ping_delay
        self._clock = clock
        self._up = asyncio.Event()
        self._up.set()
        self._down = asyncio.Event()
        self.down_since: float | None = None
        self.reason: str | None = None
        """Why the store is down, as last heard (None while it is up)."""
        self.released = False
        self.outages = 0

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    def mark_down(self, error: StoreUnavailableError) -> None:
        """A commit found the store unreachable: nothing was committed, nothing is acked."""
        if not self._up.is_set():
            return
        self._up.clear()
        self._down.set()
        self.down_since = self._clock()
        self.reason = str(error)
        self.outages += 1
        log.error("store_unavailable", error=self.reason)

    def mark_up(self) -> None:
        """A commit or ping succeeded."""
        if self._up.is_set():
            return
        outage = self._clock() - (self.down_since or self._clock())
        self._down.clear()
        self._up.set()
        self.down_since = None
        self.reason = None
        self.released = False
        log.info("store_available", outage_s=round(outage, 3))

    async def wait_up(self) -> None:
        """Return when the store is up (at once if it is)."""
        await self._up.wait()

    async def wait_up_for(self, seconds: float) -> bool:
        """Wait at most `seconds` for the store to be up; True if it is."""
        if self._up.is_set():
            return True
        try:
            async with asyncio.timeout(seconds):
                await self._up.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """The prober: while down, ping with backoff; after `release_after`, release once."""
        while True:
            await self._down.wait()
            attempt = 0
            while not self._up.is_set():
                attempt += 1
                await self.wait_up_for(self._ping_delay.delay(attempt))
                if self._up.is_set():
                    break
                down_for = self._clock() - (self.down_since or self._clock())
                if not self.released and down_for >= self._release_after:
                    self.released = True
                    log.warning("streams_released", outage_s=round(down_for, 3))
                    self._on_release()
                try:
                    await self._ping()
                except StoreUnavailableError as exc:
                    if str(exc) != self.reason:
                        # Why the store is still down, when that changes (a server shutting
                        # down, then gone; too many connections; read-only).
                        self.reason = str(exc)
                        log.warning("store_still_unavailable", error=self.reason, attempt=attempt)
                    continue
                self.mark_up()
