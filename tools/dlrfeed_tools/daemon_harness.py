"""Shared pieces of the daemon's tests: settings from a real command line, receipts to inject,
and the store/gateway comparisons that prove nothing was lost or applied twice."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import asyncpg

from dlrfeed.cli import build_parser
from dlrfeed.config import LayeredDefaults
from dlrfeed.daemon.app import Daemon
from dlrfeed.daemon.settings import DaemonSettings
from fakegw.server import FakeGateway
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"
PASSWORD = "s3cret-Pa55word"  # a distinctive value, so leak tests can search for it


def run_args(gateway: str, database_url: str, *extra: str) -> list[str]:
    """A `dlrfeed run` command line for tests (fast lingers, no summary spam)."""
    return [
        "run",
        "--gateway", gateway,
        "--login", LOGIN,
        "--database-url", database_url,
        "--linger-ms", "20",
        "--ack-linger-ms", "20",
        "--summary-interval", "0",
        "--log-format", "json",
        *extra,
    ]  # fmt: skip


def settings_for(
    gateway: str,
    database_url: str,
    *extra: str,
    environ: Mapping[str, str] | None = None,
) -> DaemonSettings:
    """Settings parsed exactly as `dlrfeed run` parses them."""
    env = {"DLRFEED_PASSWORD": PASSWORD} if environ is None else dict(environ)
    parser, subparsers = build_parser()
    args = LayeredDefaults(parser, subparsers, env).parse(run_args(gateway, database_url, *extra))
    return DaemonSettings.from_args(args, env)


def receipt_bodies(
    count: int, *, prefix: str = "m", seed: int = 1, conflicting: int = 0
) -> list[dict[str, Any]]:
    """Webhook bodies: one progress + one result per message, some results before progress,
    plus `conflicting` extra finals that contradict an earlier final (P14 conflicts)."""
    rng = random.Random(seed)
    bodies: list[dict[str, Any]] = []
    messages = max(1, count // 2)
    for n in range(messages):
        mid = f"{prefix}{n:07d}"
        progress = {"id": mid, "level": 1, "stat": "ENROUTE", "err": "000",
                    "done_date": "2611291200"}  # fmt: skip
        final = {"id": mid, "level": 2, "stat": "DELIVRD", "err": "000",
                 "done_date": "2611291201", "destination_addr": "34600000000"}  # fmt: skip
        pair = [progress, final]
        if rng.random() < 0.05:  # F13: result before progress
            pair.reverse()
        bodies.extend(pair)
    for n in range(conflicting):
        mid = f"{prefix}{n:07d}"
        bodies.append({"id": mid, "level": 2, "stat": "UNDELIV", "err": "001",
                       "done_date": "2611291202"})  # fmt: skip
    return bodies[: count + conflicting]


async def store_counts(database_url: str) -> dict[str, int]:
    """Row counts of the store tables that the comparisons use."""
    conn = await asyncpg.connect(database_url)
    try:
        return {
            "receptions": await conn.fetchval("SELECT count(*) FROM dlr.receptions"),
            "events": await conn.fetchval("SELECT count(*) FROM dlr.events"),
            "distinct_events": await conn.fetchval(
                "SELECT count(DISTINCT (login, message_id, level)) FROM dlr.events"
            ),
            "unstorable": await conn.fetchval(
                "SELECT count(*) FROM dlr.exceptions WHERE kind = 'unstorable'"
            ),
        }
    finally:
        await conn.close()


async def stored_tokens(database_url: str) -> set[str]:
    """The ack tokens of every stored reception (parsed from the raw payload, P9)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT payload FROM dlr.receptions")
    finally:
        await conn.close()
    return {feed_pb2.Receipt.FromString(bytes(row["payload"])).ack_token for row in rows}


async def stored_event_keys(database_url: str) -> set[tuple[str, int]]:
    """(message_id, level) of every logical event."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT message_id, level FROM dlr.events")
    finally:
        await conn.close()
    return {(row["message_id"], int(row["level"])) for row in rows}


def enqueued_keys(ledger: Sequence[Mapping[str, Any]]) -> set[tuple[str, int]]:
    """(id, level) of every receipt the gateway enqueued, from its ledger."""
    return {
        (rec["receipt"]["id"], int(rec["receipt"]["level"]))
        for rec in ledger
        if rec["kind"] == "enqueue"
    }


def acked_tokens(ledger: Sequence[Mapping[str, Any]]) -> set[str]:
    """Tokens of every receipt the gateway removed because of an Ack."""
    return {str(rec["token"]) for rec in ledger if rec["kind"] == "ack"}


@contextlib.asynccontextmanager
async def running_gateway(**kwargs: object) -> AsyncIterator[FakeGateway]:
    gateway = FakeGateway({LOGIN: PASSWORD}, **kwargs)  # type: ignore[arg-type]
    async with gateway.running() as running:
        yield running


async def wait_until(predicate: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def drained(gateway: FakeGateway) -> bool:
    stats = gateway.stats(LOGIN)
    return stats["queued"] == 0 and stats["in_flight"] == 0


async def run_until_drained(daemon: Daemon, gateway: FakeGateway, within_s: float = 30) -> int:
    task = asyncio.create_task(daemon.run(), name="daemon-under-test")
    try:
        await wait_until(lambda: drained(gateway), within_s, "the queue to drain")
    finally:
        daemon.stop()
        code = await asyncio.wait_for(task, 15)
    return code


async def assert_ledger_matches_store(gateway: FakeGateway, database_url: str) -> None:
    """Every enqueued (id, level) is one event; every acked receipt is stored (F8, C7)."""
    ledger = gateway.ledger(LOGIN, limit=10_000_000)["records"]
    stored, enqueued = await stored_event_keys(database_url), enqueued_keys(ledger)
    assert stored == enqueued, (
        sorted(stored - enqueued)[:5],
        sorted(enqueued - stored)[:5],
        len(stored),
        len(enqueued),
    )
    counts = await store_counts(database_url)
    assert counts["events"] == counts["distinct_events"]
    assert acked_tokens(ledger) <= await stored_tokens(database_url)
