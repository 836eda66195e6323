"""Growth benchmark: one long-lived daemon and store fed gateway-shaped traffic until the store
is large.

Production is not the empty database of `make bench`: ids as the gateway issues them (random,
UUID-like), a message's result in a later batch than its progress, ~5 % redeliveries, the sending
application recording its sent messages just before their receipts come, and a store that only
grows. For each configuration of PostgreSQL (its own throwaway cluster, fsync on) this process
records the sent messages through a `Store` (pool of 2), as a sending application does, and
hands the receipts to dlrfeed (growth_drivers): by default through fakegw to one long-lived
`dlrfeed run`, with `--driver store` straight to `Store.ingest`, without the feed. Per step of
stored receptions it reports:
- ingest rate (receptions/s, wall) and CPU per reception of the client (the daemon, or this
  process) and of the server (the machine is shared: CPU is the steadier measure);
- batch latency p50/p99 of `Store.ingest` (the daemon's commit histogram, or ~525 receptions a
  batch timed here), and the daemon's resident memory;
- `record_submissions` of 5,000 ids (every 20 batches; 2 % of them recorded late, after their
  receipts, so the call also correlates): p50/p99/max wall, the most server CPU one took, and
  the profile of the slowest (bench/sender_time.py): the CPU the sending side spent on it (this
  process and its connections' backends), the CPU everything else spent meanwhile on the same
  CPUs (the ingest), their idle time, and where its backend was in 10 ms samples (working, or
  waiting for a lock, the WAL, the disk, or the bench's next statement);
- WAL bytes per reception over the step, disk bytes per reception stored (database size).
- the bytes on disk of each table and each index, per reception: the disk profile; and where
  a row's bytes go, column by column, from a sample of each table (the row profile).
It measures and reports; it never asserts a time. Writes a Markdown report (`--out`, rewritten
after every step, so an interrupted run keeps its figures) and prints the same figures as JSON.
With `--pinned` the configurations run side by side, each process and its cluster on its own CPU.

This module is the run loop and the command line; the traffic is `growth_traffic`, the
PostgreSQL configurations `growth_configs`, what is read off the server (CPU, WAL, the disk and
row profiles) `growth_profile`, the report `growth_report`, and how receipts reach the store
`growth_drivers`.

    python scripts/bench_growth.py [--receipts 20000000] [--step 1000000] [--driver store]
        [--configs default=8000000,recommended] [--pinned] [--out docs/benchmarks-growth.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.store import Store
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.bench.growth_configs import (
    CONFIGS,
    check_settings,
    config_cluster,
    config_sizes,
)
from dlrfeed_tools.bench.growth_drivers import (
    DRIVERS,
    DaemonDriver,
    Driver,
    StepIngest,
    StoreDriver,
)
from dlrfeed_tools.bench.growth_profile import (
    checkpoints,
    row_profile,
    server_cpu_seconds,
    table_sizes,
    wal_lsn,
)
from dlrfeed_tools.bench.growth_report import config_result, markdown, merged_reports, report_key
from dlrfeed_tools.bench.growth_traffic import (
    BATCHES_PER_ROUND,
    MESSAGES_PER_BATCH,
    REDELIVERED_SHARE,
    Traffic,
)
from dlrfeed_tools.bench.placement import thread_affinity
from dlrfeed_tools.bench.sender_time import SenderClock, SenderTime, sender_dsn
from dlrfeed_tools.metrics import nearest_rank
from dlrfeed_tools.pgcluster import PgCluster


@dataclass
class Step:
    """What one step of growth cost."""

    stored: int = 0
    receptions: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    wal_bytes: int = 0
    submissions_ms: list[float] = field(default_factory=list)
    submissions_cpu_ms: list[float] = field(default_factory=list)  # the server's, during each
    slowest_submission: SenderTime | None = None  # the profile of the longest of submissions_ms
    database_bytes: int = 0  # growth of the database since it was freshly migrated
    checkpoints: int = 0

    def row(self, ingest: StepIngest) -> dict[str, Any]:
        """The report's row, with what dlrfeed's side cost (batch latency, client CPU, the
        daemon's memory)."""
        submissions = sorted(self.submissions_ms)
        row = {
            "stored": self.stored,
            "receptions_per_s": round(self.receptions / self.seconds) if self.seconds else 0,
            "client_cpu_us": round(1e6 * ingest.client_cpu_s / self.receptions, 1),
            "server_cpu_us": round(1e6 * self.server_cpu_s / self.receptions, 1),
            "batch_p50_ms": round(ingest.batch_p50_ms, 1),
            "batch_p99_ms": round(ingest.batch_p99_ms, 1),
            "submissions_p50_ms": round(nearest_rank(submissions, 0.5), 1),
            "submissions_p99_ms": round(nearest_rank(submissions, 0.99), 1),
            "submissions_max_ms": round(max(submissions, default=0.0), 1),
            "submissions_server_cpu_max_ms": round(max(self.submissions_cpu_ms, default=0.0), 1),
            **(self.slowest_submission.columns() if self.slowest_submission else {}),
            "wal_bytes_per_reception": round(self.wal_bytes / self.receptions),
            "disk_bytes_per_reception": round(self.database_bytes / self.stored),
            "checkpoints": self.checkpoints,
        }
        if ingest.daemon_rss_mb is not None:
            row["daemon_rss_mb"] = round(ingest.daemon_rss_mb, 1)
        return row


StepReport = Callable[
    [list[dict[str, Any]], dict[str, dict[str, int]], dict[str, dict[str, float]]], None
]


async def grow(
    cluster: PgCluster,
    dsn: str,
    receipts: int,
    step: int,
    log: Any,
    on_step: StepReport,
    driver_kind: str = "store",
) -> None:
    """Grow the store until `receipts` receptions are stored, the receipts handed to dlrfeed
    by `driver_kind` (growth_drivers.DRIVERS) while this process, as the sending application,
    records the sent messages; `on_step` after every `step` with the rows so far and the bytes
    of each table and index."""
    traffic = Traffic(seed=16)
    store = await Store.open(sender_dsn(dsn), pool_size=2)
    conn = await asyncpg.connect(dsn)
    sender = SenderClock(conn)
    rows: list[dict[str, Any]] = []
    stored = 0
    try:
        async with contextlib.AsyncExitStack() as stack:
            driver: Driver = (
                await stack.enter_async_context(DaemonDriver.open(dsn))
                if driver_kind == "daemon"
                else StoreDriver(store)
            )
            current = Step()
            empty_bytes = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
            wal0, cpu0 = await wal_lsn(conn), server_cpu_seconds(cluster)
            checkpoints0, started = await checkpoints(conn), time.monotonic()
            while stored < receipts:
                submissions = traffic.submissions()
                # Read in this order, so that neither reading lands inside the other's window.
                server0 = server_cpu_seconds(cluster)
                clock0 = await sender.read()
                async with sender.sampling() as waits:
                    t0 = time.perf_counter()
                    await store.record_submissions(submissions)
                    wall_ms = 1000 * (time.perf_counter() - t0)
                clock1 = await sender.read()
                current.submissions_cpu_ms.append(1000 * (server_cpu_seconds(cluster) - server0))
                if wall_ms > max(current.submissions_ms, default=0.0):
                    current.slowest_submission = SenderClock.between(clock0, clock1, waits)
                current.submissions_ms.append(wall_ms)
                batches = [traffic.batch(index) for index in range(BATCHES_PER_ROUND)]
                await driver.round(batches)
                handed = sum(map(len, batches))
                current.receptions += handed
                stored += handed
                if stored // step > (stored - current.receptions) // step or stored >= receipts:
                    ingest = await driver.step_end()
                    wal1, cpu1 = await wal_lsn(conn), server_cpu_seconds(cluster)
                    current.seconds = time.monotonic() - started
                    current.server_cpu_s, current.wal_bytes = cpu1 - cpu0, wal1 - wal0
                    current.stored = stored
                    current.database_bytes = (
                        int(await conn.fetchval("SELECT pg_database_size(current_database())"))
                        - empty_bytes
                    )
                    current.checkpoints = await checkpoints(conn) - checkpoints0
                    rows.append(current.row(ingest))
                    log(json.dumps(rows[-1]))
                    on_step(rows, await table_sizes(conn), await row_profile(conn, current.stored))
                    current = Step()
                    wal0, cpu0 = wal1, cpu1
                    checkpoints0, started = await checkpoints(conn), time.monotonic()
    finally:
        await conn.close()
        await store.close()


async def run_config(
    name: str,
    receipts: int,
    step: int,
    root: Path,
    log: Any,
    on_step: StepReport,
    driver_kind: str = "store",
) -> None:
    """One configuration on its own fresh cluster; its results go to `on_step`."""
    cluster = config_cluster(name, root)
    cluster.init()
    cluster.start()
    try:
        dsn = await cluster.create_database("growth")
        await check_settings(dsn, CONFIGS[name])
        await migrate(dsn)
        log(f"config {name}: {CONFIGS[name] or 'PostgreSQL defaults'}")
        await grow(cluster, dsn, receipts, step, log, on_step, driver_kind)
    finally:
        cluster.destroy()


def _run_pinned(
    sizes: dict[str, int],
    driver_kind: str,
    step: int,
    root: Path,
    report: dict[str, Any],
    log: Any,
    write: Callable[[], None],
) -> bool:
    """Each configuration in its own process, pinned to its own CPU (and so is its cluster,
    which inherits the affinity): the profiles run side by side without sharing a core. Each
    child writes its report as JSON after every step; the parent merges what they wrote into
    its own report every half minute, so an interrupted run still leaves its figures. True
    when every child finished."""
    cpus = sorted(os.sched_getaffinity(0))
    report["pinned"] = True
    children = []
    for index, (name, receipts) in enumerate(sizes.items()):
        cpu = cpus[index % len(cpus)]
        out = root / f"{name}.json"
        command = [
            sys.executable,
            "-m",
            __name__,
            "--configs",
            f"{name}={receipts}",
            "--step",
            str(step),
            "--driver",
            driver_kind,
            "--json",
            str(out),
        ]
        log(f"config {name}: pinned to CPU {cpu}")
        with thread_affinity({cpu}):
            child = subprocess.Popen(command)
        children.append((out, child))

    def merge() -> None:
        for out, _ in children:
            if out.exists():
                report["configs"].update(json.loads(out.read_text(encoding="utf-8"))["configs"])
        write()

    while any(child.poll() is None for _, child in children):
        time.sleep(30)
        merge()
    merge()
    return all(child.returncode == 0 for _, child in children)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receipts", type=int, default=20_000_000, help="grow to this many")
    parser.add_argument("--step", type=int, default=1_000_000, help="one report row per step")
    parser.add_argument(
        "--configs",
        default="default,recommended",
        help=f"comma-separated, of: {', '.join(CONFIGS)}; NAME=N grows that one to N instead",
    )
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        default="daemon",
        help="hand the receipts to a dlrfeed run daemon through fakegw, or to a Store directly",
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="run the configurations side by side, each process and cluster on its own CPU",
    )
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the report as JSON here, every step")
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: write --out (and --json) from reports saved by --json, their "
        "configurations merged",
    )
    args = parser.parse_args(argv)
    if args.render:
        saved = [json.loads(path.read_text(encoding="utf-8")) for path in args.render]
        merged = merged_reports(saved)
        text = markdown(merged)
        if args.json:
            args.json.write_text(json.dumps(merged, indent=2), encoding="utf-8")
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        else:
            print(text)
        return 0
    try:
        sizes = config_sizes(args.configs, args.receipts)
    except ValueError as exc:
        parser.error(str(exc))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    sample = Traffic(seed=16)
    sample.submissions()
    batch = sample.batch(0)
    report: dict[str, Any] = {
        "command": "python scripts/bench_growth.py " + " ".join(argv or sys.argv[1:]),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
        "receipt_bytes": round(statistics.mean(len(r.raw) for r in batch)),
        "batch_receptions": round(MESSAGES_PER_BATCH * 2 * (1 + REDELIVERED_SHARE)),
        "configs": {},
    }

    def write() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        if args.out:
            args.out.write_text(markdown(report), encoding="utf-8")

    finished = True
    with tempfile.TemporaryDirectory(prefix="dlrfeed-growth-") as root:
        if args.pinned:
            finished = _run_pinned(sizes, args.driver, args.step, Path(root), report, log, write)
        else:
            for name, receipts in sizes.items():

                def on_step(
                    steps: list[dict[str, Any]],
                    table_sizes: dict[str, dict[str, int]],
                    row_bytes: dict[str, dict[str, float]],
                    name: str = name,
                    receipts: int = receipts,
                ) -> None:
                    report["configs"][report_key(name, args.driver)] = config_result(
                        name, receipts, steps, table_sizes, args.driver, row_bytes
                    )
                    write()

                asyncio.run(
                    run_config(name, receipts, args.step, Path(root), log, on_step, args.driver)
                )
    write()
    print(json.dumps(report, indent=2))
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
