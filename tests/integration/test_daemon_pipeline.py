"""The daemon in-process against a real fakegw over loopback gRPC and the real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    assert_ledger_matches_store,
    drained,
    receipt_bodies,
    run_until_drained,
    running_gateway,
    settings_for,
    wait_until,
)
from fakegw.faults import Faults


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
    """F11/F10: Subscribe answers UNIMPLEMENTED → auto mode drains through Pull."""
    async with running_gateway(faults=Faults(no_subscribe=True)) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(1000))
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", "auto"))
        assert await run_until_drained(daemon, gateway) == 0
        await assert_ledger_matches_store(gateway, database_url)
        assert daemon.metrics.received.labels(mode="pull")._value.get() >= 1000


async def test_auto_moves_to_pull_when_streams_keep_failing(database_url: str) -> None:
    """F7: streams cut every 50 receipts → after 3 failures auto mode drains through
    Pull for the cool-down; reopens stay under the cap. The daemon starts on an empty queue,
    so auto is on Subscribe (three short Pulls) when the receipts come; a rate no stream
    reaches keeps the backlog rule out of it."""
    async with running_gateway(faults=Faults(cut_stream_every=50)) as gateway:
        settings = settings_for(
            gateway.target, database_url, "--mode", "auto", "--pull-wait-seconds", "1",
            "--auto-pull-rate", "1000000000",
        )  # fmt: skip
        daemon = Daemon(settings)
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")

            async def on_subscribe() -> bool:
                caught_up = sum(1 for e in logs if e.get("reason") == "caught_up")
                return caught_up >= 2  # both readers

            await wait_until(on_subscribe, 30, "auto to move to Subscribe")
            await gateway.inject(LOGIN, receipt_bodies(3000))
            await wait_until(lambda: drained(gateway), 60, "the receipts to drain")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
        await assert_ledger_matches_store(gateway, database_url)
    switches = [e for e in logs if e["event"] == "auto_switch"]
    assert any(e["reason"] == "stream_failures" and e["to"] == "pull" for e in switches)
    reconnects = [e for e in logs if e["event"] == "reader_reconnect"]
    assert 3 <= len(reconnects) <= 20


async def test_reopens_are_capped_per_reader(database_url: str) -> None:
    """A stream cut after every receipt does not turn into a reconnect storm:
    at most --max-reopens opens per reader per 10 s."""
    async with running_gateway(faults=Faults(cut_stream_every=1)) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(200))
        settings = settings_for(
            gateway.target, database_url, "--mode", "subscribe", "--streams", "1",
            "--max-reopens", "3",
        )  # fmt: skip
        daemon = Daemon(settings)
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")

            async def capped() -> bool:
                return any(e["event"] == "reopen_capped" for e in logs)

            # Until the cap is hit, not for a fixed time: a slow start would leave none.
            await wait_until(capped, 30, "a reopen to be capped")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
    opened = [e for e in logs if e["event"] == "reader_up"]
    assert 1 <= len(opened) <= 3
    assert any(e["event"] == "reopen_capped" for e in logs)


async def test_auto_drains_a_backlog_through_pull_then_returns_to_subscribe(
    database_url: str,
) -> None:
    """Auto starts on Pull, where a backlog found at the start drains for less CPU per
    receipt; moves to Subscribe once caught up, for the live trickle; and back to Pull as soon
    as a new backlog shows on the stream.

    Here the in-process gateway is the slower side, so batches close on linger and the stream's
    rate is the sign: judged over half a second, the switch comes within the first few thousand
    receipts rather than after seconds."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(10_000))
        settings = settings_for(
            gateway.target, database_url, "--mode", "auto", "--streams", "1",
            "--batch-size", "200", "--ack-batch", "200", "--pull-wait-seconds", "1",
            "--auto-pull-rate", "500", "--auto-cooldown", "2",
        )  # fmt: skip
        daemon = Daemon(settings)
        received = daemon.metrics.received
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")
            await wait_until(lambda: drained(gateway), 30, "the first backlog to drain")

            async def back_on_subscribe() -> bool:
                return any(e.get("reason") == "caught_up" for e in logs)

            await wait_until(back_on_subscribe, 15, "auto to move to Subscribe")
            first_backlog_on_subscribe = received.labels(mode="subscribe")._value.get()
            # Caught up, the live trickle comes by Subscribe.
            await gateway.inject(LOGIN, receipt_bodies(50, prefix="t"))
            await wait_until(lambda: drained(gateway), 15, "the trickle to drain")
            trickle = received.labels(mode="subscribe")._value.get() - first_backlog_on_subscribe
            # A new backlog, seen on the stream, goes back to Pull.
            await gateway.inject(LOGIN, receipt_bodies(20_000, prefix="b"))
            await wait_until(lambda: drained(gateway), 30, "the second backlog to drain")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
        await assert_ledger_matches_store(gateway, database_url)
    assert first_backlog_on_subscribe == 0
    assert trickle == 50
    switches = [(e["to"], e["reason"]) for e in logs if e["event"] == "auto_switch"]
    assert switches[0] == ("subscribe", "caught_up")
    assert ("pull", "backlog") in switches
    on_subscribe = received.labels(mode="subscribe")._value.get() - 50
    # Half a second of Subscribe (~2,500 here) before the switch, not the 2 s (~10,000) of a
    # per-second rule: a quarter of the second backlog at most.
    assert on_subscribe < 5_000, on_subscribe
