"""The growth benchmark's PostgreSQL configurations: their settings, their clusters, and the
check that a server runs with what the report will name."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg

from dlrfeed_tools.pgcluster import PgCluster, free_port

# PostgreSQL settings per configuration; docs/postgresql.md explains each and quotes the effect.
# "default" is PostgreSQL's own defaults (with fsync, synchronous_commit and full_page_writes on).
CHECKPOINTS = {"max_wal_size": "16GB", "checkpoint_timeout": "30min"}
# zstd (PostgreSQL 15) compresses the full-page images a third smaller than lz4 for the same
# ingest rate, measured on a grown store.
WAL_COMPRESSION = {"wal_compression": "zstd"}
# A quarter of the machine's memory, as docs/postgresql.md recommends.
MEMORY = {
    "shared_buffers": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 4 // 2**20}MB"
}
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "checkpoints": CHECKPOINTS,
    "wal_compression": WAL_COMPRESSION,
    "shared_buffers": MEMORY,
    "recommended": {**CHECKPOINTS, **WAL_COMPRESSION, **MEMORY},
}


def config_cluster(name: str, root: Path) -> PgCluster:
    """The cluster of configuration `name`: its settings go on the server's command line after
    PgCluster's own (which set shared_buffers), so they are the ones in force."""
    settings = tuple(f"{key}={value}" for key, value in CONFIGS[name].items())
    return PgCluster(root / name, free_port(), fsync=True, settings=settings)


async def check_settings(dsn: str, settings: dict[str, str]) -> None:
    """RuntimeError unless the server reports every one of `settings` as asked: a report must
    not name a setting the server did not run with."""
    conn = await asyncpg.connect(dsn)
    try:
        for key, value in settings.items():
            actual = await conn.fetchval("SELECT current_setting($1)", key)
            if actual != value:
                raise RuntimeError(f"the server runs with {key} = {actual}, not {value}")
    finally:
        await conn.close()


def config_sizes(spec: str, receipts: int) -> dict[str, int]:
    """`default=8000000,recommended`: each configuration and the receptions it grows to."""
    sizes: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        name, _, size = item.partition("=")
        if name not in CONFIGS:
            raise ValueError(
                f"unknown configuration {name!r}, expected one of {', '.join(CONFIGS)}"
            )
        sizes[name] = int(size) if size else receipts
    return sizes
