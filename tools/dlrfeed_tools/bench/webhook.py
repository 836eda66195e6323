"""Benchmark of the callback path: `dlrfeed webhook` taking concurrent callbacks, group commit
against one commit per callback, on a durable PostgreSQL.

Starts its own throwaway cluster (fsync, synchronous_commit and full_page_writes on), records the
sent messages (random UUID-like ids, as gateways issue them), then, interleaved over
repetitions and each on a fresh database, POSTs the same callbacks (a progress and a result per
message, the result in a later burst than its progress) over `--senders` keep-alive
connections to a real `dlrfeed webhook` process. The poster is wrk (`webhook_post.lua`), a C
load generator: a gateway posts from hosts of its own, so the poster should take as little
as it can of the two CPUs the receiver and PostgreSQL share here (its CPU is reported too).
- **group commit**: the receiver's defaults (`--batch-size 500 --commits 2`);
- **one commit per callback**: `--batch-size 1`, the same code committing each request alone,
  which is what a receiver without group commit does.
It reports callbacks/s, the answer latency percentiles the poster saw, the callbacks per
commit and the receiver's and the poster's CPU per callback, medians over repetitions with
min-max beside them;
the ratio is taken within each repetition. Measures only; never asserts a time.

    python scripts/bench_webhook.py [--callbacks 20000] [--senders 64] [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.bench.e2e import cpu_seconds
from dlrfeed_tools.daemon_harness import wait_until
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.paths import REPO
from dlrfeed_tools.pgcluster import free_port, throwaway_cluster

_WRK_SCRIPT = Path(__file__).with_name("webhook_post.lua")
CONFIGURATIONS = {
    "group commit": (),
    "one commit per callback": ("--batch-size", "1", "--commits", "1"),
}


def callback_bodies(count: int, seed: int = 1) -> tuple[list[str], list[bytes]]:
    """About `count` gateway webhook bodies: every message's progress, then every result."""
    rng = random.Random(seed)
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(count // 2)]
    bodies = [
        json.dumps(
            {
                "id": message_id,
                "level": level,
                "stat": stat,
                "err": "000",
                "submit_date": "2612031012",
                "done_date": "2612031013",
                "text": "Your code is 123456",
                "destination_addr": "+34600123456",
            }
        ).encode()
        for level, stat in ((1, "ENROUTE"), (2, "DELIVRD"))
        for message_id in ids
    ]
    return ids, bodies


async def _scrape(port: int) -> dict[str, float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def measure(
    dsn: str, bodies_file: Path, callbacks: int, senders: int, flags: tuple[str, ...]
) -> dict[str, Any]:
    """POST the lines of `bodies_file` over `senders` connections to a fresh receiver on `dsn`."""
    port, metrics_port = free_port(), free_port()
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dlrfeed.cli", "webhook",
        "--listen", f"127.0.0.1:{port}", "--login", LOGIN, "--database-url", dsn,
        "--metrics", f"127.0.0.1:{metrics_port}", "--log-level", "warning", *flags,
        stdout=asyncio.subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    try:
        await wait_until(lambda: _listening(port), 15, f"the receiver to listen on port {port}")
        cpu_before = cpu_seconds(receiver.pid)
        posted, sender_cpu = await asyncio.to_thread(_post_all, port, bodies_file, senders)
        cpu = cpu_seconds(receiver.pid) - cpu_before
        metrics = await _scrape(metrics_port)
    finally:
        receiver.terminate()
        await receiver.wait()
    if posted["answered"] != callbacks or posted["failed"]:
        raise RuntimeError(f"not every callback was answered 200: {posted}")
    commits = metrics.get("dlrfeed_webhook_commits_total", 0.0)
    return {
        "callbacks": callbacks,
        "callbacks_per_s": round(callbacks / posted["seconds"]),
        "answer_ms_p50": posted["p50_ms"],
        "answer_ms_p99": posted["p99_ms"],
        "callbacks_per_commit": round(callbacks / commits, 1) if commits else None,
        "receiver_cpu_us_per_callback": round(1e6 * cpu / callbacks, 1),
        "sender_cpu_us_per_callback": round(1e6 * sender_cpu / callbacks, 1),
    }


def _post_all(port: int, bodies_file: Path, senders: int) -> tuple[dict[str, Any], float]:
    """wrk posting every body once (webhook_post.lua): its report, and the CPU it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    finished = subprocess.run(
        ["wrk", "-t1", f"-c{senders}", "-d600s", "--timeout", "60s", "-s", str(_WRK_SCRIPT),
         f"http://127.0.0.1:{port}/dlr", "--", str(bodies_file)],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = next(line for line in finished.stdout.splitlines() if line.startswith("{"))
    return json.loads(report), cpu


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    ids, bodies = callback_bodies(args.callbacks)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGURATIONS}
    with (
        throwaway_cluster("bench-webhook-") as cluster,
        tempfile.TemporaryDirectory(prefix="bench-webhook-bodies-") as scratch,
    ):
        bodies_file = Path(scratch) / "bodies"
        bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
        for repetition in range(args.repeat):
            # Interleaved, so the machine's drift falls on both configurations alike.
            for number, (name, flags) in enumerate(CONFIGURATIONS.items()):
                database = f"bench_{repetition}_{number}"
                dsn = await cluster.create_database(database)
                await migrate(dsn)
                store = await Store.open(dsn, pool_size=1)
                try:
                    for start in range(0, len(ids), 5_000):
                        chunk = ids[start : start + 5_000]
                        await store.record_submissions(
                            [Submission(LOGIN, m, "+34600123456") for m in chunk]
                        )
                finally:
                    await store.close()
                run = await measure(dsn, bodies_file, len(bodies), args.senders, flags)
                run["load_average_1m"] = round(os.getloadavg()[0], 2)
                runs[name].append(run)
    group, single = runs["group commit"], runs["one commit per callback"]
    ratios = [
        g["callbacks_per_s"] / s["callbacks_per_s"] for g, s in zip(group, single, strict=True)
    ]
    return {
        "callbacks": len(bodies),
        "senders": args.senders,
        "repetitions": args.repeat,
        "fsync": True,
        "configurations": {name: _summary(each) for name, each in runs.items()},
        "group_over_single": round(statistics.median(ratios), 2),
        "runs": runs,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in runs[0] if k not in ("callbacks", "load_average_1m")]
    return {
        key: {
            "median": statistics.median(r[key] for r in runs),
            "min": min(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in keys
        if all(r[key] is not None for r in runs)
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as the page docs/benchmarks-webhook.md."""
    rows = []
    for name, figures in report["configurations"].items():

        def cell(key: str, figures: dict[str, Any] = figures) -> str:
            f = figures[key]
            return f"{f['median']:,} ({f['min']:,}-{f['max']:,})"

        rows.append(
            f"| {name} | {cell('callbacks_per_s')} | {cell('answer_ms_p50')} | "
            f"{cell('answer_ms_p99')} | {cell('callbacks_per_commit')} | "
            f"{cell('receiver_cpu_us_per_callback')} | {cell('sender_cpu_us_per_callback')} |"
        )
    return "\n".join(
        [
            "# Benchmark of the callback path (`dlrfeed webhook`)",
            "",
            "Generated by `make bench` (`scripts/bench_webhook.py`); do not edit by hand. One",
            "run on this machine against a real `dlrfeed webhook` process and a durable",
            "PostgreSQL (fsync, synchronous_commit and full_page_writes on); the machine is",
            "shared, so compare the ratio, and read min-max as the noise.",
            "",
            f"- {report['callbacks']:,} callbacks per measurement (random UUID ids; every "
            f"progress, then every result), posted over {report['senders']} keep-alive "
            "connections by wrk, a C load generator (a gateway posts from hosts of its own; "
            "here the poster shares the two CPUs, so it should take little of them); "
            f"{report['repetitions']} repetitions, interleaved, each on a fresh database.",
            "- *group commit*: the receiver's defaults (`--batch-size 500 --commits 2`); *one "
            "commit per callback*: `--batch-size 1 --commits 1`, the same code committing each "
            "callback alone before answering it.",
            "",
            "| configuration | callbacks/s | answer p50 ms | answer p99 ms | callbacks per "
            "commit | receiver CPU µs per callback | poster CPU µs per callback |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Group commit over one commit per callback: **{report['group_over_single']} x** "
            "the callbacks/s (median of the per-repetition ratios). Every answer is a 200 sent "
            "after the commit that stored its reception, in both configurations.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the report as JSON, and write it as Markdown with --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--callbacks", type=int, default=20_000)
    parser.add_argument("--senders", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    args = parser.parse_args(argv)
    report = asyncio.run(_run(args))
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
