"""The server checks at start and during a run (dlrfeed.store.server) on a real PostgreSQL:
a read-only server is one line (exit 78) at start and one store outage while running;
--require-synchronous-commit refuses a server whose commits do not wait for a standby."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from structlog.testing import capture_logs

from dlrfeed.cli import main
from dlrfeed.daemon.app import Daemon
from dlrfeed.errors import ConfigError, StoreUnavailableError
from dlrfeed.store import Store
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    assert_ledger_matches_store,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)


async def set_read_only(database_url: str, read_only: bool) -> None:
    """default_transaction_read_only for the database, and its sessions ended so that new
    ones take it (a setting of the database applies when a session starts)."""
    name = database_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(database_url.rsplit("/", 1)[0] + "/postgres")
    try:
        if read_only:
            await conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
        else:
            await conn.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await conn.close()


async def test_a_read_only_server_is_refused_at_start_in_one_line(database_url: str) -> None:
    """Exit 78 with one line naming the cause, for the daemon and the sending side alike."""
    await set_read_only(database_url, True)
    with pytest.raises(ConfigError, match="read-only"):
        await Store.open(database_url)
    settings = settings_for("127.0.0.1:9", database_url)  # the store is checked first
    with pytest.raises(ConfigError, match="default_transaction_read_only"):
        await Daemon(settings).run()


def test_record_submissions_on_a_read_only_server_exits_78(
    database_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The sending side's command: the same one line, exit 78 (no traceback, no retry)."""
    asyncio.run(set_read_only(database_url, True))
    sent = tmp_path / "sent.jsonl"
    sent.write_text('{"message_id": "m1", "destination": "+34600000000"}\n')
    assert main(["record-submissions", str(sent), "--database-url", database_url]) == 78
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "read-only" in err


async def test_a_server_turning_read_only_during_a_run_is_one_store_outage(
    database_url: str,
) -> None:
    """The server goes read-only mid-drain: nothing is acked while it is, the outage is logged
    once (store_unavailable), pings keep it down instead of a retry loop, and draining resumes
    when the server takes writes again — everything stored once."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(2000))
        daemon = Daemon(settings_for(gateway.target, database_url, "--batch-size", "100"))
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run())
            await wait_until(holds(lambda: gateway.stats(LOGIN)["acked"] >= 200), 30, "acks")
            await set_server_read_only(database_url, True)
            # Receipts that arrive once the server is read-only: the outage is met whether or
            # not the first ones were all stored before the reload took effect.
            await gateway.inject(LOGIN, receipt_bodies(200, prefix="late"))
            try:
                await wait_until(
                    holds(lambda: any(e["event"] == "store_unavailable" for e in logs)), 30, "down"
                )
                # Within a second every session has taken the reload and the acks of batches
                # committed before it are through; from then on the store stays down.
                await asyncio.sleep(1.0)
                acked_while_down = gateway.stats(LOGIN)["acked"]
                transitions = len([e for e in logs if e["event"] in STORE_TRANSITIONS])
                await asyncio.sleep(1.0)  # long enough for the gate to ping several times
                assert gateway.stats(LOGIN)["acked"] == acked_while_down
                assert len([e for e in logs if e["event"] in STORE_TRANSITIONS]) == transitions
            finally:
                await set_server_read_only(database_url, False)
            stats = gateway.stats
            await wait_until(
                holds(lambda: stats(LOGIN)["queued"] + stats(LOGIN)["in_flight"] == 0), 60, "drain"
            )
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
        await assert_ledger_matches_store(gateway, database_url)
    # One outage; a second only when a ping met a session that had not yet taken the reload.
    outages = [e["error"] for e in logs if e["event"] == "store_unavailable"]
    assert 1 <= len(outages) <= 2
    assert all("read-only" in error for error in outages)
    assert any(e["event"] == "store_available" for e in logs)


STORE_TRANSITIONS = ("store_unavailable", "store_available")


async def set_server_read_only(database_url: str, read_only: bool) -> None:
    """default_transaction_read_only for the whole server, by reload: sessions already open
    take it at their next transaction, as when a primary is demoted under a running daemon.

    pg_reload_conf() only signals the postmaster. Returns once a new session sees the value:
    by then the postmaster has reloaded and signalled every open session, so each one takes
    it at its next statement (without the wait, a statement sent at once could still run
    under the old value)."""
    value = "on" if read_only else "off"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()

    async def reloaded() -> bool:
        fresh = await asyncpg.connect(database_url)
        try:
            return bool(await fresh.fetchval("SHOW default_transaction_read_only") == value)
        finally:
            await fresh.close()

    await wait_until(reloaded, 10, f"the server to reload default_transaction_read_only={value}")


def holds(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """`condition` in the form wait_until polls."""

    async def check() -> bool:
        return condition()

    return check


async def test_require_synchronous_commit_refuses_a_server_without_a_standby(
    database_url: str,
) -> None:
    """The test cluster has no standby: each missing guarantee is named in one line."""
    with pytest.raises(ConfigError, match="synchronous_commit is 'off'"):
        await Store.open(database_url, require_synchronous_commit=True)
    name = database_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = remote_apply")
    finally:
        await conn.close()
    with pytest.raises(ConfigError, match="synchronous_standby_names is empty"):
        await Store.open(database_url, require_synchronous_commit=True)
    store = await Store.open(database_url)  # without the requirement: starts
    await store.close()


async def test_ping_reports_a_read_only_server_as_unavailable(database_url: str) -> None:
    """The store gate's probe: answering is not enough, the server must take writes."""
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.ping()
        await set_server_read_only(database_url, True)
        try:
            with pytest.raises(StoreUnavailableError, match="read-only"):
                await store.ping()
        finally:
            await set_server_read_only(database_url, False)
        await store.ping()
    finally:
        await store.close()
