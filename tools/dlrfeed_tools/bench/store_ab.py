"""A/B of Store.ingest between two source trees, in one run on one PostgreSQL cluster.

Each repetition ingests the same receipts (`bench.store.make_receipts`: a progress and a
result per message, ~5 % delivered twice, the messages recorded first) once with each tree's
code, in alternating order, each into a fresh database migrated by that tree's own
migrations. Each ingest runs in a child process whose `PYTHONPATH` is the tree's `src`, so
the two versions never share an interpreter; the child is this file run as a script, and
uses only what both trees have. Reports, per tree, the median over repetitions of: receipts/s
(wall), client CPU µs per receipt (the child process: parse, rules, encoding), server CPU µs
per receipt (every process of the cluster), WAL bytes per receipt and the database's growth in
bytes per receipt. Measures only; never asserts a time.

    python scripts/bench_store_ab.py --a ../base/src --b src [--receipts 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_FIGURES = ("receipts_per_s", "client_cpu_us", "server_cpu_us", "wal_bytes", "disk_bytes")


def cluster_cpu_seconds(datadir: Path) -> float:
    """CPU (user + system) of a cluster's processes so far: the postmaster, the exited children
    it reaped, and the live ones. Here, not in growth_profile, because the child may run
    against a tree without it: this file stays standard library only at its top."""
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = int((datadir / "postmaster.pid").read_text().split()[0])
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster:
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


async def _child(dsn: str, datadir: Path, receipts: int, batch_size: int) -> dict[str, float]:
    """One tree's ingest into the empty database `dsn` (run with that tree on the path)."""
    import asyncpg  # the child imports from the tree under test

    from dlrfeed.store import Store, Submission
    from dlrfeed.store.migrate import migrate
    from dlrfeed_tools.bench.store import make_receipts
    from dlrfeed_tools.local_login import LOGIN

    await migrate(dsn)
    message_ids, batch_input = make_receipts(receipts)
    conn = await asyncpg.connect(dsn)
    store = await Store.open(dsn, pool_size=1)
    try:
        for start in range(0, len(message_ids), 5_000):
            chunk = message_ids[start : start + 5_000]
            await store.record_submissions([Submission(LOGIN, m, "+34600123456") for m in chunk])
        await conn.execute("CHECKPOINT")
        size0 = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        wal0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        server0, client0, wall0 = cluster_cpu_seconds(datadir), time.process_time(), time.time()
        for start in range(0, len(batch_input), batch_size):
            await store.ingest(LOGIN, batch_input[start : start + batch_size])
        wall = time.time() - wall0
        client, server = time.process_time() - client0, cluster_cpu_seconds(datadir) - server0
        wal = int(
            await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal0)
        )
        await conn.execute(
            "VACUUM ANALYZE"
        )  # the visibility map and free space map, as a store has
        size = int(await conn.fetchval("SELECT pg_database_size(current_database())")) - size0
    finally:
        await store.close()
        await conn.close()
    n = len(batch_input)
    return {
        "receipts_per_s": n / wall,
        "client_cpu_us": 1e6 * client / n,
        "server_cpu_us": 1e6 * server / n,
        "wal_bytes": wal / n,
        "disk_bytes": size / n,
    }


def _run_tree(src: Path, dsn: str, datadir: Path, receipts: int, batch_size: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    command = [sys.executable, __file__, "--child", dsn, str(datadir), str(receipts)]
    out = subprocess.run(
        [*command, str(batch_size)], env=env, check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


async def _parent(args: argparse.Namespace) -> dict[str, Any]:
    from dlrfeed_tools.pgcluster import throwaway_cluster

    trees = {"a": Path(args.a), "b": Path(args.b)}
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    with throwaway_cluster("bench-store-ab-") as cluster:
        for repetition in range(args.repeat):
            order = ("a", "b") if repetition % 2 == 0 else ("b", "a")
            for tree in order:
                database = f"ab_{tree}_{repetition}"
                dsn = await cluster.create_database(database)
                run = _run_tree(trees[tree], dsn, cluster.datadir, args.receipts, args.batch_size)
                run["load_average_1m"] = round(os.getloadavg()[0], 2)
                runs[tree].append(run)
                print(tree, json.dumps(run), file=sys.stderr)
                await cluster.drop_database(database)
    medians = {
        tree: {k: round(statistics.median(r[k] for r in rs), 1) for k in _FIGURES}
        for tree, rs in runs.items()
    }
    return {
        "trees": {k: str(v) for k, v in trees.items()},
        "receipts": args.receipts,
        "batch_size": args.batch_size,
        "repetitions": args.repeat,
        "median": medians,
        "b_over_a": {k: round(medians["b"][k] / medians["a"][k], 3) for k in _FIGURES},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and print the figures as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        dsn, datadir, receipts, batch_size = argv[1:5]
        figures = asyncio.run(_child(dsn, Path(datadir), int(receipts), int(batch_size)))
        print(json.dumps(figures))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the first tree's src directory")
    parser.add_argument("--b", required=True, help="the second tree's src directory")
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    print(json.dumps(asyncio.run(_parent(parser.parse_args(argv))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
