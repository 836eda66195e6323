"""fakegw as a process: durability across kill -9 (F1, F5, F9) and the CLI of interfaces §2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from fakegw.admin_client import AdminClient
from support.fakegw_support import (
    LOGIN,
    PASSWORD,
    feed_client,
    receipt_body,
    start_fakegw_process,
    stop_fakegw_process,
)


async def test_f1_queue_acks_and_tokens_survive_kill_9_and_a_new_process(tmp_path: Path) -> None:
    store = str(tmp_path / "feed.db")
    first, target = start_fakegw_process("--store", store, "--lease-seconds", "60")
    try:
        async with AdminClient(target, LOGIN, PASSWORD) as admin:
            assert (await admin.inject([receipt_body(i) for i in range(20)]))["enqueued"] == 20
        client = feed_client(target)
        delivered = await client.pull(max_receipts=10)
        assert (await client.ack([r.ack_token for r in delivered[:5]])).acked == 5
        await client.close()
    finally:
        stop_fakegw_process(first, signal.SIGKILL)

    second, target = start_fakegw_process("--store", store, "--lease-seconds", "60")
    try:
        async with AdminClient(target, LOGIN, PASSWORD) as admin:
            stats = await admin.stats()
            assert (stats["queued"], stats["in_flight"]) == (15, 0)
            ledger = await admin.ledger_all()
        assert [r["kind"] for r in ledger].count("enqueue") == 20
        assert [r["kind"] for r in ledger].count("ack") == 5
        client = feed_client(target)
        again = await client.pull()
        counts = {r.id: r.delivery_count for r in again}
        assert {counts[r.id] for r in delivered[5:]} == {2}  # F6 count survives the crash
        assert {counts[f"m{i}"] for i in range(10, 20)} == {1}
        # F9: a token from the killed process acks here; an acked one is already_gone.
        response = await client.ack([delivered[5].ack_token, delivered[0].ack_token])
        assert (response.acked, list(response.already_gone)) == (1, [delivered[0].ack_token])
        await client.close()
    finally:
        stop_fakegw_process(second, signal.SIGKILL)


def test_cli_inject_and_stats_as_contract_section_2(tmp_path: Path) -> None:
    process, target = start_fakegw_process()
    try:
        lines = tmp_path / "receipts.jsonl"
        lines.write_text(
            "\n".join(json.dumps(receipt_body(i)) for i in range(3)) + "\n", encoding="utf-8"
        )
        cli = [sys.executable, "-m", "fakegw"]
        env = {k: v for k, v in os.environ.items() if k != "FAKEGW_PASSWORD"}
        injected = subprocess.run(
            [*cli, "inject", "--target", target, "--login", LOGIN, str(lines)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        assert json.loads(injected.stdout)["enqueued"] == 3
        stats = subprocess.run(
            [*cli, "stats", "--target", target, "--login", LOGIN],
            capture_output=True,
            text=True,
            check=True,
            env={**env, "FAKEGW_PASSWORD": PASSWORD},
        )
        counters = json.loads(stats.stdout)
        assert stats.stdout.count("\n") == 1
        for key in ("queued", "in_flight", "acked", "redelivered", "dropped_at_cap"):
            assert key in counters
        assert counters["queued"] == 3
        wrong = subprocess.run(
            [*cli, "stats", "--target", target, "--login", LOGIN, "--password", "nope"],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        assert wrong.returncode == 1
        assert "UNAUTHENTICATED" in wrong.stderr
    finally:
        assert stop_fakegw_process(process, signal.SIGTERM) == 0


def test_cli_traffic_sends_messages_and_injects_their_receipts(tmp_path: Path) -> None:
    process, target = start_fakegw_process()
    try:
        submissions = tmp_path / "submissions.jsonl"
        run = subprocess.run(
            [
                *(sys.executable, "-m", "fakegw", "traffic"),
                *("--target", target, "--login", LOGIN, "--password", PASSWORD),
                *("--messages", "30", "--seed", "5", "--progress-rate", "1"),
                *("--submissions-out", str(submissions)),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        totals = json.loads(run.stdout)
        assert (totals["messages"], totals["receipts"], totals["enqueued"]) == (30, 60, 60)
        lines = submissions.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 30
        assert {"message_id", "destination", "submitted_at"} <= set(json.loads(lines[0]))
    finally:
        stop_fakegw_process(process, signal.SIGTERM)
