"""`dlrfeed run` as real processes: signals, crashes between receive/commit/ack, the supervisor,
and the full system check against fakegw's ledger (F7, F12, C7)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlrfeed.store.store import Store
from dlrfeed.store.submission import Submission
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    acked_tokens,
    assert_ledger_matches_store,
    drained,
    receipt_bodies,
    run_args,
    running_gateway,
    stored_tokens,
    wait_until,
)
from dlrfeed_tools.oracle import Sent, expect
from fakegw.server import FakeGateway

REPO = Path(__file__).resolve().parents[2]


async def start_daemon(
    gateway: str, database_url: str, log_path: Path, *extra: str, code: str | None = None
) -> asyncio.subprocess.Process:
    """`python -m dlrfeed.cli run ...` (or `python -c code ...`) with the password in env."""
    env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD}
    env.pop("NOTIFY_SOCKET", None)
    head = ["-c", code] if code else ["-m", "dlrfeed.cli"]
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, *head, *run_args(gateway, database_url, *extra),
            env=env, stdout=log, stderr=log, cwd=REPO,
        )  # fmt: skip


async def receptions(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
    finally:
        await conn.close()


async def outcome_counts(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT outcome, count(*) AS n FROM dlr.receptions GROUP BY 1")
    finally:
        await conn.close()
    return {row["outcome"]: int(row["n"]) for row in rows}


def log_events(log_path: Path) -> list[dict[str, Any]]:
    lines = log_path.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


async def finish(process: asyncio.subprocess.Process, within_s: float) -> int:
    return await asyncio.wait_for(process.wait(), within_s)


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with running_gateway() as running:
        yield running


async def test_sigterm_under_load_stops_cleanly_and_loses_nothing(
    gateway: FakeGateway, database_url: str, tmp_path: Path
) -> None:
    """F7: SIGTERM mid-drain → exit 0 within --shutdown-timeout; every stored receipt
    was acked before the streams closed, nothing is left leased, nothing applied twice."""
    await gateway.inject(LOGIN, receipt_bodies(20_000))
    log = tmp_path / "daemon.log"
    process = await start_daemon(gateway.target, database_url, log, "--mode", "subscribe")

    async def some_stored() -> bool:
        return await receptions(database_url) >= 3000

    await wait_until(some_stored, 60, "the daemon to store 3000 receipts")
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert await finish(process, 35) == 0, log.read_text()[-3000:]
    assert time.monotonic() - signalled < 30
    stats = gateway.stats(LOGIN)
    assert stats["in_flight"] == 0, "receipts left leased after a clean stop"
    ledger = gateway.ledger(LOGIN, limit=10_000_000)["records"]
    assert await stored_tokens(database_url) == acked_tokens(ledger), "stored but not acked"
    assert stats["queued"] > 0, "the stop came too late to test anything"
    assert "shutdown_clean" in [e["event"] for e in log_events(log)]
    # A second run finishes the job: the ledger and the store agree.
    process = await start_daemon(gateway.target, database_url, log, "--mode", "subscribe")
    try:
        await wait_until(lambda: drained(gateway), 60, "the rest to drain")
    finally:
        process.send_signal(signal.SIGTERM)
        assert await finish(process, 35) == 0
    await assert_ledger_matches_store(gateway, database_url)


# Runs the real daemon, but its store kills the process (os._exit, no cleanup, like kill -9)
# at the first batch: before the commit, or after the commit and before the ack.
CRASHING_DAEMON = """
import asyncio, os, sys
from dlrfeed.cli import build_parser
from dlrfeed.config import LayeredDefaults
from dlrfeed.daemon.app import Daemon
from dlrfeed.daemon.lifecycle import open_store
from dlrfeed.daemon.settings import DaemonSettings

WHERE = os.environ["CRASH_AT"]

class CrashingStore:
    def __init__(self, inner):
        self.inner = inner
    async def ingest(self, login, receipts):
        if WHERE == "before_commit":
            os._exit(9)
        result = await self.inner.ingest(login, receipts)
        os._exit(9)
    def __getattr__(self, name):
        return getattr(self.inner, name)

async def opener(settings):
    return CrashingStore(await open_store(settings))

parser, subs = build_parser()
args = LayeredDefaults(parser, subs).parse(sys.argv[1:])
asyncio.run(Daemon(DaemonSettings.from_args(args), store_opener=opener).run())
"""


@pytest.mark.parametrize("crash_at", ["before_commit", "after_commit"])
async def test_crash_between_receive_commit_and_ack(
    database_url: str, tmp_path: Path, crash_at: str
) -> None:
    """C7: killed after receive and before commit → the redelivery is stored once; killed after
    commit and before ack → the redelivery is recognised as a repeat (C1); nothing acked is
    missing from the store."""
    async with running_gateway(lease_seconds=2.0) as gateway:
        await _crash_then_recover(gateway, database_url, tmp_path, crash_at)


async def _crash_then_recover(
    gateway: FakeGateway, database_url: str, tmp_path: Path, crash_at: str
) -> None:
    await gateway.inject(LOGIN, receipt_bodies(300))
    log = tmp_path / "daemon.log"
    small = ("--mode", "pull", "--streams", "1", "--batch-size", "100", "--lease-seconds", "2",
             "--release-after", "1")  # fmt: skip
    os.environ["CRASH_AT"] = crash_at
    try:
        crashing = await start_daemon(
            gateway.target, database_url, log, *small, code=CRASHING_DAEMON
        )
        assert await finish(crashing, 30) == 9
    finally:
        del os.environ["CRASH_AT"]
    first_batch = 100 if crash_at == "after_commit" else 0
    assert await receptions(database_url) == first_batch
    assert gateway.stats(LOGIN)["acked"] == 0
    # Pulled receipts stay leased after a crash until the (2 s) lease runs out, then are
    # redelivered with delivery_count 2 (F6).
    process = await start_daemon(gateway.target, database_url, log, *small)
    try:
        await wait_until(lambda: drained(gateway), 60, "the redelivery to drain")
    finally:
        process.send_signal(signal.SIGTERM)
        assert await finish(process, 35) == 0
    await assert_ledger_matches_store(gateway, database_url)
    outcomes = await outcome_counts(database_url)
    assert await receptions(database_url) == 300 + first_batch
    assert outcomes.get("repeat", 0) == first_batch


def _status_rows_expected(receptions: list[asyncpg.Record]) -> dict[str, tuple[str, bool]]:
    """What the reference (dlrfeed_tools.oracle) gives for each message's stored deliveries,
    in the arrival order the store recorded (P16-P19)."""
    by_message: dict[str, list[Sent]] = {}
    for row in receptions:
        by_message.setdefault(row["message_id"], []).append(
            Sent(
                row["message_id"],
                int(row["level"]),
                row["stat"],
                row["err"],
                row["done_at"],
                row["done_date_raw"],
                row["received_at"].timestamp(),
            )
        )
    expected: dict[str, tuple[str, bool]] = {}
    for message_id, deliveries in by_message.items():
        result = expect(deliveries)
        if result.status is not None:
            expected[message_id] = (result.status, result.is_final)
    return expected


async def _system_run(gateway: FakeGateway, database_url: str, tmp_path: Path, total: int) -> None:
    bodies = receipt_bodies(total, prefix="s", conflicting=total // 200)
    unknown = {b["id"] for b in bodies if int(b["id"][1:]) % 50 == 49}  # 2 %: never recorded
    store = await Store.open(database_url)
    try:
        await store.record_submissions(
            [
                Submission(login=LOGIN, message_id=mid, destination="+34600000000")
                for mid in sorted({b["id"] for b in bodies} - unknown)
            ]
        )
    finally:
        await store.close()
    gateway.faults.update({"seed": 11, "duplicate_rate": 0.1, "cut_stream_every": 5000})
    for start in range(0, len(bodies), 10_000):
        await gateway.inject(LOGIN, bodies[start : start + 10_000])
    log = tmp_path / "supervisor.log"
    started = time.monotonic()
    # The killed worker's Pulled receipts come back only when their lease ends (F6): a short
    # lease keeps the test short; the daemon is told, so its ack retries respect it.
    process = await start_daemon(
        gateway.target, database_url, log, "--processes", "2", "--streams", "2",
        "--lease-seconds", "5", "--release-after", "2",
    )  # fmt: skip
    try:
        # Kill one worker mid-run: the supervisor restarts it and nothing is lost (C7).
        async def half_stored() -> bool:
            return await receptions(database_url) >= len(bodies) // 3

        await wait_until(half_stored, 90, "a third of the receipts to be stored")
        workers = [e["pid"] for e in log_events(log) if e["event"] == "worker_started"]
        os.kill(workers[0], signal.SIGKILL)
        await wait_until(lambda: drained(gateway), 120, "the system run to drain")
    finally:
        process.send_signal(signal.SIGTERM)
        assert await finish(process, 40) == 0, log.read_text()[-3000:]
    elapsed = time.monotonic() - started
    events = [e["event"] for e in log_events(log)]
    assert events.count("worker_started") >= 3, "the killed worker was not restarted"
    await assert_ledger_matches_store(gateway, database_url)
    stats = gateway.stats(LOGIN)
    assert stats["queued"] == 0
    assert stats["in_flight"] == 0
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetch(
            "SELECT message_id, level, stat, err, done_date_raw, done_at, received_at"
            " FROM dlr.receptions_readable ORDER BY id"
        )
        statuses = await conn.fetch("SELECT message_id, status, is_final FROM dlr.message_status")
        uncorrelated = await conn.fetchval(
            "SELECT count(DISTINCT message_id) FROM dlr.exceptions WHERE kind = 'uncorrelated'"
        )
    finally:
        await conn.close()
    known = [row for row in stored if row["message_id"] not in unknown]
    expected = _status_rows_expected(known)
    actual = {row["message_id"]: (row["status"], row["is_final"]) for row in statuses}
    assert actual == expected
    assert uncorrelated == len(unknown)
    print(f"system run: {total} receipts (+dups) in {elapsed:.1f}s")


async def test_system_two_processes_two_streams(database_url: str, tmp_path: Path) -> None:
    """The system check (20,000 receipts; the 100,000 version is marked slow): 2 processes x 2
    streams, 10 % repeats, 5 % result-before-progress, conflicting finals, unknown ids, a
    stream cut every 5,000 and a worker killed mid-run: the ledger and the store agree."""
    async with running_gateway(lease_seconds=5.0) as gateway:
        await _system_run(gateway, database_url, tmp_path, 20_000)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_system_two_processes_two_streams_100k(database_url: str, tmp_path: Path) -> None:
    """The system check at full size: 100,000 receipts."""
    async with running_gateway(lease_seconds=5.0) as gateway:
        await _system_run(gateway, database_url, tmp_path, 100_000)


async def _metrics_text(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, body = response.split("\r\n\r\n", 1)
    assert head.split()[1] == "200", head
    return body


def _sample(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def test_each_worker_serves_its_own_promtool_clean_metrics(
    gateway: FakeGateway, database_url: str, tmp_path: Path
) -> None:
    """`--processes 2 --metrics HOST:0`: one scrape per process (docs/daemon.md, "Several
    processes"). Each worker binds a port of its own and logs it, each scrape passes `promtool
    check metrics`, and the workers' counters add up to the whole drain."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make install` (scripts/ensure-system-packages.sh)"
    await gateway.inject(LOGIN, receipt_bodies(2_000))
    log = tmp_path / "supervisor.log"
    process = await start_daemon(
        gateway.target, database_url, log, "--processes", "2", "--streams", "1",
        "--mode", "subscribe", "--metrics", "127.0.0.1:0",
    )  # fmt: skip

    def ports() -> list[int]:
        return sorted({e["port"] for e in log_events(log) if e["event"] == "metrics_listening"})

    async def both_listening() -> bool:
        return len(ports()) == 2

    try:
        await wait_until(both_listening, 60, "both workers' metrics ports")
        await wait_until(lambda: drained(gateway), 60, "the drain")

        async def all_counted() -> bool:
            texts = [await _metrics_text(port) for port in ports()]
            return sum(_sample(t, "dlrfeed_receipts_stored_total") for t in texts) == 2_000

        await wait_until(all_counted, 30, "the workers' counters to add up")
        scrapes = [await _metrics_text(port) for port in ports()]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await finish(process, 40) == 0, log.read_text()[-3000:]
    for text in scrapes:
        linter = await asyncio.create_subprocess_exec(
            promtool, "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
        )
        output, _ = await linter.communicate(text.encode())
        assert (linter.returncode, output.decode()) == (0, "")
        assert _sample(text, "dlrfeed_readers_configured") == 1
    received = [_sample(t, "dlrfeed_receipts_received_total") for t in scrapes]
    assert sum(received) == 2_000
