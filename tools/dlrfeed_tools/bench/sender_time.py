"""Where a `record_submissions` call's wall time went, on CPUs it shares with the ingest: the
CPU the sending side spent on it, the CPU everything else spent meanwhile on the same CPUs (the
daemon, fakegw, the ingest's backends, PostgreSQL's background work), and their idle time.

The sending side is this process and the backends of its connections, found by their
`application_name`; its CPU is the scheduler's per-thread time on a core
(`/proc/PID/task/TID/schedstat`, nanoseconds). The CPUs' busy and idle time are the kernel's
per-CPU counters (`/proc/stat`, clock ticks) of the CPUs this process may run on, which a
pinned run shares with its cluster and its daemon. On one CPU the three add up to the wall
time: a call that takes long while others' CPU is most of it waited for the core, one whose
CPUs sat idle waited for the disk or a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

APPLICATION_NAME = "dlrfeed-growth-sender"
_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 0.01
# What the sending side's backends are doing: waiting for a lock, the WAL or the disk (the
# wait event), working or waiting for the core (active without one), or waiting for the
# bench's next statement (idle in a transaction, or between the call's transactions).
_BACKENDS_NOW = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE application_name = $1 AND state <> 'idle'
"""


@dataclass(frozen=True)
class SenderTime:
    """One call: its own CPU, the others' CPU and the idle time of the CPUs it ran on
    meanwhile, in milliseconds."""

    cpu_ms: float
    others_cpu_ms: float
    idle_ms: float
    waits: dict[str, float] | None = None  # share of the samples (sampling) by what was seen

    def columns(self) -> dict[str, Any]:
        """The report's columns for the slowest call of a step."""
        columns: dict[str, Any] = {
            "submissions_max_cpu_ms": round(self.cpu_ms, 1),
            "submissions_max_others_cpu_ms": round(self.others_cpu_ms, 1),
            "submissions_max_idle_ms": round(self.idle_ms, 1),
        }
        if self.waits is not None:
            columns["submissions_max_waits"] = self.waits
        return columns


@dataclass(frozen=True)
class Reading:
    """The counters at one moment."""

    run_ns: dict[int, int]  # per process of the sending side: its threads' time on a core
    busy_ticks: int  # of the CPUs this process may run on
    idle_ticks: int  # idle and waiting for I/O, of the same CPUs


def sender_dsn(dsn: str) -> str:
    """`dsn` with the sending side's application_name, by which its backends are found."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={APPLICATION_NAME}"


def run_ns(pid: int) -> int:
    """Time on a core of every thread of `pid`, in nanoseconds; 0 once it has exited."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    return total


def cpu_ticks(cpus: set[int]) -> tuple[int, int]:
    """(busy, idle) clock ticks so far of `cpus`, from /proc/stat: idle counts waiting for I/O
    too, busy is the rest (user, nice, system, interrupts, steal)."""
    busy = idle = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, idle_, iowait, irq, softirq, steal = map(int, values[:8])
        busy += user + nice + system + irq + softirq + steal
        idle += idle_ + iowait
    return busy, idle


class SenderClock:
    """Reads the counters before and after a call."""

    def __init__(self, monitor: asyncpg.Connection) -> None:
        self._monitor = monitor
        self._cpus = os.sched_getaffinity(0)

    async def read(self) -> Reading:
        backends = await self._monitor.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", APPLICATION_NAME
        )
        pids = [os.getpid(), *(r["pid"] for r in backends)]
        busy, idle = cpu_ticks(self._cpus)
        return Reading({pid: run_ns(pid) for pid in pids}, busy, idle)

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[Counter[str]]:
        """While the body runs, every SAMPLE_SECONDS: what the sending side's backends are
        doing, counted by label (`wait_event_type:wait_event`, `CPU`, `client`). The monitor
        connection is this sampler's alone until the body ends; the last sample is let finish
        (cancelling a query midway would leave the connection busy)."""
        counts: Counter[str] = Counter()
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                rows = await self._monitor.fetch(_BACKENDS_NOW, APPLICATION_NAME)
                counts[_label(rows)] += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)

        task = asyncio.create_task(sample())
        try:
            yield counts
        finally:
            stop.set()
            await task

    @staticmethod
    def between(before: Reading, after: Reading, waits: Counter[str] | None = None) -> SenderTime:
        """The call that ran between two readings (a backend that connected meanwhile counts
        from zero), with what `sampling` saw meanwhile."""
        own_ms = sum(ns - before.run_ns.get(pid, 0) for pid, ns in after.run_ns.items()) / 1e6
        busy_ms = (after.busy_ticks - before.busy_ticks) * _TICK_MS
        return SenderTime(
            cpu_ms=own_ms,
            # Ticks are coarser than the scheduler's nanoseconds: never below zero.
            others_cpu_ms=max(0.0, busy_ms - own_ms),
            idle_ms=(after.idle_ticks - before.idle_ticks) * _TICK_MS,
            waits=(
                {k: round(n / sum(waits.values()), 2) for k, n in waits.most_common()}
                if waits
                else None
            ),
        )


def _label(backends: list[asyncpg.Record]) -> str:
    """One sample: the working backend's wait event, or CPU; `client` when none is working
    (the sending side is between statements: in its own code, or waiting for the core)."""
    for row in backends:
        if row["state"] == "active":
            if row["wait_event"] is None:
                return "CPU"
            return f"{row['wait_event_type']}:{row['wait_event']}"
    return "client"
