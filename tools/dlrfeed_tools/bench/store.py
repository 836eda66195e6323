"""Benchmark of the store: Store.ingest in batches on one connection vs a naive writer.

Starts its own throwaway PostgreSQL with durable settings (fsync, synchronous_commit and
full_page_writes on), records the sent messages, then measures in the same run:
- `Store.ingest` of realistic receipts (a progress and a result per message, ~5 % redelivered)
  in batches of `batch_size` on one pooled connection, parse and rules included;
- a naive writer: one INSERT and one COMMIT per receipt.
Each repetition uses a fresh database of the same cluster; the machine is shared and noisy, so
the figures are the medians over repetitions (each ratio is taken within its own repetition),
with every run and the load average beside them. Prints one JSON object. Measures only; never
asserts a time.

    python scripts/bench_store.py [--receipts 60000] [--batch-size 500] [--naive 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import asyncpg

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.pgcluster import throwaway_cluster
from gateway.receipts.v1 import feed_pb2

NAIVE_TABLE = """
CREATE TABLE IF NOT EXISTS public.naive_receptions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login text NOT NULL, message_id text NOT NULL, level bigint NOT NULL, stat text NOT NULL,
    err text, done_date text, delivery_count bigint NOT NULL, received_at timestamptz NOT NULL,
    payload bytea NOT NULL)
"""
NAIVE_INSERT = """
INSERT INTO public.naive_receptions
    (login, message_id, level, stat, err, done_date, delivery_count, received_at, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, to_timestamp($8), $9)
"""


def make_receipts(count: int, seed: int = 1) -> tuple[list[str], list[Receipt]]:
    """About `count` receipts: per message ENROUTE then DELIVRD, ~5 % delivered twice."""
    rng = random.Random(seed)
    message_ids = [f"{10**11 + i}" for i in range(count // 2)]
    receipts: list[Receipt] = []
    now = time.time()
    for message_id in message_ids:
        for level, stat in ((1, "ENROUTE"), (2, "DELIVRD")):
            wire = feed_pb2.Receipt(
                id=message_id,
                level=level,
                stat=stat,
                err="000",
                submit_date="2611291200",
                done_date="2611291201",
                text="Your code is 123456",
                destination_addr="+34600123456",
                ack_token=f"{message_id}.{level}",
                delivery_count=1,
            )
            receipt = Receipt(
                message_id=MessageId(message_id),
                level=level,
                stat=stat,
                err="000",
                sub=None,
                dlvrd=None,
                submit_date="2611291200",
                done_date="2611291201",
                text="Your code is 123456",
                source_addr=None,
                destination_addr="+34600123456",
                smsc_message_id=None,
                connector=None,
                delivery_count=1,
                ack_token=AckToken(wire.ack_token),
                raw=wire.SerializeToString(),
                received_at=now,
            )
            receipts.append(receipt)
            if rng.random() < 0.05:
                receipts.append(receipt)  # a redelivery: becomes a repeat
    return message_ids, receipts[:count]


async def measure_store(
    dsn: str, *, receipts: int = 60_000, batch_size: int = 500, naive_receipts: int = 3_000
) -> dict[str, Any]:
    """Throughput of Store.ingest (one connection, `batch_size`) and of a naive writer on `dsn`.

    `dsn` must be a migrated, empty database of a durable server. Returns the figures as a dict
    (receipts/s of each, the ratio, batch latency percentiles) for a combined benchmark.
    """
    message_ids, batch_input = make_receipts(receipts)
    store = await Store.open(dsn, pool_size=1)
    try:
        for start in range(0, len(message_ids), 5_000):
            await store.record_submissions(
                [Submission(LOGIN, m, "+34600123456") for m in message_ids[start : start + 5_000]]
            )
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        started = time.perf_counter()
        for start in range(0, len(batch_input), batch_size):
            t0 = time.perf_counter()
            result = await store.ingest(LOGIN, batch_input[start : start + batch_size])
            latencies.append(time.perf_counter() - t0)
            for outcome, n in result.counts.items():
                outcomes[outcome.value] = outcomes.get(outcome.value, 0) + n
        store_seconds = time.perf_counter() - started
    finally:
        await store.close()

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(NAIVE_TABLE)
        sample = batch_input[:naive_receipts]
        started = time.perf_counter()
        for r in sample:
            # Autocommit: each INSERT is its own transaction, one COMMIT (and fsync) per receipt.
            await conn.execute(
                NAIVE_INSERT,
                LOGIN,
                r.message_id,
                r.level,
                r.stat,
                r.err,
                r.done_date,
                r.delivery_count,
                r.received_at,
                r.raw,
            )
        naive_seconds = time.perf_counter() - started
    finally:
        await conn.close()

    latencies.sort()
    store_rate = len(batch_input) / store_seconds
    naive_rate = len(sample) / naive_seconds
    return {
        "store_receipts": len(batch_input),
        "batch_size": batch_size,
        "store_seconds": round(store_seconds, 3),
        "store_receipts_per_s": round(store_rate),
        "batch_ms_p50": round(1000 * latencies[len(latencies) // 2], 2),
        "batch_ms_p99": round(1000 * latencies[int(len(latencies) * 0.99)], 2),
        "outcomes": outcomes,
        "naive_receipts": len(sample),
        "naive_receipts_per_s": round(naive_rate),
        "speedup_vs_naive": round(store_rate / naive_rate, 1),
        "targets": {"store_receipts_per_s": 20_000, "speedup_vs_naive": 30},
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with throwaway_cluster("bench-store-") as cluster:
        runs: list[dict[str, Any]] = []
        for repetition in range(args.repeat):
            database = f"bench_{repetition}"
            await migrate(await cluster.create_database(database))
            run = await measure_store(
                cluster.dsn_for(database),
                receipts=args.receipts,
                batch_size=args.batch_size,
                naive_receipts=args.naive,
            )
            run["load_average_1m"] = round(os.getloadavg()[0], 2)
            runs.append(run)
    return {
        "store_receipts_per_s": round(statistics.median(r["store_receipts_per_s"] for r in runs)),
        "naive_receipts_per_s": round(statistics.median(r["naive_receipts_per_s"] for r in runs)),
        "speedup_vs_naive": round(statistics.median(r["speedup_vs_naive"] for r in runs), 1),
        "batch_ms_p50": round(statistics.median(r["batch_ms_p50"] for r in runs), 2),
        "repetitions": len(runs),
        "targets": {"store_receipts_per_s": 20_000, "speedup_vs_naive": 30},
        "fsync": True,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on a fresh durable cluster and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--receipts", type=int, default=60_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--naive", type=int, default=3_000, help="receipts for the naive writer")
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions, each on a fresh database"
    )
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_main(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
