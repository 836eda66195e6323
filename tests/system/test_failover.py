"""A real primary and streaming standby (pgcluster.ReplicatedPair, synchronous): what
`dlrfeed run` says of each at start. The failover itself (kill -9 of the primary mid-drain,
promotion) is the chaos matrix's `failover_sync` scenario (tests/system/test_chaos.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.errors import ConfigError
from dlrfeed.store import Store
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.daemon_harness import PASSWORD, run_args
from dlrfeed_tools.pgcluster import ReplicatedPair, scratch_directory

REPO = Path(__file__).resolve().parents[2]
MONITOR = "dlrfeed_failover_monitor"


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    """A migrated primary with its synchronous standby streaming."""
    replicated = ReplicatedPair(scratch_directory("replicated"), synchronous=True)

    async def start() -> None:
        await replicated.start()
        await migrate(replicated.primary.dsn)

    try:
        asyncio.run(start())
        yield replicated
    finally:
        asyncio.run(replicated.destroy())


async def dlrfeed_run(database_url: str, *extra: str) -> tuple[int, list[str]]:
    """`dlrfeed run` as a process (the store is checked before the gateway is dialled, so no
    gateway is needed); its exit status and the lines of stderr that are not JSON log events."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dlrfeed.cli", *run_args("127.0.0.1:9", database_url, *extra),
        env={**os.environ, "DLRFEED_PASSWORD": PASSWORD},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    lines = [line for line in err.decode().splitlines() if not line.startswith("{")]
    return await process.wait(), lines


@pytest.mark.timeout(180)
async def test_a_standby_given_by_mistake_is_one_line_exit_78(pair: ReplicatedPair) -> None:
    code, err = await dlrfeed_run(pair.standby.dsn)
    assert code == 78
    assert err == [
        "dlrfeed: the database server is a standby (in recovery, read-only): point "
        "--database-url at the primary, or list every host with target_session_attrs=read-write"
    ]


@pytest.mark.timeout(180)
async def test_a_multi_host_url_finds_the_primary(pair: ReplicatedPair) -> None:
    """The standby listed first: target_session_attrs=read-write skips it."""
    url = (
        f"postgresql://postgres@127.0.0.1:{pair.standby.port},127.0.0.1:{pair.primary.port}"
        "/postgres?target_session_attrs=read-write"
    )
    store = await Store.open(url, require_synchronous_commit=True)
    try:
        await store.ping()
        assert store.server is not None
        assert store.server.synchronous_standbys == 1
    finally:
        await store.close()


@pytest.mark.timeout(180)
async def test_require_synchronous_commit_needs_a_role_that_sees_replication(
    pair: ReplicatedPair,
) -> None:
    """pg_stat_replication hides sync_state from ordinary roles: the check says what to grant,
    and passes once it is granted."""
    conn = await asyncpg.connect(pair.primary.dsn)
    try:
        await conn.execute(f"DROP ROLE IF EXISTS {MONITOR}; CREATE ROLE {MONITOR} LOGIN")
        url = pair.primary.dsn.replace("postgres@", f"{MONITOR}@", 1)
        with pytest.raises(ConfigError, match="GRANT pg_read_all_stats"):
            await Store.open(url, require_synchronous_commit=True)
        await conn.execute(f"GRANT pg_read_all_stats TO {MONITOR}")
        store = await Store.open(url, require_synchronous_commit=True)
        await store.close()
    finally:
        await conn.close()


@pytest.mark.timeout(180)
async def test_synchronous_commit_local_is_refused(pair: ReplicatedPair) -> None:
    """A role whose commits wait only for the primary's disk: refused in one line (exit 78)."""
    conn = await asyncpg.connect(pair.primary.dsn)
    try:
        await conn.execute("DROP DATABASE IF EXISTS local_commits")
        await conn.execute("CREATE DATABASE local_commits")
        await conn.execute("ALTER DATABASE local_commits SET synchronous_commit = local")
    finally:
        await conn.close()
    url = pair.primary.dsn_for("local_commits")
    await migrate(url)
    code, err = await dlrfeed_run(url, "--require-synchronous-commit")
    assert code == 78
    assert len(err) == 1
    assert "synchronous_commit is 'local'" in err[0]
