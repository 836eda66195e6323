"""What the status-change log costs the ingest: A/B runs of Store.ingest with the log's
triggers off, on without NOTIFY, and on as shipped (with NOTIFY).

Starts its own durable PostgreSQL (fsync on), then for each repetition ingests the same
receipts (scripts/bench_store.py `make_receipts`: a progress and a result per message, ~5 %
redelivered, so ~2 status changes per message) into three fresh databases, one per variant, in
an order that rotates between repetitions. It measures the CPU time of the client process and
of every server process (the cluster's backends, WAL writer, ...), which a noisy shared machine
disturbs much less than wall time, and reports CPU per receipt, receipts/s and the ratios of
each variant to "off" within the same repetition (medians over repetitions). `--writers 3`
ingests with three concurrent connections instead of one (commits that NOTIFY are serialised
by the server; this shows what that costs). Measures only; asserts nothing.

    python scripts/bench_changes.py [--receipts 40000] [--repeat 5] [--writers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.bench.store import make_receipts
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.pgcluster import PgCluster, throwaway_cluster

VARIANTS = ("off", "log", "log+notify")
_CHANGE_LOG_TRIGGERS = (
    "statuses_changes_insert",
    "statuses_changes_update",
    "statuses_changes_delete",
)
_TRIGGER_MS = """
SELECT total_time FROM pg_stat_user_functions
WHERE schemaname = 'dlr' AND funcname = 'record_statuses_changes'
"""
_TICKS = os.sysconf("SC_CLK_TCK")


def _server_cpu(postmaster_pid: int) -> dict[int, float]:
    """User + system CPU seconds of the postmaster and each of its children, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(fields[1])
        if postmaster_pid in (pid, ppid):
            found[pid] = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    return found


def _server_cpu_since(postmaster_pid: int, before: dict[int, float]) -> float:
    """Server CPU seconds spent since `before` by the processes alive now (a backend's CPU
    is gone from /proc once it exits, so this is read while the connections are open)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _server_cpu(postmaster_pid).items())


async def _prepare(cluster: PgCluster, name: str, variant: str, message_ids: list[str]) -> str:
    dsn = await cluster.create_database(name)
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        # Time spent inside the trigger function (pg_stat_user_functions), measured in the same
        # run as the ingest it slows: a share that the machine's noise hardly moves.
        await conn.execute(f"ALTER DATABASE {name} SET track_functions = 'pl'")
        if variant == "off":
            # The change log's triggers only: the row trigger that keeps change_epoch stays.
            for trigger in _CHANGE_LOG_TRIGGERS:
                await conn.execute(f"ALTER TABLE dlr.statuses DISABLE TRIGGER {trigger}")
        elif variant == "log":
            source = await conn.fetchval(
                "SELECT pg_get_functiondef('dlr.record_statuses_changes'::regproc)"
            )
            without = source.replace("PERFORM pg_notify('dlr_status_changes', '');", "NULL;")
            assert without != source, "the trigger function no longer notifies as expected"
            await conn.execute(without)
    finally:
        await conn.close()
    store = await Store.open(dsn, pool_size=1)
    try:
        for start in range(0, len(message_ids), 5_000):
            await store.record_submissions(
                [Submission(LOGIN, m, "+34600123456") for m in message_ids[start : start + 5_000]]
            )
    finally:
        await store.close()
    return dsn


async def _ingest(
    dsn: str, receipts: list[Receipt], writers: int, batch: int, postmaster: int
) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) seconds to ingest `receipts` with `writers` concurrent
    connections."""
    stores = [await Store.open(dsn, pool_size=1) for _ in range(writers)]
    # Each writer takes whole messages (its share of the ids), as several daemons would.
    shares: list[list[Receipt]] = [[] for _ in range(writers)]
    for receipt in receipts:
        shares[hash(receipt.message_id) % writers].append(receipt)

    async def run(store: Store, share: list[Receipt]) -> None:
        for start in range(0, len(share), batch):
            await store.ingest(LOGIN, share[start : start + batch])

    try:
        server_before, client_before = _server_cpu(postmaster), time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(run(s, share) for s, share in zip(stores, shares, strict=True)))
        wall = time.perf_counter() - started
        client = time.process_time() - client_before
        return wall, client, _server_cpu_since(postmaster, server_before)
    finally:
        for store in stores:
            await store.close()


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    message_ids, receipts = make_receipts(args.receipts)
    runs: list[dict[str, Any]] = []
    with throwaway_cluster("bench-changes-") as cluster:
        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        for repetition in range(args.repeat):
            order = VARIANTS[repetition % 3 :] + VARIANTS[: repetition % 3]
            run: dict[str, Any] = {"order": list(order)}
            for variant in order:
                name = f"bench_{repetition}_{variant.replace('+', '_')}"
                dsn = await _prepare(cluster, name, variant, message_ids)
                wall, client, server = await _ingest(
                    dsn, receipts, args.writers, args.batch_size, postmaster
                )
                await asyncio.sleep(0.5)  # exited backends flush their function statistics
                conn = await asyncpg.connect(dsn)
                changes = int(await conn.fetchval("SELECT count(*) FROM dlr.status_changes"))
                trigger_ms = float(await conn.fetchval(_TRIGGER_MS) or 0.0)
                await conn.close()
                run[variant] = {
                    "receipts_per_s": round(len(receipts) / wall),
                    "client_cpu_us_per_receipt": round(1e6 * client / len(receipts), 1),
                    "server_cpu_us_per_receipt": round(1e6 * server / len(receipts), 1),
                    "cpu_us_per_receipt": round(1e6 * (client + server) / len(receipts), 1),
                    "changes": changes,
                    # Share of the writers' ingest time spent in the trigger function.
                    "trigger_share_of_ingest": round(trigger_ms / 1000 / (wall * args.writers), 4),
                }
                await cluster.drop_database(name)
            for variant in VARIANTS[1:]:
                run[f"{variant}_vs_off"] = {
                    "cpu_per_receipt": round(
                        run[variant]["cpu_us_per_receipt"] / run["off"]["cpu_us_per_receipt"],
                        3,
                    ),
                    "throughput": round(
                        run[variant]["receipts_per_s"] / run["off"]["receipts_per_s"], 3
                    ),
                }
            run["load_average_1m"] = round(os.getloadavg()[0], 2)
            runs.append(run)

    def median(variant: str, key: str) -> float:
        return round(float(statistics.median(r[variant][key] for r in runs)), 3)

    return {
        "receipts": len(receipts),
        "writers": args.writers,
        "batch_size": args.batch_size,
        "repetitions": len(runs),
        "fsync": True,
        "medians": {
            variant: {
                key: median(variant, key)
                for key in (
                    "receipts_per_s",
                    "cpu_us_per_receipt",
                    "server_cpu_us_per_receipt",
                    "trigger_share_of_ingest",
                )
            }
            for variant in VARIANTS
        }
        | {
            f"{variant}_vs_off": {
                key: median(f"{variant}_vs_off", key) for key in ("cpu_per_receipt", "throughput")
            }
            for variant in VARIANTS[1:]
        },
        "target": "log+notify within 10 % of off (throughput >= 0.90, CPU per receipt <= 1.10)",
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the A/B benchmark and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--receipts", type=int, default=40_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--writers", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_main(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
