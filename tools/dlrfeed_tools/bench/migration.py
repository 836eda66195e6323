"""What one migration costs an installed store that keeps ingesting: its locks, how long it
holds them, its WAL, what it rewrites, and what the ingest running beside it waited.

Grows a store at the schema before the migration to `--receptions` receptions of the growth
benchmark's traffic (`growth_traffic`) through Store.ingest, on a throwaway cluster with the
recommended settings (docs/postgresql.md), then, while one Store keeps ingesting batches of that
traffic (as a daemon would, opened before the migration), applies the migration the way
`dlrfeed migrate` does (`migration_probe`). Prints one JSON object. Measures only; never
asserts a time.

    python scripts/bench_migration.py [--receptions 1000000] [--version N]

The migration measured is the newest one unless `--version` names another (the baseline has
no store before it to measure on: the tool serves the next migration).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.errors import SchemaOutOfDateError
from dlrfeed.store import Store
from dlrfeed.store.migrate import expected_version
from dlrfeed_tools.bench.growth_configs import config_cluster
from dlrfeed_tools.bench.growth_traffic import BATCHES_PER_ROUND, Traffic, ingest_rounds
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import apply_measured, install_before


async def _ingest_beside(
    dsn: str, traffic: Traffic, stop: asyncio.Event, log: list[tuple[float, float]]
) -> int:
    """Batches until `stop`, each logged as (start, seconds), while each round's messages are
    recorded beside them (the sending application does not wait for the daemon). A batch the
    migrated schema refuses (a migration that renames what the old statements write) is
    taken again by a Store opened anew, as an upgrade's restarted daemon takes the batch the
    gateway redelivers; its time includes the restart. Returns how many restarts there were."""
    restarts = 0
    store = await Store.open(dsn, pool_size=2)
    try:
        while not stop.is_set():
            submissions = traffic.submissions()
            recording = asyncio.create_task(store.record_submissions(submissions))
            for index in range(BATCHES_PER_ROUND):
                if stop.is_set():
                    break
                batch = traffic.batch(index)
                started = time.monotonic()
                try:
                    await store.ingest(LOGIN, batch)
                except SchemaOutOfDateError:
                    await asyncio.gather(recording, return_exceptions=True)
                    await store.close()
                    store = await Store.open(dsn, pool_size=2)
                    recording = asyncio.create_task(store.record_submissions(submissions))
                    await store.ingest(LOGIN, batch)
                    restarts += 1
                log.append((started, time.monotonic() - started))
            await recording
    finally:
        await store.close()
    return restarts


async def measure(receptions: int, version: int, root: Path) -> dict[str, Any]:
    """Grow a store to `receptions` at the schema before `version`; apply `version` to a copy
    of it with nothing else running (its own time, WAL and locks), then to the store itself
    while a Store ingests beside it (what the ingest waited)."""
    cluster = config_cluster("recommended", root)
    cluster.init()
    cluster.start()
    try:
        dsn = await cluster.create_database("migration")
        await install_before(dsn, version)
        traffic = Traffic(seed=16)
        store = await Store.open(dsn, pool_size=2)
        try:
            grown_at = time.monotonic()
            stored = await ingest_rounds(store, traffic, receptions)
            grow_s = time.monotonic() - grown_at
        finally:
            await store.close()
        copy = await cluster.create_database("migration_quiet", template="migration")
        conn = await asyncpg.connect(copy)
        try:
            await conn.execute("CHECKPOINT")
            database_bytes = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        finally:
            await conn.close()
        quiet = await apply_measured(copy, version)

        stop = asyncio.Event()
        batches: list[tuple[float, float]] = []
        beside = asyncio.create_task(_ingest_beside(dsn, traffic, stop, batches))
        await asyncio.sleep(5)
        migration_started = time.monotonic()
        busy = await apply_measured(dsn, version)
        migration_ended = time.monotonic()
        await asyncio.sleep(5)
        stop.set()
        restarts = await beside
    finally:
        cluster.destroy()
    before = [s for at, s in batches if at + s < migration_started]
    during = [s for at, s in batches if at < migration_ended and at + s > migration_started]
    return {
        "receptions": stored,
        "grow_seconds": round(grow_s, 1),
        "database_bytes": database_bytes,
        "migration": version,
        "quiet": {
            "statements_ms": round(quiet.statements_ms, 1),
            "commit_ms": round(quiet.commit_ms, 1),
            "wal_bytes": quiet.wal_bytes,
            "rewritten": quiet.rewritten,
            "exclusive_locks": sorted(
                r for r, m in quiet.locks.items() if "AccessExclusiveLock" in m
            ),
            "other_locks": {
                r: sorted(m) for r, m in quiet.locks.items() if "AccessExclusiveLock" not in m
            },
        },
        "beside_ingest": {
            "statements_ms": round(busy.statements_ms, 1),
            "commit_ms": round(busy.commit_ms, 1),
            "batch_ms_p50_before": round(1000 * statistics.median(before), 1) if before else None,
            "batch_ms_max_before": round(1000 * max(before), 1) if before else None,
            "batches_overlapping": len(during),
            "batch_ms_overlapping": [round(1000 * d, 1) for d in during],
            "restarts": restarts,
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receptions", type=int, default=1_000_000)
    parser.add_argument(
        "--version", type=int, default=expected_version(), help="the migration to measure"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-migration-") as root:
        result = asyncio.run(measure(args.receptions, args.version, Path(root)))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
