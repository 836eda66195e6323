"""`Store.ingest` against the write floor: the least a store can do with the same receipts.

The floor is one idempotent write per receipt: an `INSERT … SELECT FROM unnest(…) ON CONFLICT
DO NOTHING` of each batch into one table keyed by (login, message_id, level), the key that
makes a redelivery a no-op, holding the receipt's fields and its raw payload. Both sides get
the same batches of production-shaped receipts (`workload`: random UUID message ids, a message's
result in the batch after its progress, ~5 % redelivered, every message recorded before its
receipts), one connection each to the same cluster, a batch per transaction. Repetitions
alternate the two (store, floor, store, floor, …), each on a fresh database, the cluster
checkpointed before the clock starts; figures are medians over repetitions, the ratio is taken
within each repetition. The store writes four rows a receipt (evidence, event, status, change),
so about 0.3 of the floor's rate would be "as cheap as its writes". Measures only; never
asserts a time.

    python scripts/bench_write_floor.py [--receipts 20000] [--repeat 5]   # prints JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission
from dlrfeed_tools.bench.growth_traffic import REDELIVERED_SHARE, Traffic
from dlrfeed_tools.bench.store_ab import cluster_cpu_seconds
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.pgcluster import PgCluster

BATCH_SIZE = 500  # the daemon's default batch

FLOOR_TABLE = """
CREATE TABLE floor_receipts (
    login text NOT NULL, message_id text NOT NULL, level smallint NOT NULL, stat text NOT NULL,
    err text, done_date text, delivery_count integer NOT NULL, received_at timestamptz NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (login, message_id, level))
"""
FLOOR_INSERT = """
INSERT INTO floor_receipts
    (login, message_id, level, stat, err, done_date, delivery_count, received_at, payload)
SELECT $1, r.message_id, r.level, r.stat, r.err, r.done_date, r.delivery_count,
       to_timestamp(r.received_at), r.payload
FROM unnest($2::text[], $3::smallint[], $4::text[], $5::text[], $6::text[], $7::integer[],
            $8::float8[], $9::bytea[])
    AS r(message_id, level, stat, err, done_date, delivery_count, received_at, payload)
ON CONFLICT DO NOTHING
"""
FIGURES = ("receipts_per_s", "server_cpu_us", "client_cpu_us", "wal_bytes")
SIDES = ("store", "floor")


@dataclass(frozen=True)
class Workload:
    """The sent messages, and the batches of their receipts in the order they are written."""

    message_ids: list[str]
    batches: list[list[Receipt]]

    @property
    def receipts(self) -> int:
        return sum(len(batch) for batch in self.batches)


def workload(receipts: int, batch_size: int = BATCH_SIZE, seed: int = 1) -> Workload:
    """About `receipts` receipts in batches of `batch_size` (the first and last smaller): each
    batch the progress of its own messages, the results of the previous batch's and, filling it
    up, ~5 % redeliveries of the previous batch's receipts, shuffled; deterministic for a seed."""
    traffic = Traffic(seed)
    rng = random.Random(seed)
    per_batch = (batch_size - math.ceil(batch_size * REDELIVERED_SHARE)) // 2
    redelivered = batch_size - 2 * per_batch  # a full batch: its progress, results, repeats
    chunks = max(1, receipts // batch_size)
    message_ids = [traffic.new_id() for _ in range(chunks * per_batch)]
    now = time.time()
    batches: list[list[Receipt]] = []
    previous: list[Receipt] = []
    results: list[Receipt] = []
    for start in range(0, len(message_ids) + 1, per_batch):
        ids = message_ids[start : start + per_batch]
        batch = [traffic.receipt(m, 1, "ENROUTE", now) for m in ids] + results
        repeats = rng.sample(previous, min(len(previous), redelivered))
        batch += [r._replace(delivery_count=2) for r in repeats]
        rng.shuffle(batch)
        batches.append(batch)
        previous, results = batch, [traffic.receipt(m, 2, "DELIVRD", now) for m in ids]
    return Workload(message_ids, batches)


async def _timed(
    dsn: str,
    datadir: Path,
    batches: Sequence[list[Receipt]],
    write: Callable[[list[Receipt]], Awaitable[None]],
) -> dict[str, float]:
    """Rate, CPU and WAL per receipt of `write` over every batch, from a fresh checkpoint (so
    both sides pay the same full-page images). Server CPU is every process of the cluster
    whose data directory is `datadir`."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT")
        wal0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        server0, client0 = cluster_cpu_seconds(datadir), time.process_time()
        started = time.perf_counter()
        for batch in batches:
            await write(batch)
        wall = time.perf_counter() - started
        client, server = time.process_time() - client0, cluster_cpu_seconds(datadir) - server0
        wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal0)
    finally:
        await conn.close()
    n = sum(len(batch) for batch in batches)
    return {
        "receipts_per_s": n / wall,
        "server_cpu_us": 1e6 * server / n,
        "client_cpu_us": 1e6 * client / n,
        "wal_bytes": float(wal) / n,
    }


async def measure_store(dsn: str, datadir: Path, work: Workload) -> dict[str, Any]:
    """`Store.ingest` of every batch on one pooled connection, the messages recorded first
    (untimed); the figures and the outcomes the store reported."""
    outcomes: dict[str, int] = {}
    store = await Store.open(dsn, pool_size=1)
    try:
        for start in range(0, len(work.message_ids), 5_000):
            chunk = work.message_ids[start : start + 5_000]
            await store.record_submissions([Submission(LOGIN, m, "+34600123456") for m in chunk])

        async def ingest(batch: list[Receipt]) -> None:
            result = await store.ingest(LOGIN, batch)
            for outcome, n in result.counts.items():
                outcomes[outcome.value] = outcomes.get(outcome.value, 0) + n

        figures: dict[str, Any] = await _timed(dsn, datadir, work.batches, ingest)
    finally:
        await store.close()
    return figures | {"outcomes": outcomes}


async def measure_floor(dsn: str, datadir: Path, work: Workload) -> dict[str, Any]:
    """The floor's INSERT of every batch on one connection (autocommit: a transaction a batch,
    as the store's); the figures and the rows the table holds after."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(FLOOR_TABLE)

        async def insert(batch: list[Receipt]) -> None:
            await conn.execute(
                FLOOR_INSERT,
                LOGIN,
                [r.message_id for r in batch],
                [r.level for r in batch],
                [r.stat for r in batch],
                [r.err for r in batch],
                [r.done_date for r in batch],
                [r.delivery_count for r in batch],
                [r.received_at for r in batch],
                [r.raw for r in batch],
            )

        figures: dict[str, Any] = await _timed(dsn, datadir, work.batches, insert)
        rows = await conn.fetchval("SELECT count(*) FROM floor_receipts")
    finally:
        await conn.close()
    return figures | {"rows": rows}


async def measure(
    cluster: PgCluster,
    template: str,
    *,
    receipts: int = 20_000,
    batch_size: int = BATCH_SIZE,
    repetitions: int = 5,
) -> dict[str, Any]:
    """Store.ingest and the floor alternately, `repetitions` times each, on `cluster`; the
    store's databases are copies of `template` (a migrated, empty database). Returns the
    figures of every run, their medians and the ratio store / floor of the rates."""
    work = workload(receipts, batch_size)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for repetition in range(repetitions):
        for side in SIDES:
            name = f"write_floor_{side}_{repetition}"
            await cluster.drop_database(name)
            dsn = await cluster.create_database(
                name, template=template if side == "store" else None
            )
            write = measure_store if side == "store" else measure_floor
            run = await write(dsn, cluster.datadir, work)
            runs[side].append(run)
            await cluster.drop_database(name)
    medians = {
        side: {k: round(statistics.median(r[k] for r in rs), 1) for k in FIGURES}
        for side, rs in runs.items()
    }
    ratios = [
        s["receipts_per_s"] / f["receipts_per_s"]
        for s, f in zip(runs["store"], runs["floor"], strict=True)
    ]
    return {
        "receipts": work.receipts,
        "messages": len(work.message_ids),
        "batch_size": batch_size,
        "repetitions": repetitions,
        "median": medians,
        "rate_ratio": round(statistics.median(ratios), 3),
        "rate_ratios": [round(r, 3) for r in ratios],
        "runs": runs,
    }


def report_section(figures: dict[str, Any]) -> list[str]:
    """The Markdown section of docs/benchmarks.md for the figures `measure` returned."""
    store, floor = figures["median"]["store"], figures["median"]["floor"]
    lines = [
        "",
        "## Store.ingest against the write floor",
        "",
        "The floor is one idempotent write per receipt: an `INSERT … SELECT FROM unnest(…) "
        "ON CONFLICT DO NOTHING` of each batch into one table keyed by (login, message_id, "
        "level), with the receipt's fields and raw payload (`bench.write_floor`). Both write "
        f"the same {figures['receipts']:,} receipts ({figures['messages']:,} messages with "
        "random UUID ids, each result in the batch after its progress, ~5 % redelivered, the "
        f"messages recorded first) in the same batches of up to {figures['batch_size']}, a "
        "transaction a batch on one connection each, alternately (store, floor, store, …), "
        f"{figures['repetitions']} repetitions on fresh databases of this run's PostgreSQL, "
        "each from a checkpoint. Medians; the ratio is taken within each repetition. Per "
        "receipt: CPU of PostgreSQL's every process and of the benchmark process that writes "
        "(for the store, its parsing and rules too), and WAL.",
        "",
        "| writer | receipts/s | PostgreSQL CPU µs | client CPU µs | WAL bytes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, f in (("`Store.ingest`", store), ("write floor", floor)):
        lines.append(
            f"| {label} | {f['receipts_per_s']:,.0f} | {f['server_cpu_us']:.1f} | "
            f"{f['client_cpu_us']:.1f} | {f['wal_bytes']:,.0f} |"
        )
    server = (
        f"{store['server_cpu_us'] / floor['server_cpu_us']:.1f} x the floor's"
        if floor["server_cpu_us"]
        else "n/a (the floor's below the clock's resolution)"
    )
    lines += [
        "",
        f"`Store.ingest` / floor: **{figures['rate_ratio']:.2f}** of the floor's rate "
        f"(repetitions: {', '.join(f'{r:.2f}' for r in figures['rate_ratios'])}); PostgreSQL "
        f"CPU per receipt {server}. With one batch in flight on one connection, client and "
        "server take turns, so each rate follows the sum of the two CPU columns: "
        f"{store['server_cpu_us'] + store['client_cpu_us']:.1f} against "
        f"{floor['server_cpu_us'] + floor['client_cpu_us']:.1f} µs per receipt. The store writes "
        "four rows a receipt (evidence, event, status, change): about 0.3 would be as cheap as "
        "its writes. Reported, no target.",
    ]
    return lines


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from dlrfeed.store.migrate import migrate
    from dlrfeed_tools.pgcluster import throwaway_cluster

    with throwaway_cluster("bench-write-floor-") as cluster:
        await migrate(await cluster.create_database("write_floor_template"))
        return await measure(
            cluster,
            "write_floor_template",
            receipts=args.receipts,
            batch_size=args.batch_size,
            repetitions=args.repeat,
        )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison on a fresh durable cluster and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--receipts", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each side")
    print(json.dumps(asyncio.run(_main(parser.parse_args(argv))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
