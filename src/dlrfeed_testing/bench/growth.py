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

    python scripts/bench_growth.py [--receipts 20000000] [--step 1000000] [--driver store]
        [--configs default=8000000,recommended] [--pinned] [--out docs/benchmarks-growth.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_testing.bench.growth_drivers import (
    DRIVERS,
    DaemonDriver,
    Driver,
    StepIngest,
    StoreDriver,
)
from dlrfeed_testing.bench.sender_time import SenderClock, SenderTime, sender_dsn
from dlrfeed_testing.local_login import LOGIN
from dlrfeed_testing.metrics import nearest_rank
from dlrfeed_testing.pgcluster import PgCluster, free_port
from gateway.receipts.v1 import feed_pb2

MESSAGES_PER_BATCH = 250  # each batch: their progress + the previous batch's results + repeats
BATCHES_PER_ROUND = 20  # one record_submissions of 5,000 ids ahead of 20 batches
LATE_SHARE = 0.02  # of a round's messages, recorded only in the next round (late correlation)
REDELIVERED_SHARE = 0.05

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


class Traffic:
    """Gateway-shaped receipts and the sending side's records, deterministic for a seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._pending_results: list[Receipt] = []
        self._last_batch: list[Receipt] = []
        self._upcoming: list[str] = []
        self._held_back: list[str] = []

    def new_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def submissions(self) -> list[Submission]:
        """The next round's sent messages (5,000 ids): most of them ahead of their receipts,
        the ids held back from the round before now recorded after theirs (late)."""
        fresh = [self.new_id() for _ in range(MESSAGES_PER_BATCH * BATCHES_PER_ROUND)]
        self._upcoming = fresh
        held = set(self._rng.sample(fresh, int(len(fresh) * LATE_SHARE)))
        recorded = [m for m in fresh if m not in held] + self._held_back
        self._held_back = sorted(held)
        return [Submission(LOGIN, m, "+34600123456", submitted_at=None) for m in recorded]

    def batch(self, index: int) -> list[Receipt]:
        """Progress of this batch's messages, results of the previous batch's, ~5 % repeats."""
        now = time.time()
        ids = self._upcoming[index * MESSAGES_PER_BATCH : (index + 1) * MESSAGES_PER_BATCH]
        receipts = [self._receipt(m, 1, "ENROUTE", now) for m in ids]
        receipts += self._pending_results
        self._pending_results = [self._receipt(m, 2, "DELIVRD", now) for m in ids]
        repeats = self._rng.sample(self._last_batch, int(len(self._last_batch) * REDELIVERED_SHARE))
        receipts += [r._replace(delivery_count=2, received_at=now) for r in repeats]
        self._rng.shuffle(receipts)
        self._last_batch = receipts
        return receipts

    def _receipt(self, message_id: str, level: int, stat: str, now: float) -> Receipt:
        wire = feed_pb2.Receipt(
            id=message_id,
            level=level,
            stat=stat,
            err="000",
            sub="001",
            dlvrd="001",
            submit_date="2612011200",
            done_date="2612011201",
            text="Your verification code is 123456",
            source_addr="ACME",
            destination_addr="34600123456",
            smsc_message_id=f"{self._rng.getrandbits(64):016x}",
            connector="smsc-eu-1",
            ack_token=f"{message_id}.{level}.{self._rng.getrandbits(32):08x}",
            delivery_count=1,
        )
        return Receipt(
            message_id=MessageId(message_id),
            level=level,
            stat=stat,
            err=wire.err,
            sub=wire.sub,
            dlvrd=wire.dlvrd,
            submit_date=wire.submit_date,
            done_date=wire.done_date,
            text=wire.text,
            source_addr=wire.source_addr,
            destination_addr=wire.destination_addr,
            smsc_message_id=wire.smsc_message_id,
            connector=wire.connector,
            delivery_count=1,
            ack_token=AckToken(wire.ack_token),
            raw=wire.SerializeToString(),
            received_at=now,
        )


def server_cpu_seconds(cluster: PgCluster) -> float:
    """CPU (user + system) of the cluster's processes so far: the postmaster, the exited
    children it reaped, and the live ones (backends, checkpointer, WAL writer, autovacuum)."""
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
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


async def _wal_lsn(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def _checkpoints(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
    )


GROWING_TABLES = (
    "receptions",
    "events",
    "messages",
    "message_status",
    "status_changes",
    "exceptions",
)
# A partition's name is its table's with the day (or "_default") after it.
_PARTITION_DAY = re.compile(r"_(before_)?[0-9]{8}|_default")
LINE_POINTER_BYTES = 4  # each row's slot in its page, besides the row itself

# Bytes on disk of each growing table of dlr, summed over its partitions: the table itself
# (heap, TOAST, free-space and visibility maps) and each index, whose per-partition names lose
# their day so that one index of a partitioned table is one line.
SIZES_BY_RELATION = """
WITH tables AS (
    SELECT t.name, ('dlr.' || t.name)::regclass AS relid
    FROM unnest($1::text[]) AS t(name)
), parts AS (
    SELECT tables.name, p.relid
    FROM tables, LATERAL pg_partition_tree(tables.relid) AS p
    WHERE p.isleaf
    UNION ALL
    SELECT tables.name, tables.relid
    FROM tables JOIN pg_class AS c ON c.oid = tables.relid
    WHERE c.relkind = 'r'
)
SELECT parts.name AS table_name, '(table)' AS relation, sum(pg_table_size(parts.relid)) AS bytes
FROM parts GROUP BY parts.name
UNION ALL
SELECT parts.name, regexp_replace(c.relname, $2, ''),
       sum(pg_relation_size(c.oid))
FROM parts
JOIN pg_index AS x ON x.indrelid = parts.relid
JOIN pg_class AS c ON c.oid = x.indexrelid
GROUP BY 1, 2
"""

# A guess at the rows of each growing table, summed over its partitions, to size its sample:
# the statistics' live-row counts, which may trail the last commits by far (they are flushed
# and re-estimated lazily), so the profile counts rows from its sample instead.
LIVE_ROWS = """
SELECT relname, n_live_tup
FROM pg_stat_user_tables
WHERE schemaname IN ('dlr', 'dlr_partitions')
"""

# Rows sampled per table for its row profile: whole pages (SYSTEM), each page with the same
# probability, so the sample costs a few thousand page reads at any table size and is the
# same for the same pages (REPEATABLE). Its row count scaled up estimates the table's: exactly
# when the table is small enough to be read whole; on a large one pages hold unequal numbers of
# rows, and it was measured 1-5 % off on a 4.8 M-row table (four seeds, 1 % of its pages).
PROFILE_SAMPLE_ROWS = 50_000

StepReport = Callable[
    [list[dict[str, Any]], dict[str, dict[str, int]], dict[str, dict[str, float]]], None
]


async def _sizes(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    sizes: dict[str, dict[str, int]] = {}
    for r in await conn.fetch(SIZES_BY_RELATION, list(GROWING_TABLES), _PARTITION_DAY.pattern):
        sizes.setdefault(r["table_name"], {})[r["relation"]] = int(r["bytes"])
    return sizes


async def row_profile(conn: asyncpg.Connection, stored: int) -> dict[str, dict[str, float]]:
    """Where the bytes of each growing table's rows go: per table, its rows per reception
    stored, the mean bytes of a row (PostgreSQL's tuple header and the 4-byte line pointer
    included) and of each of its columns, from a sample of its pages. Names the floor under
    the disk per reception: what a row holds, not only how big each table is."""
    if not stored:
        return {}
    live: dict[str, int] = {}
    for r in await conn.fetch(LIVE_ROWS):
        table = _PARTITION_DAY.sub("", str(r["relname"]))
        live[table] = live.get(table, 0) + int(r["n_live_tup"])
    profile: dict[str, dict[str, float]] = {}
    for table in GROWING_TABLES:
        columns = [
            str(r["attname"])
            for r in await conn.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                f"dlr.{table}",
            )
        ]
        percent = min(100.0, 100.0 * PROFILE_SAMPLE_ROWS / max(live.get(table, 0), 1))
        # A NULL takes no bytes of the row (only its bit in the row's null bitmap).
        means = ", ".join(f'avg(coalesce(pg_column_size(t."{c}"), 0))' for c in columns)
        sampled = await conn.fetchrow(
            f"SELECT count(*), avg(pg_column_size(t.*)), {means} FROM dlr.{table} AS t"
            f" TABLESAMPLE SYSTEM ({percent}) REPEATABLE (16)"
        )
        if sampled is None or not sampled[0]:
            continue
        profile[table] = {
            "rows_per_reception": round(sampled[0] * 100.0 / percent / stored, 3),
            "row": round(float(sampled[1]) + LINE_POINTER_BYTES, 1),
            **{
                column: round(float(mean), 1)
                for column, mean in zip(columns, list(sampled)[2:], strict=True)
                if mean  # a column NULL in every row sampled holds nothing
            },
        }
    return profile


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
            wal0, cpu0 = await _wal_lsn(conn), server_cpu_seconds(cluster)
            checkpoints0, started = await _checkpoints(conn), time.monotonic()
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
                    wal1, cpu1 = await _wal_lsn(conn), server_cpu_seconds(cluster)
                    current.seconds = time.monotonic() - started
                    current.server_cpu_s, current.wal_bytes = cpu1 - cpu0, wal1 - wal0
                    current.stored = stored
                    current.database_bytes = (
                        int(await conn.fetchval("SELECT pg_database_size(current_database())"))
                        - empty_bytes
                    )
                    current.checkpoints = await _checkpoints(conn) - checkpoints0
                    rows.append(current.row(ingest))
                    log(json.dumps(rows[-1]))
                    on_step(rows, await _sizes(conn), await row_profile(conn, current.stored))
                    current = Step()
                    wal0, cpu0 = wal1, cpu1
                    checkpoints0, started = await _checkpoints(conn), time.monotonic()
    finally:
        await conn.close()
        await store.close()


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


def report_key(name: str, driver_kind: str) -> str:
    """The configuration's section of the report: a run through the daemon is a section of its
    own, beside the same settings driven through a Store."""
    return name if driver_kind == "store" else f"{name} through the daemon"


DRIVEN_BY = {
    "store": "one `Store` in the benchmark's process (`Store.ingest` of each batch in turn)",
    "daemon": "one long-lived `dlrfeed run` (default settings) draining fakegw's feed in its "
    "own process: Subscribe/Pull, batches, the Ack after each commit. Batch latency is its "
    "`dlrfeed_batch_commit_seconds` histogram, client CPU and RSS are its own. It ingests "
    "while the sending side records, so the server CPU during a `record_submissions` includes "
    "the ingest's",
}


def config_result(
    name: str,
    receipts: int,
    steps: list[dict[str, Any]],
    sizes: dict[str, dict[str, int]],
    driver_kind: str = "store",
    row_bytes: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """What the report keeps of one configuration, complete or not; `row_bytes` is the row
    profile of its last step (row_profile)."""
    stored = steps[-1]["stored"]
    result: dict[str, Any] = {
        "settings": CONFIGS[name],
        "driver": driver_kind,
        "target_receipts": receipts,
        "complete": stored >= receipts,
        "steps": steps,
        "bytes_per_reception_by_table": {
            table: round(sum(parts.values()) / stored) for table, parts in sizes.items()
        },
        "bytes_per_reception_by_relation": {
            f"{table} {relation}": round(size / stored)
            for table, parts in sizes.items()
            for relation, size in parts.items()
            if size  # an index of only empty partitions
        },
    }
    if row_bytes:
        result["row_bytes"] = row_bytes
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The growth targets (docs/benchmarks-growth.md), as measured: the last step against the
    first, and - for WAL, which a checkpoint inside a step swells - the mean of the last
    quarter of the steps against the first quarter's, each spanning checkpoints."""
    steps = result["steps"]
    first, last = steps[0], steps[-1]
    quarter = -(-len(steps) // 4)

    def mean_wal(part: list[dict[str, Any]]) -> float:
        return float(statistics.mean(s["wal_bytes_per_reception"] for s in part))

    slowest = max(steps, key=lambda s: s["submissions_max_ms"])
    profile: dict[str, Any] = {}
    if "submissions_max_cpu_ms" in slowest:
        profile = {
            "slowest_record_submissions_cpu_ms": slowest["submissions_max_cpu_ms"],
            "slowest_record_submissions_others_cpu_ms": slowest["submissions_max_others_cpu_ms"],
            "slowest_record_submissions_idle_ms": slowest["submissions_max_idle_ms"],
        }
    if "submissions_max_waits" in slowest:
        profile["slowest_record_submissions_backend"] = _waits_text(
            slowest["submissions_max_waits"]
        )
    return {
        "rate_last_over_first": round(last["receptions_per_s"] / first["receptions_per_s"], 2),
        "server_cpu_last_over_first": round(last["server_cpu_us"] / first["server_cpu_us"], 2),
        "wal_last_over_first": round(
            last["wal_bytes_per_reception"] / first["wal_bytes_per_reception"], 2
        ),
        "wal_last_quarter_over_first_quarter": round(
            mean_wal(steps[-quarter:]) / mean_wal(steps[:quarter]), 2
        ),
        "disk_bytes_per_reception": last["disk_bytes_per_reception"],
        "max_record_submissions_ms": max(s["submissions_max_ms"] for s in steps),
        "max_record_submissions_server_cpu_ms": max(
            s["submissions_server_cpu_max_ms"] for s in steps
        ),
        **profile,
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as docs/benchmarks-growth.md."""
    lines = [
        "# Growth benchmark (`make bench-growth`)",
        "",
        "Generated by `scripts/bench_growth.py`; do not edit by hand. What it drives and why: "
        "the script's docstring and docs/scaling.md; the settings: docs/postgresql.md.",
        "",
        *(
            [
                f"- command: `{report['command']}`",
                f"- when: {report['when']}, machine: {report['machine']}",
            ]
            if report["command"] is not None
            else [
                "- merged from the saved reports of several runs; each configuration names its own"
            ]
        ),
        f"- receipt size on the wire: ~{report['receipt_bytes']} bytes; the traffic comes in "
        f"batches of ~{report['batch_receptions']} receptions (a `Store` ingests each as it "
        "comes; the daemon batches what its streams deliver), with a record_submissions of "
        f"{MESSAGES_PER_BATCH * BATCHES_PER_ROUND} ids every {BATCHES_PER_ROUND} batches",
        "- rate is wall clock on a shared machine; CPU µs per reception (client = the process "
        "that hands the receipts to the store: parse, rules, encoding; server = every "
        "PostgreSQL process) is the steadier figure",
    ]
    if report.get("pinned"):
        lines.append(
            "- the configurations ran side by side, each in its own process pinned with its own "
            "PostgreSQL cluster to its own CPU (`--pinned`); they share the disk"
        )
    lines.append("")
    headers = [
        ("stored", "stored"),
        ("receptions_per_s", "rec/s"),
        ("server_cpu_us", "server µs/rec"),
        ("client_cpu_us", "client µs/rec"),
        ("batch_p50_ms", "batch p50 ms"),
        ("batch_p99_ms", "batch p99 ms"),
        ("submissions_p50_ms", "5k subs p50 ms"),
        ("submissions_p99_ms", "p99"),
        ("submissions_max_ms", "max"),
        ("submissions_server_cpu_max_ms", "server CPU max ms"),
        ("wal_bytes_per_reception", "WAL B/rec"),
        ("disk_bytes_per_reception", "disk B/rec"),
        ("checkpoints", "checkpoints"),
    ]
    for name, result in report["configs"].items():
        settings = ", ".join(f"`{k}={v}`" for k, v in result["settings"].items())
        lines += [f"## {name}", ""]
        if "run" in result:
            run = result["run"]
            pinned = ", pinned with its cluster to one CPU" if run["pinned"] else ""
            lines += [
                f"From the run of {run['when']} ({run['machine']}{pinned}): `{run['command']}`.",
                "",
            ]
        lines += [f"Settings: {settings or 'PostgreSQL defaults'}.", ""]
        lines += [f"Receipts driven by {DRIVEN_BY[result.get('driver', 'store')]}.", ""]
        columns = headers + [c for c in OPTIONAL_COLUMNS if c[0] in result["steps"][0]]
        lines.append("| " + " | ".join(title for _, title in columns) + " |")
        lines.append("|" + " --- |" * len(columns))
        for step in result["steps"]:
            lines.append("| " + " | ".join(f"{step[key]:,}" for key, _ in columns) + " |")
        lines += _waits_table(result["steps"])
        if not result["complete"]:
            lines += [
                "",
                f"**Reached {result['steps'][-1]['stored']:,} of "
                f"{result['target_receipts']:,} receptions**: the run stopped early or is still "
                "going; the rows above are what it has measured.",
            ]
        by_table = ", ".join(
            f"{k} {v}" for k, v in sorted(result["bytes_per_reception_by_table"].items())
        )
        lines += ["", f"Bytes per stored reception by table: {by_table}.", ""]
        lines += ["| relation | bytes per reception |", "| --- | --- |"]
        lines += [
            f"| {k} | {v:,} |" for k, v in sorted(result["bytes_per_reception_by_relation"].items())
        ]
        lines += _row_bytes_table(result.get("row_bytes", {}))
        lines.append("")
        lines += ["Targets (the last step against the first; WAL also by quarters of the run):", ""]
        lines += [f"- {k}: {v}" for k, v in targets(result).items()]
        lines.append("")
    return "\n".join(lines)


def _row_bytes_table(profile: dict[str, dict[str, float]]) -> list[str]:
    """Where a row's bytes go, table by table, largest column first (row_profile)."""
    if not profile:
        return []
    lines = [
        "",
        "Where a row's bytes go (mean bytes, from a sample of each table's pages at the last "
        f"step; a row also carries PostgreSQL's tuple header and its {LINE_POINTER_BYTES}-byte "
        "line pointer, the rest of `bytes per row`; rows per reception are the sample's rows "
        "scaled up: exact for a table read whole, a few percent either way for a large one):",
        "",
        "| table | rows per reception | bytes per row | its columns, largest first |",
        "| --- | --- | --- | --- |",
    ]
    for table, measured in sorted(profile.items(), key=lambda item: -item[1]["row"]):
        columns = {k: v for k, v in measured.items() if k not in ("rows_per_reception", "row")}
        by_size = sorted(columns.items(), key=lambda item: (-item[1], item[0]))
        listed = ", ".join(f"{name} {size:g}" for name, size in by_size)
        lines.append(
            f"| {table} | {measured['rows_per_reception']:g} | {measured['row']:g} | {listed} |"
        )
    return lines


def _waits_text(waits: dict[str, float]) -> str:
    return ", ".join(f"{label} {share:.0%}" for label, share in waits.items())


def _waits_table(steps: list[dict[str, Any]]) -> list[str]:
    """Where the backend of each step's slowest record_submissions was, when sampled."""
    sampled = [s for s in steps if "submissions_max_waits" in s]
    if not sampled:
        return []
    lines = [
        "",
        "The slowest `record_submissions` of each step, where its backend was (share of the "
        "samples taken every 10 ms; `CPU`: working or waiting for the core; `client`: waiting "
        "for the bench's next statement):",
        "",
        "| stored | slowest subs ms | its backend |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {s['stored']:,} | {s['submissions_max_ms']:,} | "
        f"{_waits_text(s['submissions_max_waits'])} |"
        for s in sampled
    ]
    return lines


OPTIONAL_COLUMNS = [
    ("daemon_rss_mb", "daemon RSS MB"),
    ("submissions_max_cpu_ms", "slowest subs: its CPU ms"),
    ("submissions_max_others_cpu_ms", "others' CPU ms"),
    ("submissions_max_idle_ms", "idle ms"),
]

_RUN_FIELDS = ("command", "when", "machine", "pinned")


def merged_reports(saved: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report of the configurations of several saved ones (a later one's configuration
    replaces an earlier one's of the same name). When they come from different runs, each
    configuration keeps the command, time and machine of its own run - a merged report keeps
    its configurations' own, so that it can be merged again with a later run."""
    runs = {tuple(str(part.get(field)) for field in _RUN_FIELDS) for part in saved}
    merged: dict[str, Any] = {**saved[0], "configs": {}}
    for part in saved:
        for name, result in part["configs"].items():
            if len(runs) > 1 and "run" not in result:
                result = {**result, "run": {f: part.get(f) for f in _RUN_FIELDS}}
            merged["configs"][name] = result
    if len(runs) > 1:
        merged.update(command=None, when=None, machine=None, pinned=False)
    return merged


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


def _pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


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
        child = subprocess.Popen(command, preexec_fn=functools.partial(_pin, cpu))
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
