"""The throwaway PostgreSQL used by every integration test is real and reachable."""

from __future__ import annotations

import asyncpg

from pgcluster import PgCluster


async def test_cluster_answers_sql(pg_cluster: PgCluster) -> None:
    conn = await asyncpg.connect(pg_cluster.dsn)
    try:
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()
