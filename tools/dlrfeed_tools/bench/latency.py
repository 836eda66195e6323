"""Receive → ack latency as the gateway sees it (`make bench`, (f)): a paced injector feeding
fakegw, and each receipt's enqueue and ack times read back from fakegw's ledger."""

from __future__ import annotations

import asyncio
import re
import time

from dlrfeed_tools.bench import e2e as bench_e2e
from dlrfeed_tools.local_login import LOGIN, PASSWORD
from fakegw.admin_client import AdminClient


def latency_id(prefix: str, number: int) -> str:
    """The message id of the latency run's receipt `number`: the prefix tells its receipts
    apart in the ledger."""
    return f"{prefix}{number:024x}"


async def paced_inject(target: str, rate: float, seconds: float, prefix: str) -> int:
    """Inject latency receipts every 10 ms so that `rate`/s arrive steadily; returns how many."""
    async with AdminClient(target, LOGIN, PASSWORD) as admin:
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(rate * elapsed)
            if due > sent:
                bodies = []
                for number in range(sent, due):
                    body = bench_e2e.sample_receipt(number)
                    body["id"] = latency_id(prefix, number)
                    body["level"], body["stat"] = 2, "DELIVRD"
                    bodies.append(body)
                await admin.inject(bodies)
                sent = due
            await asyncio.sleep(0.01)
        return sent


async def ledger_latencies(target: str, prefix: str) -> tuple[list[tuple[float, float]], float]:
    """(enqueue time, ack time) of each latency receipt from fakegw's ledger, and the first
    enqueue time."""
    enqueued: dict[int, float] = {}
    acked: dict[int, float] = {}
    async with AdminClient(target, LOGIN, PASSWORD, timeout=120) as admin:
        after = 0
        while True:
            page = await admin.ledger(after=after, limit=5_000)
            for record in page["records"]:
                if record["kind"] == "enqueue":
                    if str(record["receipt"].get("id", "")).startswith(prefix):
                        enqueued[record["seq"]] = record["at"]
                elif record["seq"] in enqueued:
                    acked[record["seq"]] = record["at"]
            if not page["records"]:
                break
            after = page["next"]
    start_epoch = min(enqueued.values()) if enqueued else 0.0
    pairs = [(enqueued[seq], at) for seq, at in acked.items()]
    return pairs, start_epoch


def received_by_mode(metrics_text: str) -> dict[str, float]:
    """The daemon's receipts received, by the mode that read them, from its /metrics text."""
    pattern = r'^dlrfeed_receipts_received_total\{mode="([^"]+)"\} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, metrics_text, re.MULTILINE)}
