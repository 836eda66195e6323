"""The change log out of real processes: three racing `dlrfeed run` daemons and a `dlrfeed
changes --follow` started before them; `dlrfeed relay` against a real HTTP endpoint that
answers 503, times out, and is killed -9, as is the relay itself."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dlrfeed.domain.receipt import Receipt
from dlrfeed.store import Store, Submission
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    drained,
    receipt_bodies,
    run_args,
    running_gateway,
)
from dlrfeed_tools.daemon_harness import wait_until as _wait_until
from dlrfeed_tools.ports import logged_metrics_address, logged_receiver_port
from dlrfeed_tools.webhook_receiver import read_log
from gateway.receipts.v1 import feed_pb2
from support.receipt_strategies import receipts_from_payloads

REPO = Path(__file__).resolve().parents[2]
SECRET = b"relay-Secret-0f9e"  # a distinctive value, so the leak check can search for it


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")}
    env.pop("NOTIFY_SOCKET", None)
    return env


async def _spawn(log_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, env=env or _env(), stdout=log, stderr=log, cwd=REPO
        )


async def _finish(process: Any, seconds: float = 30) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    return int(await asyncio.wait_for(process.wait(), seconds))


async def _kill9(process: Any) -> None:
    process.kill()
    await process.wait()


async def _cli_json_lines(database_url: str, *args: str) -> list[dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dlrfeed.cli", "changes", "--database-url", database_url,
        "--json", *args, env=_env(), stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


async def _statuses(database_url: str) -> dict[str, str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT message_id, status FROM dlr.message_status")
    finally:
        await conn.close()
    return {r["message_id"]: r["status"] for r in rows}


def _assert_chains(changes: Sequence[dict[str, Any]], statuses: dict[str, str]) -> None:
    """Positions strictly increase; per message each change starts where the previous one
    ended; every message's last change is its status."""
    positions = [c["position"] for c in changes]
    assert positions == sorted(set(positions))
    last: dict[str, dict[str, Any]] = {}
    for change in changes:
        before = last.get(change["message_id"])
        assert change["previous_status"] == (before["status"] if before else None), change
        last[change["message_id"]] = change
    assert {m: c["status"] for m, c in last.items()} == statuses


@pytest.fixture
async def recorded(database_url: str) -> list[dict[str, Any]]:
    """Receipt bodies for 1,500 messages (10 of them with a conflicting final), their
    messages recorded, plus 20 receipts of unknown ids."""
    bodies = receipt_bodies(3_000, conflicting=10)
    store = await Store.open(database_url, pool_size=1)
    try:
        ids = sorted({b["id"] for b in bodies})
        await store.record_submissions([Submission(LOGIN, m, "+34600000000") for m in ids])
    finally:
        await store.close()
    return bodies + [{"id": f"unknown{n}", "level": 2, "stat": "DELIVRD"} for n in range(20)]


@pytest.mark.timeout(240)
async def test_three_daemons_a_follower_before_traffic_and_a_full_reread_agree(
    database_url: str, tmp_path: Path, recorded: list[dict[str, Any]]
) -> None:
    """Three `dlrfeed run` on one login race over one store while `dlrfeed changes --follow`
    prints what commits: afterwards a full re-read prints the same lines; every message's last
    change is its status; nothing is missed or repeated."""
    follow_out = tmp_path / "follow.jsonl"
    follower = await _spawn(
        follow_out, "-m", "dlrfeed.cli", "changes", "--database-url", database_url,
        "--json", "--follow",
    )  # fmt: skip
    async with running_gateway() as gateway:
        env = {**_env(), "DLRFEED_PASSWORD": PASSWORD}
        daemons = [
            await _spawn(
                tmp_path / f"daemon{n}.log",
                "-m",
                "dlrfeed.cli",
                *run_args(gateway.target, database_url, "--streams", "1", "--batch-size", "50"),
                env=env,
            )
            for n in range(3)
        ]
        try:
            gateway.faults.update({"seed": 5, "duplicate_rate": 0.1})
            await gateway.inject(LOGIN, recorded)
            await _wait_until(lambda: drained(gateway), 180, "the three daemons to drain")
        finally:
            codes = [await _finish(d) for d in daemons]
        assert codes == [0, 0, 0]
    reread = await _cli_json_lines(database_url)

    async def follower_caught_up() -> bool:
        return len(follow_out.read_text().splitlines()) >= len(reread)

    await _wait_until(follower_caught_up, 30, "the follower to print every change")
    assert await _finish(follower) == 0
    followed = [json.loads(line) for line in follow_out.read_text().splitlines()]
    assert followed == reread
    statuses = await _statuses(database_url)
    assert len(statuses) == 1_500
    _assert_chains(followed, statuses)


async def _receiver(port: int, tmp_path: Path, script: str = "") -> tuple[Any, int]:
    """The endpoint on `port` (0: a port it picks itself) once it listens, and its port."""
    out = tmp_path / "receiver.out"
    offset = out.stat().st_size if out.exists() else 0
    process = await _spawn(
        out, str(REPO / "scripts" / "webhook_receiver.py"),
        "--port", str(port), "--secret-file", str(tmp_path / "secret"),
        "--log", str(tmp_path / "received.jsonl"), "--script", script, "--slow-seconds", "2",
    )  # fmt: skip

    async def listening() -> bool:
        return logged_receiver_port(out, offset) is not None

    await _wait_until(listening, 20, "the webhook receiver to listen")
    bound = logged_receiver_port(out, offset)
    assert bound is not None
    return process, bound


async def _relay(database_url: str, port: int, tmp_path: Path) -> tuple[Any, int]:
    """A relay to the endpoint on `port`, once it serves its metrics, and their port (bound
    by the relay itself: `--metrics 127.0.0.1:0`)."""
    log = tmp_path / "relay.log"
    offset = log.stat().st_size if log.exists() else 0
    process = await _spawn(
        log, "-m", "dlrfeed.cli", "relay",
        "--url", f"http://127.0.0.1:{port}/hook", "--secret-file", str(tmp_path / "secret"),
        "--database-url", database_url, "--consumer", "hook", "--batch-size", "50",
        "--timeout", "1", "--retry-max", "0.5", "--metrics", "127.0.0.1:0",
        "--log-format", "json",
    )  # fmt: skip

    async def serving() -> bool:
        return logged_metrics_address(log, offset) is not None

    await _wait_until(serving, 30, "the relay to serve its metrics")
    address = logged_metrics_address(log, offset)
    assert address is not None
    return process, address[1]


def _receipts(bodies: Sequence[dict[str, Any]]) -> list[Receipt]:
    """Receipts as the feed adapter makes them of these webhook bodies."""
    return receipts_from_payloads(
        [feed_pb2.Receipt(**b, ack_token=f"t{n}").SerializeToString() for n, b in enumerate(bodies)]
    )


def _retries(tmp_path: Path) -> int:
    return (tmp_path / "relay.log").read_text().count('"relay_retry"')


def _received_positions(tmp_path: Path) -> list[int]:
    return [
        change["position"]
        for entry in read_log(tmp_path / "received.jsonl")
        for change in entry["changes"]
    ]


async def _metrics(port: int) -> dict[str, float]:
    """The relay's metrics; empty while its server is not (yet) listening."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return {}
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    raw = (await reader.read()).decode()
    writer.close()
    values = {}
    for line in raw.split("\r\n\r\n", 1)[-1].splitlines():
        if line.startswith("dlrfeed_relay_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.mark.timeout(240)
async def test_relay_survives_503_timeouts_and_kill9_of_itself_and_the_endpoint(
    database_url: str, tmp_path: Path
) -> None:
    """Every change reaches the endpoint, every request is validly signed, each message's
    changes arrive in order, and the relay's cursor stands at the last change, although the
    endpoint answers 503 and times out, and both it and the relay are killed -9 mid-run."""
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    os.chmod(tmp_path / "secret", 0o600)
    ids = [f"h{n}" for n in range(300)]
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions([Submission(LOGIN, m, "+34600000000") for m in ids])
        bodies = receipt_bodies(600, prefix="h")
        for body in bodies:
            body["id"] = f"h{int(body['id'][1:])}"
        await store.ingest(LOGIN, _receipts(bodies[:200]))
        receiver, port = await _receiver(0, tmp_path, script="503,503,slow,503")
        relay, metrics_port = await _relay(database_url, port, tmp_path)
        for start in range(200, 400, 20):  # traffic while the relay runs
            await store.ingest(LOGIN, _receipts(bodies[start : start + 20]))

        async def some_delivered() -> bool:
            return len(_received_positions(tmp_path)) >= 100

        await _wait_until(some_delivered, 60, "a first part to be delivered")
        await _kill9(relay)
        await store.ingest(LOGIN, _receipts(bodies[400:500]))
        relay, metrics_port = await _relay(database_url, port, tmp_path)
        await _kill9(receiver)  # the endpoint dies: the relay retries, loses nothing
        await store.ingest(LOGIN, _receipts(bodies[500:]))
        retries_before = _retries(tmp_path)

        async def refused_while_down() -> bool:
            return _retries(tmp_path) > retries_before

        await _wait_until(refused_while_down, 60, "the relay to meet the dead endpoint")

        async def lagging_in_metrics() -> bool:  # the backlog shows while the endpoint is down
            metrics = await _metrics(metrics_port)
            return metrics.get("dlrfeed_relay_pending_changes", 0) > 0 and (
                metrics.get("dlrfeed_relay_lag_seconds", 0) > 0
            )

        await _wait_until(lagging_in_metrics, 20, "the lag and pending gauges to rise")
        receiver, _ = await _receiver(port, tmp_path)  # where the relay's --url points

        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch("SELECT position FROM dlr.status_changes ORDER BY position")
            expected = [int(r["position"]) for r in rows]

            async def all_delivered() -> bool:
                cursor = await conn.fetchval(
                    "SELECT position FROM dlr.change_cursors WHERE consumer = 'hook'"
                )
                return cursor is not None and int(cursor) == expected[-1]

            await _wait_until(all_delivered, 120, "every change to be delivered")
        finally:
            await conn.close()

        async def caught_up_in_metrics() -> bool:  # the gauges refresh every second
            return (await _metrics(metrics_port)).get("dlrfeed_relay_pending_changes") == 0

        await _wait_until(caught_up_in_metrics, 10, "the pending gauge to reach 0")
        metrics = await _metrics(metrics_port)
        assert await _finish(relay) == 0
        await _kill9(receiver)
    finally:
        await store.close()
    entries = read_log(tmp_path / "received.jsonl")
    assert all(e["signature_valid"] for e in entries)
    assert any(e["answer"] == "slow" for e in entries)  # the timed-out request did arrive late
    received = _received_positions(tmp_path)
    assert set(received) == set(expected)  # nothing lost (duplicates are the receiver's to drop)
    assert len(received) > len(set(received))  # the timed-out batch came twice
    first_seen = list(dict.fromkeys(received))
    assert first_seen == sorted(first_seen)  # in order, and so per message in order
    assert metrics["dlrfeed_relay_up"] == 1
    assert metrics["dlrfeed_relay_attempt_failures_total"] >= 1
    assert metrics["dlrfeed_relay_delivered_total"] > 0
    assert metrics["dlrfeed_relay_pending_changes"] == 0
    assert metrics["dlrfeed_relay_lag_seconds"] == 0
    relay_log = (tmp_path / "relay.log").read_text()
    assert SECRET.decode() not in relay_log
    assert "relay_retry" in relay_log
