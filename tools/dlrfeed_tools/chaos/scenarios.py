"""The chaos scenarios: each a fault schedule against real processes, and what it proves.

A scenario's definition (`ScenarioSpec`) carries as data what the report says about it: its
title, the rules it proves and the facts it demonstrates. The processes it breaks (fakegw,
`dlrfeed run`) are driven through `Rig`; the relay's and the webhook receiver's scenarios are in
`chaos.http_scenarios`; `chaos.run` runs scenarios, `chaos.report` renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from dlrfeed.store.migrate import migrate
from dlrfeed_tools.chaos.http_scenarios import RETRYING_GATEWAY, relay_kill9, webhook_kill9
from dlrfeed_tools.chaos.rig import Rig, during, traffic
from dlrfeed_tools.invariants import read_ledger
from dlrfeed_tools.pgcluster import ReplicatedPair, scratch_directory
from gateway.receipts.v1 import feed_pb2

MiB = 1024 * 1024

# ---------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Fact:
    """A behaviour a scenario shows beyond its invariants: a named subject and what holds."""

    subject: str
    holds: str


@dataclass(frozen=True)
class ScenarioSpec:
    """One scenario of the matrix: its fault schedule, what it proves and the facts it shows."""

    name: str
    title: str
    proves: str
    run: Callable[[Rig], Awaitable[str]]
    gateway_flags: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = ()
    """What else the scenario demonstrates about the system, rendered as findings."""


async def daemon_kill9(rig: Rig) -> str:
    kills = 20 if rig.full else 3
    receipts = 50_000 if rig.full else 5_000
    work = traffic(rig, receipts)
    await rig.record(work)
    # A killed Pull reader's receipts stay leased until the lease ends (F6; F7 frees only
    # streams): a 10 s lease keeps the drain after the last kill bounded.
    await rig.start_daemons(1, "--streams", "2", "--lease-seconds", "10", "--release-after", "5")
    span = kills * (2.0 if rig.full else 1.5)

    async def killer() -> None:
        for _ in range(kills):
            await asyncio.sleep(rig.rng.uniform(0.6, 2.0 if rig.full else 1.4))
            daemon = rig.daemons[0]
            await daemon.kill9()
            await daemon.start()

    await during(rig.feed(work.receipts, span), killer)
    return f"{kills} x kill -9 of the daemon, restarted at once; gateway lease 10 s"


async def gateway_kill9(rig: Rig) -> str:
    kills = 5 if rig.full else 2
    receipts = 20_000 if rig.full else 3_000
    work = traffic(rig, receipts)
    await rig.record(work)
    await rig.start_daemons(1, "--streams", "2")
    chunk = -(-len(work.receipts) // kills)
    for start in range(0, len(work.receipts), chunk):
        # Kill while the daemon is mid-drain: some of this chunk stored, more in flight.
        before = await rig.stored()
        await rig.inject(work.receipts[start : start + chunk])
        await rig.wait_stored(before + rig.rng.randrange(chunk // 5, chunk // 2))
        await rig.gateway.kill9()
        await asyncio.sleep(rig.rng.uniform(0.1, 1.0))
        await rig.gateway.start()
    return (
        f"{kills} x kill -9 of fakegw mid-drain (file store, 50 ms latency on Pull/Ack/stream "
        "start), restarted on the same port"
    )


async def postgres_outages(rig: Rig) -> str:
    outage = 30.0 if rig.full else 8.0
    receipts = 20_000 if rig.full else 4_000
    work = traffic(rig, receipts)
    await rig.record(work)
    await rig.start_daemons(1, "--streams", "2", "--release-after", "5")

    async def outages() -> None:
        await asyncio.sleep(1.5)
        await asyncio.to_thread(rig.cluster.restart, "fast")
        await asyncio.sleep(2.0)
        await asyncio.to_thread(rig.cluster.stop, "fast")
        await asyncio.sleep(outage)
        await asyncio.to_thread(rig.cluster.start)

    await during(rig.feed(work.receipts, 4.0 + outage), outages)
    return f"PostgreSQL restarted (fast), then stopped for {outage:.0f} s; --release-after 5"


async def stream_cuts(rig: Rig) -> str:
    every = 700 if rig.full else 300
    receipts = 30_000 if rig.full else 4_000
    work = traffic(rig, receipts)
    await rig.record(work)
    await rig.faults(cut_stream_every=every, duplicate_rate=0.05)
    await rig.start_daemons(1, "--mode", "subscribe", "--streams", "2", "--max-reopens", "50")
    await rig.feed(work.receipts, 6.0 if rig.full else 3.0)
    return f"every Subscribe stream cut after {every} receipts; 5 % gateway duplicates"


async def unavailable_bursts(rig: Rig) -> str:
    bursts = 8 if rig.full else 3
    receipts = 20_000 if rig.full else 3_000
    work = traffic(rig, receipts)
    await rig.record(work)
    # Small batches and ack batches: many Pull and Ack calls meet each burst.
    await rig.start_daemons(
        1, "--mode", "pull", "--streams", "2", "--max-reopens", "50",
        "--batch-size", "100", "--ack-batch", "50",
    )  # fmt: skip
    chunk = -(-len(work.receipts) // bursts)
    for start in range(0, len(work.receipts), chunk):
        # Each burst starts once the daemon is mid-drain (commits and acks flowing) and lasts
        # 1-2 s, so that Pulls and Acks certainly meet it.
        before = await rig.stored()
        await rig.inject(work.receipts[start : start + chunk])
        await rig.wait_stored(before + chunk // 10)
        await rig.faults(unavailable_rate=0.6, ack_lost_rate=0.3)
        await asyncio.sleep(rig.rng.uniform(1.0, 2.0))
        await rig.faults(unavailable_rate=0.0, ack_lost_rate=0.0)
    return (
        f"{bursts} bursts: 60 % of Pull/Ack answer UNAVAILABLE, 30 % of Acks applied "
        "but answered UNAVAILABLE (lost reply)"
    )


async def slow_commit_lease(rig: Rig) -> str:
    holds = 3 if rig.full else 1
    hold_s = 5.0
    receipts = 10_000 if rig.full else 2_000
    work = traffic(rig, receipts)
    await rig.record(work)
    await rig.start_daemons(
        2, "--mode", "pull", "--streams", "1", "--lease-seconds", "2", "--release-after", "1",
        "--batch-size", "200",
    )  # fmt: skip

    async def locker() -> None:
        # The first hold starts once the daemons store, not a fixed second after the start:
        # daemons slow to start (a loaded machine) would otherwise find the lock already gone.
        await rig.wait_stored(1)
        conn = await asyncpg.connect(rig.database_url)
        try:
            for hold in range(holds):
                if hold:
                    await asyncio.sleep(1.0)
                # Every ingest touching a status waits on this lock: commit takes > the 2 s
                # lease, the gateway redelivers the batch to the other worker (F6).
                async with conn.transaction():
                    await conn.execute("LOCK TABLE dlr.statuses IN EXCLUSIVE MODE")
                    await asyncio.sleep(hold_s)
        finally:
            await conn.close()

    await during(rig.feed(work.receipts, holds * (hold_s + 1.0)), locker)
    return f"lease 2 s; {holds} x {hold_s:.0f} s exclusive lock on dlr.statuses; 2 Pull workers"


async def three_process_race(rig: Rig) -> str:
    receipts = 30_000 if rig.full else 4_000
    work = traffic(rig, receipts, duplicate_rate=0.2, conflicting_final_rate=0.1)
    await rig.record(work)
    await rig.start_daemons(3, "--streams", "2")
    await rig.feed(work.receipts, 5.0 if rig.full else 2.0)
    return "3 processes x 2 streams on one login; 20 % repeats, 10 % conflicting finals"


_ACKS_SETTLE_S = 0.25  # far longer than the test command line's 20 ms ack linger


async def failover(rig: Rig, *, synchronous: bool) -> str:
    """A primary and its streaming standby of their own (the rig's cluster is not used): the
    daemon on a multi-host URL (target_session_attrs=read-write), kill -9 of the primary
    mid-drain, promotion of the standby while the traffic goes on."""
    receipts = 20_000 if rig.full else 4_000
    pair = ReplicatedPair(scratch_directory("replicated"), synchronous=synchronous)
    rig.teardown.append(pair.destroy)
    await pair.start()
    await migrate(pair.primary.dsn)  # the database `postgres` of the pair
    rig.database_url = pair.url("postgres")
    work = traffic(rig, receipts)
    await rig.record(work)
    extra = ["--require-synchronous-commit"] if synchronous else []
    await rig.start_daemons(1, "--streams", "2", *extra)
    cut_s = rig.rng.uniform(0.3, 0.8)
    outage_s = rig.rng.uniform(0.5, 1.5)

    async def crash_and_promote() -> None:
        await rig.wait_stored(len(work.receipts) // 4)
        # Failovers come when things already go wrong: the standby is cut off first, and the
        # primary dies before it is back.
        receiver = await pair.cut_replication()
        async with rig.admin() as admin:
            # Acks of commits the standby confirmed before the cut are through by then.
            await asyncio.sleep(_ACKS_SETTLE_S)
            acked_at_cut = (await admin.stats())["acked"]
            await asyncio.sleep(cut_s - _ACKS_SETTLE_S)
            acked = (await admin.stats())["acked"]
        await pair.kill9_primary()
        pair.resume_standby(receiver)
        await asyncio.sleep(outage_s)
        await pair.promote_standby()
        rig.notes.append(
            f"primary killed with {acked:,} receipts acked, {acked - acked_at_cut:,} of them "
            f"after the first {_ACKS_SETTLE_S} s of the {cut_s:.2f} s the standby was cut off; "
            "standby promoted "
            f"{outage_s:.1f} s after the kill"
        )

    await during(rig.feed(work.receipts, 4.0 if rig.full else 2.0), crash_and_promote)
    mode = "synchronous (synchronous_commit=on)" if synchronous else "asynchronous"
    return (
        f"{mode} streaming standby; at 1/4 of the drain the standby is cut off (WAL receiver "
        "frozen, WAL sender ended), 0.3-0.8 s later kill -9 of the primary, then promotion"
    )


async def failover_sync(rig: Rig) -> str:
    return await failover(rig, synchronous=True)


def hostile_bodies(rng: random.Random, count: int, megabyte_texts: int) -> list[dict[str, Any]]:
    """Receipts a hostile or broken network might send; each marked `connector: hostile`."""
    kinds: list[Callable[[int], dict[str, Any]]] = [
        lambda n: {"id": f"nul\x00{n}", "level": 2, "stat": "DELIVRD"},
        lambda n: {"id": f"h{n}", "level": 2, "stat": "DEL\x00IVRD", "err": "0\x000"},
        lambda n: {"id": f"h{n}", "level": 1, "stat": "ENROUTE", "text": "a\x00b" * 50},
        lambda n: {"id": f"{n}-" + "x" * 10_240, "level": 2, "stat": "DELIVRD"},
        lambda n: {"id": "", "level": 2, "stat": "DELIVRD", "done_date": f"{n}"},
        lambda n: {"id": f"h{n}", "level": 2, "stat": rng.choice(["WHATEVER", "", "délivré"])},
        lambda n: {"id": f"h{n}", "level": 2, "stat": "DELIVRD", "done_date": "2613451299"},
        lambda n: {"id": f"h{n}", "level": 2, "stat": "EXPIRED", "submit_date": "0000000000"},
        lambda n: {"id": f"h{n}", "level": 0, "stat": "DELIVRD"},
        lambda n: {"id": f"h{n}", "level": 99, "stat": "DELIVRD"},
    ]
    bodies = [{**rng.choice(kinds)(n), "connector": "hostile"} for n in range(count)]
    for n in range(megabyte_texts):
        bodies.insert(
            rng.randrange(len(bodies) + 1),
            {"id": f"big{n}", "level": 2, "stat": "DELIVRD", "text": "T" * MiB,
             "connector": "hostile"},
        )  # fmt: skip
    return bodies


async def hostile_flood(rig: Rig) -> str:
    hostile = 5_000 if rig.full else 600
    megabytes = 8 if rig.full else 3
    work = traffic(rig, 10_000 if rig.full else 2_000)
    await rig.record(work)
    bodies = hostile_bodies(rig.rng, hostile, megabytes)
    mixed = list(work.receipts)
    for body in bodies:
        mixed.insert(rig.rng.randrange(len(mixed) + 1), body)
    await rig.start_daemons(1, "--streams", "2")
    await rig.feed(mixed, 3.0)
    rig.notes.append(await _hostile_unflagged(rig))
    return (
        f"{hostile} hostile receipts (NUL in id/stat/err/text, 10 KB id, empty id, unknown stat, "
        f"impossible dates, level 0 and 99) and {megabytes} with a 1 MB text, mixed into "
        "normal traffic"
    )


async def _hostile_unflagged(rig: Rig) -> str:
    """Every hostile receipt must be stored raw AND flagged (reception flags, an exception
    outcome, or C8 `unstorable` evidence); a count of those that are not fails the scenario."""
    async with rig.admin() as admin:
        stats = await admin.stats()
        deadline = time.monotonic() + 120
        while stats["queued"] + stats["in_flight"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            stats = await admin.stats()
        ledger = await read_ledger(admin)
    hostile = {
        r["token"]
        for r in ledger
        if r["kind"] == "enqueue" and r["receipt"].get("connector") == "hostile"
    }
    conn = await asyncpg.connect(rig.database_url)
    try:
        rows = await conn.fetch(
            "SELECT payload, flags, outcome FROM dlr.receptions_readable"
            " WHERE payload_json->>'connector' = 'hostile' OR cardinality(flags) > 0"
        )
        whole_megabytes = await conn.fetchval(
            "SELECT count(DISTINCT message_id) FROM dlr.receptions"
            " WHERE message_id LIKE 'big%' AND octet_length(payload) > $1",
            MiB,
        )
        evidence = await conn.fetch("SELECT evidence FROM dlr.exceptions WHERE kind = 'unstorable'")
    finally:
        await conn.close()
    flagged: set[str] = set()
    for row in rows:
        if row["flags"] or row["outcome"] in ("uncorrelated", "unrecognized", "conflict"):
            flagged.add(feed_pb2.Receipt.FromString(bytes(row["payload"])).ack_token)
    for row in evidence:
        with contextlib.suppress(Exception):
            flagged.add(feed_pb2.Receipt.FromString(bytes(row["evidence"])).ack_token)
    unflagged = len(hostile - flagged)
    if unflagged:
        rig.extra_failures.append(f"{unflagged} hostile receipts stored without a flag")
    rig.notes.append(
        f"1 MB texts delivered (the daemon accepts gRPC messages up to --max-message-mb, "
        f"64 MB by default) and stored whole in `payload`: {whole_megabytes} messages"
    )
    return f"hostile receipts: {len(hostile)} enqueued, {len(hostile) - unflagged} flagged"


SCENARIOS: tuple[ScenarioSpec, ...] = (
    ScenarioSpec(
        "daemon_kill9",
        "kill -9 of the daemon at random moments",
        "A crash at any point — before commit, between commit and ack, mid-ack — loses nothing "
        "and applies nothing twice: unacked receipts come back (F6/F7) and are stored once or "
        "recognised as repeats (C7, C1).",
        daemon_kill9,
        ("--lease-seconds", "10"),
        facts=(
            Fact(
                "Pull after kill -9",
                "receipts a killed process had pulled stay leased until the gateway's lease "
                "ends (F6; F7 frees only streams), so the drain after the last kill takes up "
                "to one lease (120 s by default). `daemon_kill9` runs with a 10 s lease.",
            ),
        ),
    ),
    ScenarioSpec(
        "gateway_kill9",
        "kill -9 and restart of fakegw",
        "The daemon survives its gateway vanishing mid-stream and mid-ack: it reconnects with "
        "backoff, receipts delivered but not acked come back after the restart and are repeats, "
        "and every ack the gateway answered was for a stored receipt (F1, F9, C7).",
        gateway_kill9,
        # Slow answers keep receipts delivered-but-unacked, so a kill always has some in hand.
        ("--latency-ms", "50"),
    ),
    ScenarioSpec(
        "postgres_outages",
        "PostgreSQL restarted fast, then stopped",
        "A database outage stops reading instead of acking or dropping: batches in hand are "
        "retried whole, Subscribe streams are closed after --release-after so the gateway can "
        "release their receipts (F7) while Pull readers keep what they pulled (its lease would "
        "hold it, F6), and draining resumes by itself when PostgreSQL is back.",
        postgres_outages,
    ),
    ScenarioSpec(
        "stream_cuts",
        "streams cut every N receipts",
        "A Subscribe stream that ends releases its unacked receipts at once (F7); the reader "
        "reopens within its reopen cap and the redeliveries are repeats, never new effects.",
        stream_cuts,
    ),
    ScenarioSpec(
        "unavailable_bursts",
        "UNAVAILABLE bursts on Pull and Ack",
        "Transient Pull failures are retried with backoff; a failed or lost Ack reply is "
        "retried and `already_gone` counts as done (F9); nothing stored stays unacked forever.",
        unavailable_bursts,
    ),
    ScenarioSpec(
        "slow_commit_lease",
        "a commit slower than the lease",
        "When a commit outlives the lease the gateway redelivers the receipt to another worker "
        "while the first still holds it (F6); both commits land, the second as a repeat, the "
        "projection is computed once, and the late acks (from an expired lease) still work.",
        slow_commit_lease,
        ("--lease-seconds", "2", "--housekeeping-seconds", "0.2"),
    ),
    ScenarioSpec(
        "three_process_race",
        "three processes racing on one login",
        "Workers on one login converge through idempotent set-based writes: concurrent "
        "repeats and conflicting finals of the same message give exactly the rules' result "
        "(P14, P18, F12), with no deadlock left unhandled.",
        three_process_race,
    ),
    ScenarioSpec(
        "hostile_flood",
        "a flood of hostile receipts",
        "Garbage never blocks the queue and is never lost: NUL characters, megabyte fields, "
        "empty or 10 KB ids, unknown stats, impossible dates and odd levels are stored raw "
        "and flagged (C4, C8), and the normal receipts around them drain as usual.",
        hostile_flood,
        facts=(
            Fact(
                "Long ids (store)",
                "two different ids that share their first 512 characters stay two logical "
                "events (P14): an id cut to be storable for the `(login, message_id, level)` "
                "key keeps a digest of the raw id (`dlrfeed.domain.parse.storable_id`); "
                "`tests/system/test_chaos.py::test_two_long_ids_with_one_prefix_are_two_logical"
                "_events` guards it.",
            ),
            Fact(
                "1 MB `text`",
                "delivered and stored whole: the daemon accepts gRPC messages up to "
                "`--max-message-mb` (64 MB by default), fakegw sends up to 64 MB; the `text` "
                "column keeps the first 4,096 characters with flag `truncated:text`, `payload` "
                "keeps all. A `PullResponse` holding more than 64 MB of receipts would fail "
                "with RESOURCE_EXHAUSTED (not exercised).",
            ),
        ),
    ),
    ScenarioSpec(
        "failover_sync",
        "failover to a synchronous standby",
        "With synchronous replication a commit returns only once the standby has it, so no "
        "ack precedes what the promoted standby holds: after kill -9 of the primary mid-drain "
        "and promotion, the daemon (multi-host URL, target_session_attrs=read-write, "
        "--require-synchronous-commit) finds the new primary by itself, nothing acked is "
        "missing and nothing is applied twice (F8, C7).",
        failover_sync,
    ),
    ScenarioSpec(
        "webhook_kill9",
        "both paths at once: kill -9 of the callback receiver, an outage, duplicate posts",
        "Receipts arrive by the feed and by HTTP callback (a message's dlr_url), some by both: "
        "the receiver answers 2xx only after the commit, so kill -9 mid-burst and a PostgreSQL "
        "outage (503 + Retry-After) cost the gateway retries, never a receipt; a callback "
        "posted twice, or by both paths, is one logical event (P6, P14, F2).",
        webhook_kill9,
        RETRYING_GATEWAY,
    ),
    ScenarioSpec(
        "relay_kill9",
        "kill -9 of the relay and of its endpoint",
        "Every status change reaches the webhook endpoint, validly signed, first in position "
        "order (so per message in order), although the relay and the endpoint die mid-batch "
        "and the endpoint answers 503 and too slowly: the cursor moves only after a 2xx.",
        relay_kill9,
    ),
)
BY_NAME = {spec.name: spec for spec in SCENARIOS}
