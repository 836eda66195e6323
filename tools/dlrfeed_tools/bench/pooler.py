"""What running without asyncpg's statement cache costs: Store.ingest direct vs through PgBouncer.

Starts a throwaway durable PostgreSQL and a PgBouncer in transaction mode in front of it, then
ingests the same receipts (scripts/bench_store.make_receipts) on one pooled connection three
ways, interleaved over repetitions, each on a fresh database: straight to PostgreSQL with the
statement cache (`--database-pooler none`), straight without it (`transaction`: the cost of the
unnamed statements alone) and through PgBouncer without it (plus the pooler's hop). The machine
is shared, so besides receipts/s it reports CPU time per receipt of this process and of the
PostgreSQL backend that served it (from /proc), which load on other cores disturbs far less.
Measures only; prints one JSON object.

    python scripts/bench_pooler.py [--receipts 30000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.config import Pooler
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.bench.store import make_receipts
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.pgbouncer import PgBouncer
from dlrfeed_tools.pgcluster import PgCluster, free_port

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process on this machine, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


async def _backend_pid(store: Store) -> int:
    # pool_size=1: the pool's one server connection (through PgBouncer: the one it leases out).
    async with store._pool.acquire() as conn:
        return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def measure(dsn: str, pooler: Pooler, receipts: int) -> dict[str, Any]:
    """Ingest `receipts` in batches of 500 on `dsn`; rate and CPU per receipt."""
    message_ids, batch_input = make_receipts(receipts)
    store = await Store.open(dsn, pool_size=1, pooler=pooler)
    try:
        await store.record_submissions([Submission(LOGIN, m, "+34600123456") for m in message_ids])
        backend = await _backend_pid(store)
        backend_before = _process_cpu_seconds(backend)
        client_before = time.process_time()
        started = time.perf_counter()
        for start in range(0, len(batch_input), 500):
            await store.ingest(LOGIN, batch_input[start : start + 500])
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        backend_cpu = _process_cpu_seconds(backend) - backend_before
        same_backend = backend == await _backend_pid(store)
    finally:
        await store.close()
    n = len(batch_input)
    return {
        "receipts_per_s": round(n / seconds),
        "client_cpu_us_per_receipt": round(1e6 * client_cpu / n, 1),
        "server_cpu_us_per_receipt": round(1e6 * backend_cpu / n, 1),
        "one_backend_throughout": same_backend,
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-pooler-") as root:
        cluster = PgCluster(Path(root) / "pg", free_port(), fsync=True)
        cluster.init()
        cluster.start()
        bouncer = PgBouncer(Path(root) / "bouncer", free_port(), cluster.port, pool_size=2)
        bouncer.start()
        ways = {
            "direct, statement cache": (cluster.dsn_for, Pooler.NONE),
            "direct, no statement cache": (cluster.dsn_for, Pooler.TRANSACTION),
            "PgBouncer transaction mode": (bouncer.dsn_for, Pooler.TRANSACTION),
        }
        runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
        try:
            for repetition in range(args.repeat):
                for index, (way, (dsn_for, pooler)) in enumerate(ways.items()):
                    database = f"bench_{repetition}_{index}"
                    await cluster.create_database(database)
                    await migrate(cluster.dsn_for(database))
                    runs[way].append(await measure(dsn_for(database), pooler, args.receipts))
                    conn = await asyncpg.connect(cluster.dsn)
                    await conn.execute("CHECKPOINT")
                    await conn.close()
        finally:
            bouncer.stop()
            cluster.destroy()
    medians = {
        way: {
            key: statistics.median(r[key] for r in found)
            for key in ("receipts_per_s", "client_cpu_us_per_receipt", "server_cpu_us_per_receipt")
        }
        for way, found in runs.items()
    }
    return {"receipts": args.receipts, "repetitions": args.repeat, "medians": medians, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison on fresh clusters and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--receipts", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_main(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
