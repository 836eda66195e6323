"""Where a grown store's WAL goes: each relation's WAL records and full-page images over a window
of ingest, read back from the WAL itself with pg_walinspect.

Grows a store to `--grow` receptions of the growth benchmark's traffic (`growth_traffic`)
through Store.ingest, on a throwaway cluster with one of the growth benchmark's configurations
(PostgreSQL's defaults unless `--config`), then ingests `--window` more and attributes every WAL
record of that window to the relation of its first block, and every full-page image to the
relation it images. A day's partitions are folded into one row (`_DAY`). Prints a Markdown
report; measures only, never asserts.

    python scripts/bench_wal_sources.py [--grow 1000000] [--window 300000] [--config default]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from dlrfeed.store import Store
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.bench.growth_configs import CONFIGS, check_settings
from dlrfeed_tools.bench.growth_traffic import Traffic, ingest_rounds
from dlrfeed_tools.pgcluster import PgCluster, free_port

# Keeps the window's WAL on disk until it is read back; decides nothing else (checkpoints still
# come at max_wal_size and checkpoint_timeout).
KEEP_WAL = "wal_keep_size=64GB"
# One block reference of pg_get_wal_records_info's block_ref, as PostgreSQL 15 prints it:
# "blkref #0: rel 1663/16384/16391 fork main blk 4 (FPW); hole: offset: 412, length: 4676".
_BLOCK = re.compile(r"rel \d+/\d+/(\d+)(?: fork \w+)? blk \d+( \(FPW\))?")
_DAY = re.compile(r"_\d{8}")
_RECORDS = """
SELECT record_length, fpi_length, block_ref, resource_manager
FROM pg_get_wal_records_info($1, $2)
"""
_FILES = """
SELECT pg_relation_filenode(c.oid)::text AS filenode, n.nspname || '.' || c.relname AS name
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE pg_relation_filenode(c.oid) IS NOT NULL
"""
_SIZES = """
SELECT n.nspname || '.' || c.relname AS name, pg_relation_size(c.oid) AS bytes
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname IN ('dlr', 'dlr_partitions') AND c.relkind IN ('r', 'i')
"""
_CHECKPOINTS = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"


class WalRecord(Protocol):
    """A row of pg_get_wal_records_info (an asyncpg Record, or a dict in tests)."""

    def __getitem__(self, key: str, /) -> Any: ...


class WalShares:
    """WAL bytes, image bytes, images and records, per relation (days folded)."""

    def __init__(self) -> None:
        self.wal: Counter[str] = Counter()
        self.images: Counter[str] = Counter()
        self.image_count: Counter[str] = Counter()
        self.records: Counter[str] = Counter()

    def add(self, names: Mapping[str, str], record: WalRecord) -> None:
        """Count one row of pg_get_wal_records_info; `names`: file node -> relation."""
        blocks = _BLOCK.findall(record["block_ref"] or "")
        owner = (
            _fold(names.get(blocks[0][0], blocks[0][0])) if blocks else record["resource_manager"]
        )
        self.wal[owner] += record["record_length"]
        self.records[owner] += 1
        imaged = [_fold(names.get(node, node)) for node, image in blocks if image]
        for relation in imaged:
            # A record's images share its fpi_length; split evenly (nearly always one image).
            self.images[relation] += record["fpi_length"] // len(imaged)
            self.image_count[relation] += 1


def _fold(name: str) -> str:
    return _DAY.sub("_DAY", name)


async def measure(grow: int, window: int, config: str, root: Path) -> str:
    """The report of one run: grow, then read back the window's WAL."""
    settings = tuple(f"{key}={value}" for key, value in CONFIGS[config].items())
    cluster = PgCluster(root / config, free_port(), fsync=True, settings=(*settings, KEEP_WAL))
    cluster.init()
    cluster.start()
    try:
        dsn = await cluster.create_database("wal_sources")
        await check_settings(dsn, CONFIGS[config])
        await migrate(dsn)
        traffic = Traffic(seed=16)
        store = await Store.open(dsn, pool_size=2)
        conn = await asyncpg.connect(dsn)
        try:
            await ingest_rounds(store, traffic, grow)
            stored_before = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
            start_lsn, checkpoints = (
                await conn.fetchval("SELECT pg_current_wal_lsn()"),
                int(await conn.fetchval(_CHECKPOINTS)),
            )
            started = time.monotonic()
            received = await ingest_rounds(store, traffic, window)
            seconds = time.monotonic() - started
            end_lsn = await conn.fetchval("SELECT pg_current_wal_lsn()")
            checkpoints = int(await conn.fetchval(_CHECKPOINTS)) - checkpoints
            stored = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
            sizes = {r["name"]: int(r["bytes"]) for r in await conn.fetch(_SIZES)}
            database = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
            await conn.execute("CREATE EXTENSION pg_walinspect")
            names = {r["filenode"]: r["name"] for r in await conn.fetch(_FILES)}
            shares = WalShares()
            async with conn.transaction():
                async for record in conn.cursor(_RECORDS, start_lsn, end_lsn):
                    shares.add(names, record)
        finally:
            await conn.close()
            await store.close()
    finally:
        cluster.destroy()
    folded: Counter[str] = Counter()
    for name, size in sizes.items():
        folded[_fold(name)] += size
    return _report(
        config, stored_before, stored, received, seconds, checkpoints, database, folded, shares
    )


def _report(
    config: str,
    stored_before: int,
    stored: int,
    received: int,
    seconds: float,
    checkpoints: int,
    database: int,
    sizes: Counter[str],
    shares: WalShares,
) -> str:
    def per(value: float) -> str:
        return f"{value / received:,.0f}"

    lines = [
        f"# WAL by relation: {received:,} receptions into a store of {stored_before:,} "
        f"({config} settings)",
        "",
        f"- ingest: {received / seconds:,.0f} receptions/s; checkpoints in the window: "
        f"{checkpoints}",
        f"- WAL per reception: {per(sum(shares.wal.values()))} B, of it full-page images "
        f"{per(sum(shares.images.values()))} B",
        f"- disk per reception stored: {database / stored:,.0f} B ({stored:,} stored)",
        "",
        "| relation | WAL B/reception | of it images | images/reception | records/reception "
        "| size B/reception stored |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, wal in shares.wal.most_common():
        if wal < received:  # under a byte per reception
            continue
        lines.append(
            f"| `{name}` | {per(wal)} | {per(shares.images[name])} "
            f"| {shares.image_count[name] / received:.3f} | {shares.records[name] / received:.2f} "
            f"| {sizes[name] / stored:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grow", type=int, default=1_000_000, help="receptions stored first")
    parser.add_argument("--window", type=int, default=300_000, help="receptions then measured")
    parser.add_argument("--config", choices=CONFIGS, default="default")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dlrfeed-wal-") as root:
        print(asyncio.run(measure(args.grow, args.window, args.config, Path(root))), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
