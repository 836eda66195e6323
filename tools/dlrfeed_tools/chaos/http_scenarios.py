"""The chaos scenarios that break an HTTP peer beside the daemons: the relay and the endpoint it
posts the change log to, and the webhook receiver the gateway calls back (a message's
`dlr_url`). Their definitions are in `chaos.scenarios`, with the others.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed_tools.chaos.rig import Rig, during, traffic
from dlrfeed_tools.invariants import wait_for_drain
from dlrfeed_tools.paths import REPO
from dlrfeed_tools.ports import logged_receiver_port
from dlrfeed_tools.webhook_receiver import delivery_problems, read_log

# The relay scenario: `dlrfeed relay` and its webhook endpoint beside the daemons, both killed -9
# while traffic flows; after the drain, every change must reach the endpoint, validly signed,
# in position order (scripts/webhook_receiver.py `delivery_problems`).


class RelayRig:
    """`dlrfeed relay` and `scripts/webhook_receiver.py`, each killable and restartable."""

    def __init__(self, workdir: Path, database_url: str) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.port = 0  # the receiver's first start picks it; its restarts keep it (--url)
        self.secret_file = workdir / "relay-secret"
        self.received = workdir / "received.jsonl"
        self.relay: asyncio.subprocess.Process | None = None
        self.receiver: asyncio.subprocess.Process | None = None
        self.kills = 0

    async def _spawn(self, log_name: str, *args: str) -> asyncio.subprocess.Process:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLRFEED_", "NOTIFY_"))}
        with (self.workdir / log_name).open("ab") as log:
            return await asyncio.create_subprocess_exec(
                sys.executable, *args, env=env, stdout=log, stderr=log, cwd=REPO
            )

    async def start_receiver(self) -> None:
        """Start the endpoint (on `port` once it has one) and wait until it listens."""
        log = self.workdir / "receiver.log"
        offset = log.stat().st_size if log.exists() else 0
        self.receiver = receiver = await self._spawn(
            "receiver.log", "-m", "dlrfeed_tools.webhook_receiver",
            "--port", str(self.port), "--secret-file", str(self.secret_file),
            "--log", str(self.received), "--script", "503,slow,503", "--slow-seconds", "2",
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while (port := logged_receiver_port(log, offset)) is None:
            if receiver.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the webhook receiver did not listen; see {log}")
            await asyncio.sleep(0.05)
        self.port = port

    async def start_relay(self) -> None:
        self.relay = await self._spawn(
            "relay.log", "-m", "dlrfeed.cli", "relay",
            "--url", f"http://127.0.0.1:{self.port}/hook", "--secret-file", str(self.secret_file),
            "--database-url", self.database_url, "--consumer", "chaos", "--timeout", "1",
            "--retry-max", "1", "--log-format", "json",
        )  # fmt: skip

    async def start(self) -> None:
        self.secret_file.write_bytes(os.urandom(16).hex().encode())
        self.secret_file.chmod(0o600)
        await self.start_receiver()
        await self.start_relay()

    async def kill9(self, which: str) -> None:
        process = self.relay if which == "relay" else self.receiver
        assert process is not None
        process.kill()
        await process.wait()
        self.kills += 1

    async def stop(self) -> None:
        for process in (self.relay, self.receiver):
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 20)
                except TimeoutError:
                    process.kill()
                    await process.wait()

    async def problems(self, within_s: float) -> tuple[list[str], int]:
        """Wait until the relay's cursor reaches the last change, then check the deliveries;
        (problems, changes in the log)."""
        conn = await asyncpg.connect(self.database_url)
        try:
            deadline = time.monotonic() + within_s
            logged = [dict(r) for r in await conn.fetch(_RELAY_LOG)]
            last = int(logged[-1]["position"]) if logged else 0
            while int(await conn.fetchval(_RELAY_CURSOR) or 0) < last:
                if time.monotonic() > deadline:
                    return [f"relay: not caught up within {within_s:.0f} s"], len(logged)
                await asyncio.sleep(0.1)
            statuses = {
                (r["login"], r["message_id"]): r["status"]
                for r in await conn.fetch(
                    "SELECT login, message_id, status FROM dlr.message_status"
                )
            }
        finally:
            await conn.close()
        for change in logged:
            change["position"] = int(change["position"])
        return delivery_problems(read_log(self.received), logged, statuses), len(logged)


_RELAY_LOG = "SELECT position, login, message_id, status FROM dlr.status_changes ORDER BY position"
_RELAY_CURSOR = "SELECT position FROM dlr.change_cursors WHERE consumer = 'chaos'"


def by_both_paths(
    receipts: list[dict[str, Any]], url: str, rng: random.Random, both_rate: float
) -> list[dict[str, Any]]:
    """The traffic split between the two paths a gateway offers (F2): half the messages sent
    with `dlr_url` (their receipts POSTed there), the rest by the feed; and a share of receipts
    sent both ways, as during a migration from one path to the other (one event, P14)."""
    by_callback: dict[str, bool] = {}
    split: list[dict[str, Any]] = []
    for receipt in receipts:
        called_back = by_callback.setdefault(str(receipt.get("id")), rng.random() < 0.5)
        if called_back or rng.random() < both_rate:
            split.append({**receipt, "dlr_url": url})
        if not called_back:
            split.append(receipt)
    return split


# A gateway that retries its callbacks quickly and never gives up on one, and posts one in ten
# twice (a lost answer, as seen from the gateway).
RETRYING_GATEWAY = (
    "--callback-backoff-seconds", "0.05",
    "--callback-max-backoff-seconds", "1",
    "--callback-attempts", "100000",
    "--callback-duplicate-rate", "0.1",
)  # fmt: skip


async def webhook_kill9(rig: Rig) -> str:
    kills = 6 if rig.full else 2
    receipts = 20_000 if rig.full else 3_000
    work = traffic(rig, receipts)
    await rig.record(work)
    receiver = await rig.start_webhook()
    await rig.start_daemons(1, "--streams", "2", "--release-after", "5")
    bodies = by_both_paths(work.receipts, receiver.url, rig.rng, both_rate=0.05)
    span = kills * 3.0 + 6

    async def breaker() -> None:
        for _ in range(kills):
            await asyncio.sleep(rig.rng.uniform(0.5, 1.5))
            await receiver.kill9()
            await receiver.start()
            await receiver.wait_ready()
        # Both paths at once through one PostgreSQL outage while the receiver serves: the
        # feed stops acking, the receiver answers 503; both resume by themselves.
        await asyncio.sleep(0.5)
        await asyncio.to_thread(rig.cluster.stop, "fast")
        await asyncio.sleep(3)
        await asyncio.to_thread(rig.cluster.start)

    await during(rig.feed(bodies, span), breaker)
    callbacks = sum("dlr_url" in body for body in bodies)
    return (
        f"{callbacks:,} of {len(bodies):,} receipts by callback; {kills} x kill -9 of the "
        "receiver, a 3 s PostgreSQL outage, 10 % of callbacks posted twice"
    )


async def relay_kill9(rig: Rig) -> str:
    kills = 6 if rig.full else 2
    receipts = 20_000 if rig.full else 3_000
    work = traffic(rig, receipts)
    await rig.record(work)
    await rig.start_daemons(2, "--streams", "2")
    relay = RelayRig(rig.workdir, rig.database_url)
    await relay.start()
    span = kills * 1.5

    async def breaker() -> None:
        for n in range(kills):
            await asyncio.sleep(rig.rng.uniform(0.5, 1.5))
            if n % 2 == 0:
                await relay.kill9("relay")
                await relay.start_relay()
            else:
                await relay.kill9("receiver")
                await asyncio.sleep(0.5)  # refused connections meanwhile
                await relay.start_receiver()

    try:
        await during(rig.feed(work.receipts, span), breaker)
        async with rig.admin() as admin:
            await wait_for_drain(admin, 120)
        problems, changes = await relay.problems(90)
    finally:
        await relay.stop()
    rig.extra_failures.extend(problems)
    rig.notes.append(f"relay: {changes} changes, {relay.kills} kills, delivered and checked")
    return (
        f"2 daemons; `dlrfeed relay` and its endpoint killed -9 {kills} times in turn; "
        "the endpoint also answers 503 and too slowly"
    )
