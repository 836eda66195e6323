"""The growth benchmark's clusters run with the settings its report names."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from dlrfeed_tools.bench.growth_configs import CONFIGS, check_settings, config_cluster


async def test_the_recommended_cluster_runs_with_every_recommended_setting(tmp_path: Path) -> None:
    cluster = config_cluster("recommended", tmp_path)
    cluster.init()
    cluster.start()
    try:
        await check_settings(cluster.dsn, CONFIGS["recommended"])
        conn = await asyncpg.connect(cluster.dsn)
        try:
            shared_buffers = await conn.fetchval("SHOW shared_buffers")
        finally:
            await conn.close()
        # PgCluster's own default (128MB) must not win over the configuration's.
        assert shared_buffers == CONFIGS["recommended"]["shared_buffers"]
        with pytest.raises(RuntimeError, match="the server runs with shared_buffers = "):
            await check_settings(cluster.dsn, {"shared_buffers": "1kB"})
    finally:
        cluster.destroy()
