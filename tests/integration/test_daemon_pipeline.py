"""The daemon in-process against a real fakegw over loopback gRPC and the real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from daemon_harness import (
    LOGIN,
    PASSWORD,
    acked_tokens,
    enqueued_keys,
    receipt_bodies,
    settings_for,
    store_counts,
    stored_event_keys,
    stored_tokens,
)
from dlrfeed.daemon.app import Daemon
from fakegw.faults import Faults
from fakegw.server import FakeGateway


@contextlib.asynccontextmanager
async def running_gateway(**kwargs: object) -> AsyncIterator[FakeGateway]:
    gateway = FakeGateway({LOGIN: PASSWORD}, **kwargs)  # type: ignore[arg-type]
    async with gateway.running() as running:
        yield running


async def wait_until(predicate: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def drained(gateway: FakeGateway) -> bool:
    stats = gateway.stats(LOGIN)
    return stats["queued"] == 0 and stats["in_flight"] == 0


async def run_until_drained(daemon: Daemon, gateway: FakeGateway, within_s: float = 30) -> int:
    task = asyncio.create_task(daemon.run(), name="daemon-under-test")
    try:
        await wait_until(lambda: drained(gateway), within_s, "the queue to drain")
    finally:
        daemon.stop()
        code = await asyncio.wait_for(task, 15)
    return code


async def assert_ledger_matches_store(gateway: FakeGateway, database_url: str) -> None:
    """Every enqueued (id, level) is one event; every acked receipt is stored (F8, C7)."""
    ledger = gateway.ledger(LOGIN, limit=10_000_000)["records"]
    assert await stored_event_keys(database_url) == enqueued_keys(ledger)
    counts = await store_counts(database_url)
    assert counts["events"] == counts["distinct_events"]
    assert acked_tokens(ledger) <= await stored_tokens(database_url)


@pytest.mark.parametrize("mode", ["subscribe", "pull", "auto"])
async def test_drains_the_queue_and_acks_after_commit(database_url: str, mode: str) -> None:
    """F8/C7: everything enqueued is stored once as an event, every ack follows a commit."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(3000, conflicting=20))
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", mode))
        assert await run_until_drained(daemon, gateway) == 0
        await assert_ledger_matches_store(gateway, database_url)
        assert gateway.stats(LOGIN)["acked"] == 3020
        assert daemon.metrics.totals.stored >= 3020


async def test_survives_stream_cuts_and_duplicates(database_url: str) -> None:
    """F7/F13/C1: streams cut every 500, 10 % duplicates: still one event per key, queue empty."""
    faults = Faults(seed=7, duplicate_rate=0.1, cut_stream_every=500)
    async with running_gateway(faults=faults) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(4000))
        daemon = Daemon(
            settings_for(gateway.target, database_url, "--mode", "subscribe", "--max-reopens", "50")
        )
        assert await run_until_drained(daemon, gateway) == 0
        await assert_ledger_matches_store(gateway, database_url)
        assert daemon.metrics.totals.repeats >= 1


async def test_auto_falls_back_to_pull_when_subscribe_is_unimplemented(database_url: str) -> None:
    """Issue 4 §4: Subscribe answers UNIMPLEMENTED → auto mode drains through Pull."""
    async with running_gateway(faults=Faults(no_subscribe=True)) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(1000))
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", "auto"))
        assert await run_until_drained(daemon, gateway) == 0
        await assert_ledger_matches_store(gateway, database_url)
        assert daemon.metrics.received.labels(mode="pull")._value.get() >= 1000
