"""The processes a chaos scenario breaks (fakegw, `dlrfeed run`, `dlrfeed webhook`) and the rig
that holds them.

Each process is killable and restartable on its port; `Rig` is what a scenario gets: the
cluster, its database, its seeded randomness, its gateway and daemons, and what it noted.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx

from dlrfeed.store.store import Store
from dlrfeed.store.submission import Submission
from dlrfeed_tools.daemon_harness import LOGIN, PASSWORD, run_args
from dlrfeed_tools.paths import REPO
from dlrfeed_tools.pgcluster import PgCluster, free_port
from fakegw.admin_client import AdminClient
from fakegw.traffic import Scenario, TrafficMix, scenario

# ---------------------------------------------------------------------------- processes


class GatewayProcess:
    """`fakegw serve` in its own process with a file store: killable, restartable on its port."""

    def __init__(self, workdir: Path, flags: Sequence[str]) -> None:
        self.workdir = workdir
        self.flags = list(flags)
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.kills = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start (or restart on the same port) and wait for its `listening` line."""
        log = (self.workdir / "fakegw.log").open("ab")
        for attempt in range(50):
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fakegw", "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--login", f"{LOGIN}:{PASSWORD}",
                "--store", str(self.workdir / "fakegw.sqlite"),
                *self.flags,
                stdout=asyncio.subprocess.PIPE, stderr=log, cwd=REPO,
            )  # fmt: skip
            assert self.process.stdout is not None
            line = await asyncio.wait_for(self.process.stdout.readline(), 30)
            if line:
                self.port = int(json.loads(line)["target"].rsplit(":", 1)[1])
                log.close()
                return
            await self.process.wait()  # the port may still be held by the killed one
            await asyncio.sleep(0.1 * (attempt + 1))
        log.close()
        raise RuntimeError("fakegw did not start; see fakegw.log")

    async def kill9(self) -> None:
        """SIGKILL: no cleanup, whatever was not yet written to its store is gone."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


class DaemonProcess:
    """One `dlrfeed run` process (the harness's test command line plus `extra`)."""

    def __init__(self, gateway: GatewayProcess, database_url: str, log: Path, extra: Sequence[str]):
        self.gateway = gateway
        self.database_url = database_url
        self.log = log
        self.extra = list(extra)
        self.process: asyncio.subprocess.Process | None = None
        self.kills = 0

    def argv(self) -> list[str]:
        """The `dlrfeed` command line this process runs."""
        return run_args(self.gateway.target, self.database_url, *self.extra)

    async def start(self) -> None:
        env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD}
        env.pop("NOTIFY_SOCKET", None)
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dlrfeed.cli", *self.argv(),
                env=env, stdout=log, stderr=log, cwd=REPO,
            )  # fmt: skip

    async def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> int | None:
        """SIGTERM and wait for a clean stop; the exit status (None if it had to be killed)."""
        if self.process is None:
            return None
        if self.process.returncode is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 40)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            return None


MAX_CALLBACK_BYTES = 256 * 1024


class WebhookProcess(DaemonProcess):
    """One `dlrfeed webhook` process, on one port across restarts (the callbacks' dlr_url)."""

    def __init__(self, gateway: GatewayProcess, database_url: str, log: Path, port: int) -> None:
        super().__init__(gateway, database_url, log, ())
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/dlr"

    async def wait_ready(self, within_s: float = 30.0) -> None:
        """Until it answers HTTP (it takes callbacks from then on)."""
        deadline = time.monotonic() + within_s
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    await client.get(self.url)
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the webhook receiver did not start") from None
                    await asyncio.sleep(0.05)
                else:
                    return

    def argv(self) -> list[str]:
        return [
            "webhook", "--listen", f"127.0.0.1:{self.port}", "--login", LOGIN,
            "--database-url", self.database_url, "--log-format", "json",
            # The traffic's oversized texts (70,000 characters, which the feed takes whole) fit
            # under this limit. A body over the limit is refused by design and kept only in part
            # (tests/integration/test_webhook.py), so the proof that nothing is lost runs with
            # a limit the traffic stays under.
            "--max-body-bytes", str(MAX_CALLBACK_BYTES),
        ]  # fmt: skip


# ---------------------------------------------------------------------------- the rig


@dataclass
class Rig:
    """What one scenario runs against; scenarios add faults through it."""

    cluster: PgCluster
    database_url: str
    workdir: Path
    rng: random.Random
    full: bool
    gateway: GatewayProcess
    daemons: list[DaemonProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_failures: list[str] = field(default_factory=list)
    teardown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run after the checker: what a scenario started of its own (e.g. its database servers)."""

    def admin(self) -> AdminClient:
        return AdminClient(self.gateway.target, LOGIN, PASSWORD, timeout=10)

    async def start_daemons(self, count: int, *extra: str) -> None:
        for n in range(count):
            daemon = DaemonProcess(
                self.gateway, self.database_url, self.workdir / f"daemon{n}.log", extra
            )
            await daemon.start()
            self.daemons.append(daemon)

    async def start_webhook(self) -> WebhookProcess:
        """A callback receiver beside the daemons; stopped and checked as they are."""
        receiver = WebhookProcess(
            self.gateway, self.database_url, self.workdir / "webhook.log", free_port()
        )
        await receiver.start()
        self.daemons.append(receiver)
        await receiver.wait_ready()
        return receiver

    async def record(self, traffic: Scenario) -> None:
        """The sending application's side (P5): every sent message recorded before receipts."""
        store = await Store.open(self.database_url)
        try:
            await store.record_submissions(
                [
                    Submission(login=LOGIN, message_id=m["id"], destination=m["destination"])
                    for m in traffic.messages
                ]
            )
        finally:
            await store.close()

    async def inject(self, receipts: Sequence[dict[str, Any]]) -> None:
        """Enqueue, retrying while the gateway is down (a retried chunk may enqueue twice)."""
        async with self.admin() as admin:
            for attempt in range(600):
                try:
                    await admin.inject(receipts)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED,
                    ):
                        raise
                    await asyncio.sleep(min(0.05 * (attempt + 1), 0.5))
                else:
                    return
        raise RuntimeError("fakegw stayed unreachable while injecting")

    async def feed(self, receipts: Sequence[dict[str, Any]], over_s: float) -> None:
        """Inject `receipts` in chunks spread over `over_s` seconds (traffic during faults)."""
        chunks = max(1, min(40, len(receipts) // 250))
        size = -(-len(receipts) // chunks)
        for start in range(0, len(receipts), size):
            await self.inject(receipts[start : start + size])
            await asyncio.sleep(over_s / chunks)

    async def stored(self) -> int:
        """Receptions stored so far."""
        conn = await asyncpg.connect(self.database_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
        finally:
            await conn.close()

    async def wait_stored(self, count: int, within_s: float = 60.0) -> None:
        """Until at least `count` receptions are stored."""
        deadline = time.monotonic() + within_s
        while await self.stored() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} receptions stored in {within_s} s")
            await asyncio.sleep(0.02)

    async def faults(self, **knobs: Any) -> None:
        async with self.admin() as admin:
            await admin.faults(**knobs)


def traffic(rig: Rig, receipts: int, **mix: float) -> Scenario:
    """Seeded adversarial traffic of about `receipts` receipts (~1.9 per message)."""
    defaults = {
        "duplicate_rate": 0.1,
        "result_before_progress_rate": 0.05,
        "conflicting_final_rate": 0.02,
        "unknown_id_rate": 0.02,
        "malformed_rate": 0.01,
    }
    seed = rig.rng.randrange(2**31)
    return scenario(seed, max(1, receipts * 10 // 19), TrafficMix(**{**defaults, **mix}))


async def during(work: Awaitable[None], faults: Callable[[], Awaitable[None]]) -> None:
    """Run the traffic feed and the fault schedule together; both must finish."""
    await asyncio.gather(work, faults())
