"""The StoreGate: down on a failed commit, a prober that pings until the store answers, one
release of the streams once the outage has lasted --release-after (F7), up again on a ping or
a commit. A real event loop, a ping the test controls, a clock the test moves."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from dlrfeed.backoff import Backoff
from dlrfeed.daemon.store_gate import StoreGate
from dlrfeed.errors import StoreUnavailableError
from support.frozen_clock import FrozenClock

WITHIN = 5.0
DOWN = StoreUnavailableError("connection refused")


@dataclass
class Store:
    down: bool = True
    pings: int = 0

    async def ping(self) -> None:
        self.pings += 1
        if self.down:
            raise DOWN


@dataclass
class Rig:
    gate: StoreGate
    store: Store
    clock: FrozenClock
    releases: list[float] = field(default_factory=list)


@asynccontextmanager
async def running_gate(release_after: float = 60.0) -> AsyncIterator[Rig]:
    store = Store()
    clock = FrozenClock()
    releases: list[float] = []
    gate = StoreGate(
        store.ping,
        release_after=release_after,
        on_release=lambda: releases.append(clock.now),
        ping_delay=Backoff(0.001, 0.005, rng=random.Random(7)),
        clock=clock,
    )
    prober = asyncio.create_task(gate.run(), name="prober-under-test")
    try:
        yield Rig(gate, store, clock, releases)
    finally:
        prober.cancel()
        await asyncio.gather(prober, return_exceptions=True)


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for `condition`, failing the test past WITHIN seconds."""
    deadline = time.monotonic() + WITHIN
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


async def test_a_failed_commit_closes_the_gate_and_a_ping_that_answers_opens_it() -> None:
    async with running_gate() as r:
        assert r.gate.outages == 0
        r.gate.mark_down(DOWN)
        assert not r.gate.is_up
        await eventually(lambda: r.store.pings >= 3, "pings while the store is down")
        assert not r.gate.is_up
        r.store.down = False
        await asyncio.wait_for(r.gate.wait_up(), WITHIN)
        assert r.gate.outages == 1
        assert r.releases == []


async def test_the_streams_are_released_once_when_the_outage_reaches_release_after() -> None:
    """F7: not before --release-after (however many pings fail), then exactly once."""
    async with running_gate(release_after=60.0) as r:
        r.gate.mark_down(DOWN)
        await eventually(lambda: r.store.pings >= 5, "pings while the store is down")
        r.clock.now += 59.9
        pings = r.store.pings
        await eventually(lambda: r.store.pings >= pings + 5, "more pings")
        assert r.releases == []
        r.clock.now += 0.1
        await eventually(lambda: bool(r.releases), "the release")
        pings = r.store.pings
        await eventually(lambda: r.store.pings >= pings + 5, "pings after the release")
        assert r.releases == [1_060.0]


async def test_a_new_outage_after_recovery_may_release_again() -> None:
    async with running_gate(release_after=1.0) as r:
        r.gate.mark_down(DOWN)
        r.clock.now += 1.0
        await eventually(lambda: len(r.releases) == 1, "the first release")
        r.gate.mark_up()
        r.gate.mark_down(DOWN)
        assert r.gate.outages == 2
        r.clock.now += 1.0
        await eventually(lambda: len(r.releases) == 2, "the second outage's release")


async def test_wait_up_for_gives_up_after_its_time_while_the_store_is_down() -> None:
    async with running_gate() as r:
        r.gate.mark_down(DOWN)
        assert not await r.gate.wait_up_for(0.01)
        r.gate.mark_up()  # a commit succeeded
        assert await r.gate.wait_up_for(0.0)
        r.gate.mark_down(DOWN)
        r.gate.mark_down(DOWN)  # a second failing batch of the same outage
        assert r.gate.outages == 2
