"""`make bench`: ceilings, dlrfeed end to end and a naive consumer side by side.

One run, one fakegw (`--store :memory:`) and one PostgreSQL (fsync on), all separate processes
on this machine, so every figure is comparable with the others of the same run:

- (a) feed ceiling: dlrfeed's own `FeedClient` draining the backlog and acking in batches,
  storing nothing (`bench.e2e.feed_only`), with as many streams as the configuration has;
- (b) store ceiling: `Store.ingest` of the same receipts from memory, in batches of 500, as
  many concurrent batches as the configuration has readers (`bench.e2e.store_only`);
- (c) the real `dlrfeed run` process draining a preloaded backlog (`bench.e2e.end_to_end`);
- (d) the naive consumer (`bench.naive_consumer.consume`): one INSERT + COMMIT and one Ack
  per receipt;
- (e) peak RSS (VmHWM from /proc) of `dlrfeed run` with a backlog of 10k, 100k and 1M;
- (f) receive→ack latency at about half of (c)'s Subscribe throughput, from a paced injector,
  computed per receipt from fakegw's ledger (enqueue time → ack time);
- with py-spy installed, a profile of the daemon on Subscribe and on Pull;
- (g) `Store.ingest` against the write floor, one idempotent INSERT per receipt of the same
  batches on one connection, alternately (`bench.write_floor`).

Repetitions of (a)-(d) are interleaved (config 1, 2, …, then again) so that a burst of load from
other work on the shared machine spreads over every configuration instead of one.
`bench.report` turns the results into docs/benchmarks.md and its chart, `bench.profile` reads
py-spy's samples; nothing here asserts a time.

    python scripts/bench.py --out docs/benchmarks.md [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed_tools.bench import daemon_process, naive_consumer, placement, write_floor
from dlrfeed_tools.bench import e2e as bench_e2e
from dlrfeed_tools.bench.latency import (
    latency_id,
    ledger_latencies,
    paced_inject,
    received_by_mode,
)
from dlrfeed_tools.bench.machine import machine
from dlrfeed_tools.bench.profile import summarise_profile
from dlrfeed_tools.bench.report import draw_chart, hand_written_section, render_report
from dlrfeed_tools.bench.store import measure_store
from dlrfeed_tools.local_login import LOGIN, PASSWORD
from dlrfeed_tools.pgcluster import PgCluster, free_port
from fakegw.admin_client import SyncAdminClient
from fakegw.spawn import serving

LATENCY_PREFIX = "lat"


@dataclass(frozen=True)
class Configuration:
    """One end-to-end configuration of `dlrfeed run` (c) and its ceilings (a, b)."""

    mode: str
    processes: int
    streams: int

    @property
    def name(self) -> str:
        return f"{self.mode} {self.processes}x{self.streams}"

    @property
    def readers(self) -> int:
        return self.processes * self.streams


CONFIGURATIONS = (
    Configuration("subscribe", 1, 2),
    Configuration("subscribe", 2, 2),
    Configuration("pull", 1, 2),
    Configuration("pull", 2, 2),
    Configuration("auto", 1, 2),
    Configuration("auto", 2, 2),
)

GATEWAY_APART = tuple(c for c in CONFIGURATIONS if c.mode in ("subscribe", "pull"))
"""(c) again with fakegw on a CPU of its own (`bench.placement`), for Subscribe against Pull."""


@dataclass(frozen=True)
class Sizes:
    """How much each part of the run moves; sized for ~15 minutes on 2 shared cores."""

    repetitions: int = 5
    e2e_receipts: int = 60_000  # a measurement of ~2 s: the end-time poll (50 ms) matters less
    naive_receipts: int = 1_500
    store_reference_receipts: int = 30_000
    backlogs: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    backlog_time_limit_s: float = 35.0
    latency_seconds: float = 20.0
    latency_warmup_seconds: float = 3.0
    profile_seconds: float = 10.0
    profile_receipts: int = 80_000
    write_floor_receipts: int = 20_000
    write_floor_repetitions: int = 5


QUICK_SIZES = Sizes(
    repetitions=3,
    e2e_receipts=4_000,
    naive_receipts=200,
    store_reference_receipts=4_000,
    backlogs=(2_000, 10_000, 40_000),
    backlog_time_limit_s=6.0,
    latency_seconds=6.0,
    latency_warmup_seconds=1.0,
    profile_seconds=3.0,
    profile_receipts=20_000,
    write_floor_receipts=2_000,
    write_floor_repetitions=3,
)


# ---------------------------------------------------------------------------- figures


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (receipts/s)."""
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
    }


def _median_per_key(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Key by key, the median over repetitions of per-process CPU figures."""
    keys = sorted({k for run in runs for k in run})
    return {k: round(statistics.median(r[k] for r in runs if k in r), 2) for k in keys}


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of already sorted values."""
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


# ---------------------------------------------------------------------------- processes


def _acked(target: str) -> int:
    return bench_e2e.acked(target)


def _wait_first_ack(target: str, base: int, process: subprocess.Popen[bytes]) -> None:
    while _acked(target) == base:
        if process.poll() is not None:
            raise RuntimeError(f"dlrfeed run exited with {process.returncode}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------- the run


class Bench:
    """Holds the one fakegw and the one PostgreSQL of a run and measures against them."""

    def __init__(
        self,
        target: str,
        cluster: PgCluster,
        runner: asyncio.Runner,
        sizes: Sizes,
        meter: bench_e2e.CpuMeter,
    ):
        self.target = target
        self.cluster = cluster
        self.meter = meter
        self.runner = runner
        self.sizes = sizes
        self._offset = 0  # receipt numbers already used: every receipt id is new
        self._databases = 0
        self._latency_runs = 0  # each latency run tags its receipt ids with its own prefix

    def preload(self, count: int) -> float:
        """Inject `count` fresh receipts; returns the inject rate."""
        started = time.perf_counter()
        bench_e2e.preload(self.target, count, self._offset)
        self._offset += count
        return count / (time.perf_counter() - started)

    def fresh_database(self, message_ids: Iterable[str] = ()) -> str:
        """A new database from the migrated template, with these sent messages recorded."""
        self._databases += 1
        url = self.runner.run(
            bench_e2e.fresh_database(self.cluster, "bench_template", self._databases)
        )
        self.runner.run(bench_e2e.record_messages(url, message_ids))
        return url

    def preloaded_messages(self, count: int) -> list[str]:
        """The message ids of the next `count` receipts `preload` injects."""
        return [bench_e2e.message_id(n) for n in range(self._offset, self._offset + count)]

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        self.runner.run(_execute(self.cluster.dsn, f"DROP DATABASE {name} WITH (FORCE)"))

    def ceilings_and_e2e(
        self, configuration: Configuration
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """One repetition of (a), (b) and (c) for `configuration`: the rates, and the CPU
        each process spent per receipt in each of the three."""
        count = self.sizes.e2e_receipts
        self.preload(count)
        feed_mode = "pull" if configuration.mode == "pull" else "subscribe"
        before = self.meter.read()
        feed = self.runner.run(
            bench_e2e.feed_only(self.target, count, feed_mode, configuration.readers)
        )
        feed_cpu = bench_e2e.cpu_per_receipt(before, self.meter.read(), count)
        url = self.fresh_database()
        store, store_cpu = self.runner.run(
            bench_e2e.store_only(url, count, 500, configuration.readers, self.meter)
        )
        self.drop_database(url)
        e2e_rate, e2e_cpu = self.end_to_end(configuration)
        rates = {"feed": feed, "store": store, "e2e": e2e_rate}
        cpu = {"feed": feed_cpu, "store": store_cpu, "e2e": e2e_cpu}
        return rates, cpu

    def end_to_end(
        self, configuration: Configuration, split: placement.CpuSplit | None = None
    ) -> tuple[float, dict[str, float]]:
        """One repetition of (c) on a fresh database, with fakegw on the gateway's CPUs and
        the daemon and PostgreSQL on the consumer's when `split` is given: the rate, and the
        CPU each process spent per receipt."""
        count = self.sizes.e2e_receipts
        url = self.fresh_database(self.preloaded_messages(count))
        self.preload(count)
        with (
            placement.gateway_apart(split, self.meter.fakegw_pid, self.meter.postmaster_pid)
            if split
            else contextlib.nullcontext()
        ):
            e2e = bench_e2e.end_to_end(
                self.target,
                url,
                count,
                configuration.mode,
                configuration.processes,
                configuration.streams,
                self.meter,
                cpus=split.consumer if split else None,
            )
        self.drop_database(url)
        return float(e2e["per_s"]), e2e["cpu_us_per_receipt"]

    def naive(self) -> float:
        """One repetition of (d)."""
        count = self.sizes.naive_receipts
        self.preload(count)
        url = self.fresh_database()
        result = self.runner.run(naive_consumer.consume(self.target, LOGIN, PASSWORD, url, count))
        self.drop_database(url)
        return float(result["receipts_per_second"])

    def store_reference(self) -> dict[str, Any]:
        """bench_store's own figures (1 connection, sent messages recorded) for reference."""
        url = self.fresh_database()
        figures = self.runner.run(
            measure_store(
                url,
                receipts=self.sizes.store_reference_receipts,
                naive_receipts=max(200, self.sizes.naive_receipts // 2),
            )
        )
        self.drop_database(url)
        return figures

    def write_floor(self) -> dict[str, Any]:
        """(g): Store.ingest and the write floor alternately, on this run's PostgreSQL."""
        return self.runner.run(
            write_floor.measure(
                self.cluster,
                "bench_template",
                receipts=self.sizes.write_floor_receipts,
                repetitions=self.sizes.write_floor_repetitions,
            )
        )

    def backlog_rss(self, backlog: int) -> dict[str, Any]:
        """(e): peak RSS of `dlrfeed run` (auto, defaults) draining a preloaded backlog.

        The daemon drains it fully or stops at the time limit; what it leaves is part of the
        next (larger) backlog, so the backlog reported is the gateway's queue at the start.
        """
        inject_rate = self.preload(backlog)
        waiting = int(_stats(self.target)["queued"])
        url = self.fresh_database()
        base = _acked(self.target)
        with daemon_process.daemon(self.target, url, "auto") as process:
            started = time.perf_counter()
            drained = False
            while time.perf_counter() - started < self.sizes.backlog_time_limit_s:
                if process.poll() is not None:
                    raise RuntimeError(f"dlrfeed run exited with {process.returncode}")
                if _acked(self.target) - base >= waiting:
                    drained = True
                    break
                time.sleep(0.5)
            elapsed = time.perf_counter() - started
            acked = _acked(self.target) - base
            peak = daemon_process.vm_kb(process.pid, "VmHWM") / 1024
        self.drop_database(url)
        return {
            "backlog": waiting,
            "inject_per_s": round(inject_rate),
            "acked": acked,
            "drained": drained,
            "seconds": round(elapsed, 1),
            "peak_rss_mb": round(peak, 1),
        }

    def latency(self, rate: float, mode: str = "auto", extra: Sequence[str] = ()) -> dict[str, Any]:
        """(f): a paced injector at `rate`/s while `dlrfeed run --mode mode` keeps up."""
        self._latency_runs += 1
        prefix = f"{LATENCY_PREFIX}{self._latency_runs}-"
        paced = math.ceil(rate * self.sizes.latency_seconds) + 1
        url = self.fresh_database(latency_id(prefix, n) for n in range(paced))
        # Port 0 and the bound port read back from the log (info: `metrics_listening`).
        metrics = ["--metrics", "127.0.0.1:0", "--log-level", "info", *extra]
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as logs:
            log = Path(logs) / "dlrfeed.log"
            with daemon_process.daemon(self.target, url, mode, metrics, log) as process:
                address = daemon_process.metrics_address(log, process)
                time.sleep(2.0)  # imports, connections, streams open: not part of the figure
                cpu_before, wall_before = bench_e2e.cpu_seconds(process.pid), time.perf_counter()
                injected = self.runner.run(
                    paced_inject(self.target, rate, self.sizes.latency_seconds, prefix)
                )
                cpu_share = (bench_e2e.cpu_seconds(process.pid) - cpu_before) / (
                    time.perf_counter() - wall_before
                )
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and _waiting(self.target):
                    time.sleep(0.2)
                unacked = _waiting(self.target)
                time.sleep(0.3)  # the last Ack's latency observation
                metrics_text = daemon_process.http_text(f"http://{address}/metrics")
        self.drop_database(url)
        latencies, start_epoch = self.runner.run(ledger_latencies(self.target, prefix))
        warm = [
            ack_at - enqueued_at
            for enqueued_at, ack_at in latencies
            if enqueued_at >= start_epoch + self.sizes.latency_warmup_seconds
        ]
        warm.sort()
        buckets = daemon_process.histogram_buckets(metrics_text, "dlrfeed_receive_to_ack_seconds")
        commits = daemon_process.histogram_buckets(metrics_text, "dlrfeed_batch_commit_seconds")
        return {
            "rate": round(rate),
            "injected": injected,
            "measured": len(warm),
            # The gateway's own count: the ledger keeps only its newest records, so receipts
            # whose enqueue record was trimmed are simply not in `measured`.
            "unacked": unacked,
            "ledger_p50_ms": 1000 * quantile(warm, 0.50) if warm else None,
            "ledger_p99_ms": 1000 * quantile(warm, 0.99) if warm else None,
            "ledger_max_ms": 1000 * warm[-1] if warm else None,
            "histogram_p50_ms": daemon_process.ms_quantile(0.50, buckets),
            "histogram_p99_ms": daemon_process.ms_quantile(0.99, buckets),
            "histogram_bounds": [b for b, _ in buckets[:-1]],
            "modes": received_by_mode(metrics_text),
            "daemon_cpu_percent": round(100 * cpu_share),
            "commit_p50_ms": daemon_process.ms_quantile(0.50, commits),
            "commit_p99_ms": daemon_process.ms_quantile(0.99, commits),
        }

    def profile(self, mode: str) -> dict[str, Any]:
        """py-spy of `dlrfeed run --mode mode` draining a backlog; summary of its samples."""
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(py_spy).exists():
            return {"mode": mode, "error": "py-spy not installed (pip install py-spy)"}
        url = self.fresh_database(self.preloaded_messages(self.sizes.profile_receipts))
        self.preload(self.sizes.profile_receipts)
        base = _acked(self.target)
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as root:
            raw = Path(root) / "profile.txt"
            with daemon_process.daemon(self.target, url, mode) as process:
                _wait_first_ack(self.target, base, process)
                completed = subprocess.run(
                    [
                        py_spy, "record", "--pid", str(process.pid), "--duration",
                        str(int(self.sizes.profile_seconds)), "--rate", "100", "--format", "raw",
                        "--nolineno", "--nonblocking", "--output", str(raw),
                    ],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                self._drain_rest(process)
            text = raw.read_text() if raw.exists() else ""
        self.drop_database(url)
        if not text:
            return {"mode": mode, "error": completed.stderr.strip()[-300:]}
        return {"mode": mode, **summarise_profile(text)}

    def _drain_rest(self, process: subprocess.Popen[bytes]) -> None:
        while int(_stats(self.target)["queued"]) + int(_stats(self.target)["in_flight"]):
            if process.poll() is not None:
                raise RuntimeError(f"dlrfeed run exited with {process.returncode}")
            time.sleep(0.5)


async def _execute(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _stats(target: str) -> dict[str, Any]:
    with SyncAdminClient(target, LOGIN, PASSWORD) as admin:
        return dict(admin.stats())


def run(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    """Everything of the module docstring in one go; returns the JSON-ready results."""
    wall_started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "sizes": asdict(sizes)}
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    with contextlib.suppress(ImportError):  # uvloop, like the daemon
        import uvloop

        loop_factory = uvloop.new_event_loop
    with tempfile.TemporaryDirectory(prefix="dlrfeed-bench-") as root:
        cluster = PgCluster(Path(root) / "pg", free_port(), fsync=True)
        cluster.init()
        cluster.start()
        try:
            with (
                asyncio.Runner(loop_factory=loop_factory) as runner,
                _fakegw(ledger_records=max(150_000, int(sizes.latency_seconds * 12_000))) as target,
            ):
                runner.run(_create_template(cluster))
                results["postgres_settings"] = runner.run(_settings(cluster.dsn))
                meter = bench_e2e.CpuMeter(
                    fakegw_pid=bench_e2e.child_with(os.getpid(), "fakegw"),
                    postmaster_pid=bench_e2e.postmaster_pid(cluster),
                )
                bench = Bench(target, cluster, runner, sizes, meter)
                per_configuration: dict[str, dict[str, list[float]]] = {
                    c.name: {"feed": [], "store": [], "e2e": []} for c in CONFIGURATIONS
                }
                cpu_runs: dict[str, dict[str, list[dict[str, float]]]] = {
                    c.name: {"feed": [], "store": [], "e2e": []} for c in CONFIGURATIONS
                }
                split = placement.split_cpus()
                apart_rates: dict[str, list[float]] = {c.name: [] for c in GATEWAY_APART}
                apart_cpu: dict[str, list[dict[str, float]]] = {c.name: [] for c in GATEWAY_APART}
                naive: list[float] = []
                for repetition in range(sizes.repetitions):
                    # The order reversed every other repetition (ABBA...): what one
                    # measurement leaves behind does not fall on the same ones every time.
                    backwards = repetition % 2 == 1
                    for configuration in CONFIGURATIONS[:: -1 if backwards else 1]:
                        figures, cpu = bench.ceilings_and_e2e(configuration)
                        log(f"rep {repetition + 1} {configuration.name}: {figures} cpu {cpu}")
                        for key, value in figures.items():
                            per_configuration[configuration.name][key].append(value)
                            cpu_runs[configuration.name][key].append(cpu[key])
                    apart = GATEWAY_APART[:: -1 if backwards else 1] if split else ()
                    for configuration in apart:
                        rate, cpu_used = bench.end_to_end(configuration, split)
                        log(f"rep {repetition + 1} {configuration.name} apart: {rate:.0f}/s")
                        apart_rates[configuration.name].append(rate)
                        apart_cpu[configuration.name].append(cpu_used)
                    naive.append(bench.naive())
                    log(f"rep {repetition + 1} naive: {naive[-1]:.0f}/s")
                results["configurations"] = {
                    name: {key: summary(values) | {"runs": values} for key, values in v.items()}
                    for name, v in per_configuration.items()
                }
                results["cpu_us_per_receipt"] = {
                    name: {phase: _median_per_key(runs) for phase, runs in phases.items()}
                    for name, phases in cpu_runs.items()
                }
                results["naive"] = summary(naive) | {"runs": naive}
                if split is not None:
                    results["gateway_apart"] = {
                        "gateway_cpus": sorted(split.gateway),
                        "consumer_cpus": sorted(split.consumer),
                        "configurations": {
                            name: {
                                "e2e": summary(rates) | {"runs": rates},
                                "cpu": _median_per_key(apart_cpu[name]),
                            }
                            for name, rates in apart_rates.items()
                        },
                    }
                results["store_reference"] = bench.store_reference()
                log(f"store reference: {results['store_reference']['store_receipts_per_s']}/s")
                results["write_floor"] = bench.write_floor()
                log(f"write floor: Store.ingest / floor {results['write_floor']['rate_ratio']}")
                subscribe = results["configurations"][CONFIGURATIONS[0].name]["e2e"]["median"]
                results["latency"] = bench.latency(subscribe / 2)
                log(f"latency: {results['latency']}")
                results["profiles"] = [bench.profile("subscribe"), bench.profile("pull")]
                log("profiles done")
                results["backlogs"] = []
                for backlog in sizes.backlogs:
                    results["backlogs"].append(bench.backlog_rss(backlog))
                    log(f"backlog: {results['backlogs'][-1]}")
        finally:
            cluster.destroy()
    results["machine"]["load_at_end"] = os.getloadavg()
    results["wall_seconds"] = round(time.perf_counter() - wall_started)
    return results


def _waiting(target: str) -> int:
    """Receipts the gateway still holds for the login: queued plus leased."""
    stats = _stats(target)
    return int(stats["queued"]) + int(stats["in_flight"])


@contextlib.contextmanager
def _fakegw(ledger_records: int) -> Iterator[str]:
    with serving(
        "--login", f"{LOGIN}:{PASSWORD}", "--store", ":memory:", "--cap", "100000000",
        "--ledger-max-records", str(ledger_records),
    ) as target:  # fmt: skip
        yield target


async def _create_template(cluster: PgCluster) -> None:
    await _execute(cluster.dsn, "CREATE DATABASE bench_template")
    from dlrfeed.store.migrate import migrate

    await migrate(cluster.dsn_for("bench_template"))


async def _settings(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        names = ("server_version", "fsync", "synchronous_commit", "full_page_writes")
        return {name: str(await conn.fetchval(f"SHOW {name}")) for name in names}
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    """Run everything, write the Markdown report (and the chart and raw JSON beside it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to try the script")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else Sizes()
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    results = run(sizes, log)
    chart = args.out.with_suffix(".png")
    results["chart"] = chart.name if draw_chart(results, chart) else None
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    previous = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(render_report(results, hand_written_section(previous)))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
