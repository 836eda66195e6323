"""The channel's message-size limits, set deliberately on both sides (docs/security.md).

Policy: dlrfeed's receive limit (`--max-message-mb`, 64 MiB) is at least the gateway's send
limit, so whatever the gateway can send is accepted - a 5 MB receipt is stored whole (C8). A
receipt the gateway itself cannot send fails the stream with RESOURCE_EXHAUSTED before it leaves
the gateway; dlrfeed cannot see or ack it, so it does not spin: it reconnects with growing
backoff under the per-reader reopen cap, says why in every `reader_reconnect` line, and stops
cleanly when asked.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed.feed.channel import DEFAULT_MAX_MESSAGE_BYTES
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    receipt_bodies,
    run_until_drained,
    running_gateway,
    settings_for,
)
from fakegw.server import MAX_MESSAGE_BYTES as GATEWAY_MAX_MESSAGE_BYTES

FIVE_MB = 5 * 1024 * 1024


def test_daemon_accepts_whatever_the_gateway_may_send() -> None:
    """The two defaults, chosen together: receive limit ≥ the gateway's send limit."""
    assert DEFAULT_MAX_MESSAGE_BYTES >= GATEWAY_MAX_MESSAGE_BYTES
    assert settings_for("127.0.0.1:1", "postgresql://x/y").max_message_bytes == (
        DEFAULT_MAX_MESSAGE_BYTES
    )


@pytest.mark.parametrize("mode", ["subscribe", "pull"])
async def test_c8_a_five_megabyte_receipt_is_received_stored_whole_and_flagged(
    database_url: str, mode: str
) -> None:
    """C8: a 5 MB `text` crosses the channel, is stored (column truncated and flagged, payload
    whole) and acked with the ordinary receipts around it."""
    big = {"id": "big", "level": 2, "stat": "DELIVRD", "text": "x" * FIVE_MB}
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, [*receipt_bodies(20), big, *receipt_bodies(20, prefix="n")])
        daemon = Daemon(settings_for(gateway.target, database_url, "--mode", mode))
        assert await run_until_drained(daemon, gateway) == 0
        assert gateway.stats(LOGIN)["acked"] == 41
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT length(payload) AS bytes, flags FROM dlr.receptions_readable"
            " WHERE message_id = 'big'"
        )
        total = await conn.fetchval("SELECT count(*) FROM dlr.receptions")
    finally:
        await conn.close()
    assert row is not None
    assert row["bytes"] > FIVE_MB
    assert "truncated:text" in row["flags"]
    assert total == 41


async def test_a_receipt_larger_than_the_gateway_may_send_causes_no_reconnect_storm(
    database_url: str,
) -> None:
    """A gateway whose send limit (64 KiB here) is below one receipt: every stream fails
    RESOURCE_EXHAUSTED at that receipt. The reader backs off (growing delays) and respects the
    reopen cap: within 6 s at most 5 + 1 opens, not hundreds; every reconnect line names the
    cause; the daemon stays up and stops cleanly."""
    too_big = {"id": "huge", "level": 2, "stat": "DELIVRD", "text": "x" * 100_000}
    async with running_gateway(max_message_bytes=64 * 1024) as gateway:
        await gateway.inject(LOGIN, [too_big, *receipt_bodies(10)])
        daemon = Daemon(
            settings_for(gateway.target, database_url, "--mode", "subscribe", "--streams", "1")
        )
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run(), name="daemon-under-test")
            started = time.monotonic()
            await asyncio.sleep(6)
            assert not task.done()  # still running: no crash, no exit
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
            elapsed = time.monotonic() - started
    reconnects = [e for e in logs if e["event"] == "reader_reconnect"]
    opens = [e for e in logs if e["event"] == "reader_up"]
    assert 1 <= len(reconnects) <= 6
    assert len(opens) <= 6 * max(1.0, elapsed / 10)
    assert all("RESOURCE_EXHAUSTED" in e["error"] for e in reconnects)
    assert all("larger than max" in e["error"] for e in reconnects)
    delays = [e["retry_in_s"] for e in reconnects]
    assert max(delays) > min(delays)  # the backoff grows; no fixed-rate spin
