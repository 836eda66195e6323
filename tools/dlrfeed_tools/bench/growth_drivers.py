"""How the growth benchmark hands its receipts to dlrfeed: straight to a `Store`, or through
the gateway's feed to one long-lived `dlrfeed run`.

Through the daemon, every receipt takes the production path: fakegw's queue (its own process),
the daemon's Subscribe streams, its batcher, `Store.ingest`, the Ack after the commit. Batch
latency is then the daemon's own `dlrfeed_batch_commit_seconds` histogram and client CPU the
daemon's; its resident memory is read at every step, so a daemon that grows with the store shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store
from dlrfeed_tools.bench import daemon_process
from dlrfeed_tools.bench.e2e import cpu_seconds, fakegw_process
from dlrfeed_tools.local_login import LOGIN, PASSWORD
from dlrfeed_tools.metrics import histogram_window, nearest_rank
from fakegw.admin_client import AdminClient
from fakegw.wire import RECEIPT_FIELDS

DRIVERS = ("store", "daemon")
INJECT_CHUNK = 2_000  # bodies per admin Inject: well under gRPC's 4 MB message limit
COMMIT_HISTOGRAM = "dlrfeed_batch_commit_seconds"
STALL_SECONDS = 120  # the gateway's lease (F6)


@dataclass(frozen=True)
class StepIngest:
    """What ingesting one step cost on dlrfeed's side."""

    batch_p50_ms: float
    batch_p99_ms: float
    client_cpu_s: float
    daemon_rss_mb: float | None = None


class Driver(Protocol):
    async def round(self, batches: Sequence[list[Receipt]]) -> None:
        """Hand over one round's batches, in order."""
        ...

    async def step_end(self) -> StepIngest:
        """Once every receipt handed over is stored: what the step cost since the last call."""
        ...


class StoreDriver:
    """`Store.ingest` of each batch in turn, timed one by one; client CPU is this process's."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._batch_ms: list[float] = []
        self._cpu0 = time.process_time()

    async def round(self, batches: Sequence[list[Receipt]]) -> None:
        for batch in batches:
            started = time.perf_counter()
            await self._store.ingest(LOGIN, batch)
            self._batch_ms.append(1000 * (time.perf_counter() - started))

    async def step_end(self) -> StepIngest:
        cpu, batches = time.process_time(), sorted(self._batch_ms)
        result = StepIngest(
            batch_p50_ms=nearest_rank(batches, 0.5),
            batch_p99_ms=nearest_rank(batches, 0.99),
            client_cpu_s=cpu - self._cpu0,
        )
        self._batch_ms, self._cpu0 = [], cpu
        return result


def webhook_body(receipt: Receipt) -> dict[str, Any]:
    """The receipt as fakegw's Inject takes it (the gateway assigns token and delivery_count)."""
    return {f: getattr(receipt, "message_id" if f == "id" else f) for f in RECEIPT_FIELDS}


class DaemonDriver:
    """Injects each round into fakegw and lets `dlrfeed run` drain it. The gateway is kept one
    round ahead (a round is injected before the previous one is waited for), so the daemon's
    streams never run dry while the sending side records the next round's messages."""

    def __init__(
        self, admin: AdminClient, process: subprocess.Popen[bytes], metrics_url: str
    ) -> None:
        self._admin = admin
        self._process = process
        self._metrics_url = metrics_url
        self._handed = 0  # receipts injected so far
        self._acked0 = 0  # the gateway's ack count before the first
        self._buckets0: list[tuple[float, float]] = []
        self._cpu0 = 0.0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, database_url: str) -> AsyncIterator[DaemonDriver]:
        """fakegw and `dlrfeed run --metrics` in their own processes, for one growth run."""
        with (
            tempfile.TemporaryDirectory(prefix="dlrfeed-growth-daemon-") as logs,
            fakegw_process() as target,
        ):
            log = Path(logs) / "dlrfeed.log"
            extra = ["--metrics", "127.0.0.1:0", "--log-level", "info"]
            with daemon_process.daemon(target, database_url, "auto", extra, log) as process:
                address = daemon_process.metrics_address(log, process)
                async with AdminClient(target, LOGIN, PASSWORD) as admin:
                    driver = cls(admin, process, f"http://{address}/metrics")
                    await driver._start()
                    yield driver

    async def _start(self) -> None:
        self._acked0 = await self._acked()
        self._buckets0 = await self._commit_buckets()
        self._cpu0 = cpu_seconds(self._process.pid)

    async def round(self, batches: Sequence[list[Receipt]]) -> None:
        bodies = [webhook_body(r) for batch in batches for r in batch]
        for start in range(0, len(bodies), INJECT_CHUNK):
            await self._admin.inject(bodies[start : start + INJECT_CHUNK])
        earlier_rounds, self._handed = self._handed, self._handed + len(bodies)
        await self._wait_acked(earlier_rounds)

    async def step_end(self) -> StepIngest:
        await self._wait_acked(self._handed)
        buckets, cpu = await self._commit_buckets(), cpu_seconds(self._process.pid)
        window = histogram_window(buckets, self._buckets0)
        result = StepIngest(
            batch_p50_ms=daemon_process.ms_quantile(0.5, window) or 0.0,
            batch_p99_ms=daemon_process.ms_quantile(0.99, window) or 0.0,
            client_cpu_s=cpu - self._cpu0,
            daemon_rss_mb=daemon_process.vm_kb(self._process.pid, "VmRSS") / 1024,
        )
        self._buckets0, self._cpu0 = buckets, cpu
        return result

    async def _acked(self) -> int:
        return int((await self._admin.stats())["acked"])

    async def _wait_acked(self, receipts: int) -> None:
        """Until the gateway counts `receipts` of ours acked: each is stored (acks follow the
        commit), so the store holds them. A daemon that exits, or acks nothing for a lease
        (F6: its receipts would be redelivered), ends the run with what it measured."""
        acked, progressed_at = await self._acked(), time.monotonic()
        while acked - self._acked0 < receipts:
            if self._process.poll() is not None:
                raise RuntimeError(f"dlrfeed run exited with {self._process.returncode}")
            if time.monotonic() - progressed_at > STALL_SECONDS:
                raise RuntimeError(f"dlrfeed run acked nothing for {STALL_SECONDS} s")
            await asyncio.sleep(0.02)
            previous, acked = acked, await self._acked()
            if acked > previous:
                progressed_at = time.monotonic()

    async def _commit_buckets(self) -> list[tuple[float, float]]:
        text = await asyncio.to_thread(daemon_process.http_text, self._metrics_url)
        return daemon_process.histogram_buckets(text, COMMIT_HISTOGRAM)
