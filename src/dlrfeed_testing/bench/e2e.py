"""End-to-end throughput of `dlrfeed run`: fakegw → dlrfeed → PostgreSQL → Ack.

Everything runs as separate processes on this machine: fakegw (in-memory queue), PostgreSQL
(a throwaway cluster, fsync on by default), and the daemon under test. For each mode the
backlog is preloaded through fakegw's admin API, then the daemon is started and timed until the
gateway counts every receipt acked. In the same run two ceilings are measured:

- feed-only: dlrfeed's own FeedClient draining the same backlog and acking, storing nothing
  (Subscribe with N streams, or Pull), in one process on uvloop like the daemon;
- store-only: `Store.ingest` of the same receipts in batches, as many concurrent batches as
  the daemon has readers, on a fresh database.

The ratio end-to-end / min(feed-only, store-only) says what the pipeline costs (target ≥ 0.7).
Peak RSS is VmHWM of every daemon worker process, read just before it is stopped.

    python scripts/bench_e2e.py [--receipts 50000] [--no-fsync]   # prints one JSON object

`measure_e2e()` returns the same dictionary for `make bench`. It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient, PullCall, SubscribeStream, is_own_cancellation
from dlrfeed.store.migrate import migrate
from dlrfeed.store.store import Store
from dlrfeed.store.submission import Submission
from dlrfeed_testing.bench.placement import children, thread_affinity
from dlrfeed_testing.local_login import LOGIN, PASSWORD
from dlrfeed_testing.pgcluster import PgCluster, free_port
from fakegw.admin_client import SyncAdminClient
from fakegw.spawn import serving

CHUNK = 5000


def message_id(number: int) -> str:
    """The gateway's id of the message receipt `number` reports on (two receipts a message)."""
    return f"{number // 2:032x}"


def sample_receipt(number: int) -> dict[str, Any]:
    """A realistic ~300-byte receipt body; half progress, half results of distinct messages."""
    return {
        "id": message_id(number),
        "level": 1 + number % 2,
        "stat": "DELIVRD" if number % 2 else "ENROUTE",
        "err": "000",
        "sub": "001",
        "dlvrd": "001",
        "submit_date": "2611291200",
        "done_date": "2611291201" if number % 2 else "2611291200",
        "text": "Your verification code is 123456. Do not share it with anyone. Thanks",
        "source_addr": "ACMEBANK",
        "destination_addr": "34600123456",
        "smsc_message_id": f"{number:020d}",
        "connector": "smsc-eu-west-1",
    }


@contextmanager
def fakegw_process() -> Iterator[str]:
    """fakegw in its own process; yields its target."""
    with serving(
        "--login", f"{LOGIN}:{PASSWORD}", "--store", ":memory:", "--cap", "100000000",
        "--ledger-max-records", "1000",
    ) as target:  # fmt: skip
        yield target


def preload(target: str, count: int, offset: int) -> None:
    with SyncAdminClient(target, LOGIN, PASSWORD) as admin:
        for start in range(offset, offset + count, CHUNK):
            end = min(start + CHUNK, offset + count)
            admin.inject([sample_receipt(n) for n in range(start, end)])


def acked(target: str) -> int:
    with SyncAdminClient(target, LOGIN, PASSWORD) as admin:
        return int(admin.stats()["acked"])


async def fresh_database(cluster: PgCluster, template: str, number: int) -> str:
    name = f"bench_{number}"
    await cluster.drop_database(name)
    return await cluster.create_database(name, template=template)


async def record_messages(database_url: str, message_ids: Iterable[str]) -> None:
    """Record the sent messages (P5), as the sending application does before their receipts
    arrive: receipts then correlate, the normal path, rather than all opening `uncorrelated`
    exceptions."""
    ids = sorted(set(message_ids))
    store = await Store.open(database_url, pool_size=1)
    try:
        for start in range(0, len(ids), 5_000):
            chunk = ids[start : start + 5_000]
            await store.record_submissions([Submission(LOGIN, m, "+34600123456") for m in chunk])
    finally:
        await store.close()


async def feed_only(target: str, count: int, mode: str, streams: int) -> float:
    """Receipts/s of our FeedClient draining `count` and acking in 500s, storing nothing."""
    channel = open_channel(target, None)
    stream_channel = open_stream_channel(target, None)
    client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
    done = 0
    started = time.perf_counter()

    async def ack_all(tokens: list[str]) -> None:
        for start in range(0, len(tokens), 500):
            await client.ack(tokens[start : start + 500])

    streams_open: list[SubscribeStream] = []

    async def subscriber() -> None:
        nonlocal done
        stream = client.subscribe(1000)
        streams_open.append(stream)
        tokens: list[str] = []
        try:
            while done < count:
                receipts = await stream.read()
                if receipts is None:
                    return
                tokens.extend(receipt.ack_token for receipt in receipts)
                done += len(receipts)
                if len(tokens) >= 250:
                    await ack_all(tokens)
                    tokens = []
        except asyncio.CancelledError:
            if not is_own_cancellation(stream.cancelled_by_us):
                raise
        finally:
            if tokens:
                await ack_all(tokens)
            # The quota is reached: end the other streams too (their reads would wait).
            for other in streams_open:
                other.cancel()

    pulls_open: set[PullCall] = set()

    async def puller() -> None:
        nonlocal done
        while done < count:
            call = client.pull(1000, 1)
            pulls_open.add(call)
            try:
                receipts = await call.receipts()
            except asyncio.CancelledError:
                if is_own_cancellation(call.cancelled_by_us):
                    return
                raise
            finally:
                pulls_open.discard(call)
            done += len(receipts)
            if receipts:
                await ack_all([r.ack_token for r in receipts])
        # The quota is reached: the other readers' long polls would wait out their second on
        # an empty queue and count it; end them (they hold nothing, everything was pulled).
        for other in list(pulls_open):
            other.cancel()

    worker = subscriber if mode == "subscribe" else puller
    await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed = time.perf_counter() - started
    stream_channel.close()
    await channel.close(grace=None)
    return count / elapsed


async def store_only(
    database_url: str, count: int, batch: int, concurrency: int, meter: CpuMeter | None = None
) -> tuple[float, dict[str, float]]:
    """Receipts/s of Store.ingest alone, `concurrency` batches at a time (messages recorded),
    and the CPU per receipt of each process when a meter is given."""
    await record_messages(database_url, (message_id(n) for n in range(count)))
    now = time.time()
    receipts = [
        Receipt(
            message_id=MessageId(body["id"]), level=body["level"], stat=body["stat"],
            err=body["err"], sub=body["sub"], dlvrd=body["dlvrd"],
            submit_date=body["submit_date"], done_date=body["done_date"], text=body["text"],
            source_addr=body["source_addr"], destination_addr=body["destination_addr"],
            smsc_message_id=body["smsc_message_id"], connector=body["connector"],
            delivery_count=1, ack_token=AckToken(f"tok{n}"), raw=b"x" * 300, received_at=now,
        )
        for n, body in enumerate(sample_receipt(n) for n in range(count))
    ]  # fmt: skip
    store = await Store.open(database_url, pool_size=concurrency + 1)
    batches = [receipts[i : i + batch] for i in range(0, count, batch)]
    cpu_before = meter.read() if meter else {}
    started = time.perf_counter()

    async def lane(index: int) -> None:
        for chunk in batches[index::concurrency]:
            await store.ingest(LOGIN, chunk)

    await asyncio.gather(*(lane(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = cpu_per_receipt(cpu_before, meter.read(), count) if meter else {}
    await store.close()
    return count / elapsed, cpu


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (field 3 onwards)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU seconds of a process so far, all threads (stat fields 14-15), plus
    those of its children it has reaped (fields 16-17) when asked; 0 once it has exited."""
    try:
        fields = _stat_fields(pid)
    except OSError:  # gone between listing and reading (a backend closing, a worker exiting)
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postmaster_pid(cluster: PgCluster) -> int:
    """The PostgreSQL server's main process (first line of postmaster.pid)."""
    return int((cluster.datadir / "postmaster.pid").read_text().split()[0])


def child_with(pid: int, word: str) -> int:
    """The child process of `pid` whose command line contains `word`."""
    for child in children(pid):
        if word.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
            return child
    raise LookupError(f"no child of {pid} runs {word}")


@dataclass(frozen=True)
class CpuMeter:
    """Reads the CPU time of every process of a measurement, so that a figure can say where
    each receipt's CPU went: fakegw, PostgreSQL (postmaster and every backend, exited ones
    included), the daemon (with its worker processes) and this benchmark process itself."""

    fakegw_pid: int
    postmaster_pid: int

    def read(self, daemon_pid: int | None = None) -> dict[str, float]:
        reading = {
            "fakegw": cpu_seconds(self.fakegw_pid),
            "postgres": _tree_cpu_seconds(self.postmaster_pid),
            "bench": time.process_time(),
            "wall": time.perf_counter(),
        }
        if daemon_pid is not None:
            reading["daemon"] = _tree_cpu_seconds(daemon_pid)
        return reading


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, of the children it has reaped and of those still running.
    The parent is read first: a child exiting in between is missed, never counted twice."""
    parent = cpu_seconds(pid, reaped_children=True)
    return parent + sum(cpu_seconds(child) for child in children(pid))


def cpu_per_receipt(
    before: dict[str, float], after: dict[str, float], receipts: int
) -> dict[str, float]:
    """µs of CPU per receipt of each process between two readings, and the cores kept busy."""
    used = {k: after[k] - before[k] for k in after if k in before and k != "wall"}
    figures = {k: round(1e6 * v / receipts, 1) for k, v in used.items()}
    figures["cores_busy"] = round(sum(used.values()) / (after["wall"] - before["wall"]), 2)
    return figures


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def end_to_end(
    target: str,
    database_url: str,
    count: int,
    mode: str,
    processes: int,
    streams: int,
    meter: CpuMeter | None = None,
    cpus: Set[int] | None = None,
) -> dict[str, Any]:
    """Start `dlrfeed run` (on `cpus` when given), time it until the gateway has `count` more
    acks, stop it."""
    base = acked(target)
    env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD}
    command = [
        sys.executable, "-m", "dlrfeed.cli", "run", "--gateway", target, "--login", LOGIN,
        "--database-url", database_url, "--mode", mode, "--streams", str(streams),
        "--processes", str(processes), "--log-format", "json", "--log-level", "warning",
        "--summary-interval", "0",
    ]  # fmt: skip
    with thread_affinity(cpus) if cpus else contextlib.nullcontext():
        process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        # The clock starts at the first ack: process start-up (imports, connections) is a
        # one-off cost that says nothing about throughput.
        while (first := acked(target) - base) == 0:
            if process.poll() is not None:
                raise RuntimeError(f"dlrfeed run exited with {process.returncode}")
            time.sleep(0.01)
        started = time.perf_counter()
        cpu_before = meter.read(process.pid) if meter else {}
        while acked(target) - base < count:
            if process.poll() is not None:
                raise RuntimeError(f"dlrfeed run exited with {process.returncode}")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = cpu_per_receipt(cpu_before, meter.read(process.pid), count - first) if meter else {}
        workers = children(process.pid) if processes > 1 else [process.pid]
        rss = [round(_peak_rss_mb(pid), 1) for pid in workers]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return {
        "per_s": round((count - first) / elapsed),
        "seconds": round(elapsed, 2),
        "peak_rss_mb": rss,
        "cpu_us_per_receipt": cpu,
    }


async def _ceilings(
    target: str, database_url: str, count: int, mode: str, streams: int, offset: int
) -> dict[str, float]:
    preload(target, count, offset)
    feed = await feed_only(target, count, "subscribe" if mode == "subscribe" else "pull", streams)
    store, _ = await store_only(database_url, count, 500, streams)
    return {"feed_only_per_s": round(feed), "store_only_per_s": round(store)}


def measure_e2e(receipts: int = 50_000, *, fsync: bool = True) -> dict[str, Any]:
    """Every scenario of the module docstring; returns the JSON-ready results."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    with contextlib.suppress(ImportError):  # uvloop, like the daemon, when installed
        import uvloop

        loop_factory = uvloop.new_event_loop
    scenarios = [
        ("subscribe", 1, 2),
        ("pull", 1, 2),
        ("auto", 1, 2),
        ("pull", 2, 2),
    ]
    results: dict[str, Any] = {"receipts": receipts, "fsync": fsync, "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="dlrfeed-bench-") as root:
        cluster = PgCluster(Path(root) / "pg", free_port(), fsync=fsync)
        cluster.init()
        cluster.start()
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(_create_template(cluster))
                with fakegw_process() as target:
                    offset = 0
                    for number, (mode, processes, streams) in enumerate(scenarios):
                        url = runner.run(fresh_database(cluster, "bench_template", number))
                        ceilings = runner.run(
                            _ceilings(target, url, receipts, mode, streams * processes, offset)
                        )
                        offset += receipts
                        url = runner.run(fresh_database(cluster, "bench_template", number))
                        preload(target, receipts, offset)
                        runner.run(
                            record_messages(url, map(message_id, range(offset, offset + receipts)))
                        )
                        offset += receipts
                        e2e = end_to_end(target, url, receipts, mode, processes, streams)
                        floor = min(ceilings["feed_only_per_s"], ceilings["store_only_per_s"])
                        results["scenarios"][f"{mode}_{processes}x{streams}"] = {
                            **ceilings,
                            "end_to_end_per_s": e2e["per_s"],
                            "ratio_to_slower_ceiling": round(e2e["per_s"] / floor, 2),
                            "seconds": e2e["seconds"],
                            "peak_rss_mb": e2e["peak_rss_mb"],
                        }
        finally:
            cluster.destroy()
    return results


async def _create_template(cluster: PgCluster) -> None:
    await migrate(await cluster.create_database("bench_template"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=50_000)
    parser.add_argument("--no-fsync", action="store_true", help="PostgreSQL without fsync")
    args = parser.parse_args(argv)
    print(json.dumps(measure_e2e(args.receipts, fsync=not args.no_fsync), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
