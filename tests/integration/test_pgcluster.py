"""The throwaway PostgreSQL used by every integration test is real and reachable."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import asyncpg
import pytest

from dlrfeed_tools import pgcluster
from dlrfeed_tools.pgcluster import PgCluster


async def test_cluster_answers_sql(pg_cluster: PgCluster) -> None:
    conn = await asyncpg.connect(pg_cluster.dsn)
    try:
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()


async def test_a_port_taken_before_the_server_binds_it_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """free_port says what is free at the moment it looks; a port another process takes before
    the server binds it makes the start try another instead of failing the session."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        choices = iter([int(taken.getsockname()[1]), pgcluster.free_port()])
        monkeypatch.setattr(pgcluster, "free_port", lambda: next(choices))
        cluster = pgcluster.start_on_a_free_port(Path(tempfile.mkdtemp(prefix="dlrfeed-test-")))
        try:
            assert cluster.port != taken.getsockname()[1]
            conn = await asyncpg.connect(cluster.dsn)
            try:
                assert await conn.fetchval("SELECT 40 + 2") == 42
            finally:
                await conn.close()
        finally:
            cluster.destroy()
