"""The chaos matrix, short form: every scenario of scripts/chaos.py against real
processes, ending with the ledger-vs-store invariant checker; and the checker's own proof that
it catches a lost receipt, a double-applied effect and an acked-but-missing receipt."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from dlrfeed.feed.client import receipt_from_proto
from dlrfeed.store.store import Store
from dlrfeed.store.submission import Submission
from dlrfeed_tools.chaos.run import run_scenario
from dlrfeed_tools.chaos.scenarios import BY_NAME, SCENARIOS
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    receipt_bodies,
    running_gateway,
    wait_until,
)
from dlrfeed_tools.invariants import compare, store_rows
from dlrfeed_tools.pgcluster import PgCluster
from fakegw.admin_client import basic_auth_metadata
from fakegw.server import FakeGateway
from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc
from support.fakegw_support import FAST_CALLBACKS
from support.webhook_harness import running_webhook, webhook_settings
from support.webhook_harness import url as webhook_url

REPO = Path(__file__).resolve().parents[2]

# A message's events, from whichever table keeps each.
_DELETE_EVENTS = (
    "DELETE FROM dlr.event_rows WHERE message_id = '{message_id}';"
    " DELETE FROM dlr.message_events WHERE message_ref IN"
    " (SELECT id FROM dlr.messages WHERE message_id = '{message_id}')"
)


def failover_acks(report: dict[str, Any]) -> tuple[int, int]:
    """From the failover scenario's note: receipts acked when the primary died, and how many
    of those were acked after the standby had been cut off; (0, -1) without the note."""
    for note in report["notes"]:
        found = re.match(r"primary killed with ([\d,]+) receipts acked, ([\d,]+) of them", note)
        if found:
            acked, while_cut = (int(group.replace(",", "")) for group in found.groups())
            return acked, while_cut
    return 0, -1


# What each scenario must visibly have done, so that a pass is not a fault that never happened.
FAULT_EVIDENCE: dict[str, Any] = {
    "daemon_kill9": lambda r: r["daemon_kills"] == 3,
    "gateway_kill9": lambda r: r["gateway_kills"] == 2 and r["reader_reconnects"] > 0,
    # The 8 s outage outlasts --release-after 5, and the readers met the release: a Subscribe
    # reader's stream closed and its receipts came back (F7), or a Pull reader kept its own.
    "postgres_outages": lambda r: (
        r["store_releases"] > 0 and r["gateway_redelivered"] + r["pulled_kept"] > 0
    ),
    "stream_cuts": lambda r: r["gateway_redelivered"] > 0,
    # A lost Ack reply is retried and answered already_gone (F9); a failed Pull reconnects.
    "unavailable_bursts": lambda r: r["gateway_already_gone"] + r["reader_reconnects"] > 0,
    # Leases ran out while commits waited on the lock. Whether the requeued receipts then reach
    # a reader before their first holder's late ack is a race the load decides, so the
    # redeliveries it gives are reported, not required.
    "slow_commit_lease": lambda r: r["gateway_lease_expired"] > 0,
    "three_process_race": lambda r: r["daemon_processes"] == 3 and r["conflicts"] > 0,
    "hostile_flood": lambda r: r["receipts"] > 600,
    # The receiver was killed mid-burst, callbacks were retried and posted twice, and the
    # callbacks the gateway saw answered 2xx are the ones it made.
    "webhook_kill9": lambda r: (
        r["daemon_kills"] == 2
        and r["gateway_callbacks_retried"] > 0
        and r["gateway_callbacks_duplicated"] > 0
        and r["callbacks"] > 0
        and r["callbacks_answered"] == r["callbacks"]
    ),
    # The primary died mid-drain (some receipts acked before, the rest only after promotion),
    # and no commit returned while the synchronous standby was cut off.
    "failover_sync": lambda r: 0 < failover_acks(r)[0] < r["receipts"] and failover_acks(r)[1] == 0,
    "relay_kill9": lambda r: any(n.startswith("relay:") and "2 kills" in n for n in r["notes"]),
}


@pytest.mark.timeout(110)
@pytest.mark.parametrize("name", [spec.name for spec in SCENARIOS])
async def test_chaos_scenario_loses_nothing_and_applies_nothing_twice(
    name: str, pg_cluster: PgCluster, database_url: str, tmp_path: Path
) -> None:
    """F5-F9, P13/P14, C1/C4/C7/C8 under faults: 0 lost, 0 double-applied, 0 acked-but-missing,
    an empty queue, and clean SIGTERM exits at the end."""
    report = await run_scenario(
        BY_NAME[name], pg_cluster, database_url, tmp_path, full=False, seed=1, drain_within_s=60
    )
    assert report["receipts"] > 0
    assert (report["lost"], report["double_applied"], report["acked_but_missing"]) == (0, 0, 0), (
        report["samples"]
    )
    assert report["queued"] == 0, "receipts left queued or leased at the gateway"
    assert report["ok"], report["failed"]
    assert FAULT_EVIDENCE[name](report), f"the fault left no trace: {report}"


async def store_through_pull(
    gateway: FakeGateway, database_url: str, bodies: list[dict[str, Any]]
) -> None:
    """Enqueue `bodies`, record their ids as sent, Pull them, ingest them and ack them (F8)."""
    await gateway.inject(LOGIN, bodies)
    store = await Store.open(database_url)
    try:
        await store.record_submissions(
            [
                Submission(login=LOGIN, message_id=mid, destination="+34600000000")
                for mid in sorted({b["id"] for b in bodies})
            ]
        )
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            feed = feed_pb2_grpc.ReceiptFeedStub(channel)
            auth = basic_auth_metadata(LOGIN, PASSWORD)
            pulled = await feed.Pull(feed_pb2.PullRequest(max=1000), metadata=auth)
            receipts = [receipt_from_proto(r, r.SerializeToString(), 0.0) for r in pulled.receipts]
            await store.ingest(LOGIN, receipts)
            await feed.Ack(
                feed_pb2.AckRequest(tokens=[r.ack_token for r in receipts]), metadata=auth
            )
    finally:
        await store.close()


async def test_checker_detects_lost_double_applied_and_acked_but_missing(
    database_url: str,
) -> None:
    """The checker can fail: tampering with a correct store shows up as each invariant."""
    async with running_gateway() as gateway:
        bodies = receipt_bodies(40, prefix="c")
        await store_through_pull(gateway, database_url, bodies)
        ledger = gateway.ledger(LOGIN)["records"]
        clean = compare(ledger, await store_rows(database_url, LOGIN))
        assert (clean["lost"], clean["double_applied"], clean["acked_but_missing"]) == (0, 0, 0)
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "UPDATE dlr.statuses AS s SET repeats = repeats + 1 FROM dlr.messages AS m"
                " WHERE m.id = s.message_ref AND m.message_id = 'c0000001'"
            )
            await conn.execute(
                "ALTER TABLE dlr.reception_rows DISABLE TRIGGER receptions_append_only"
            )
            await conn.execute(
                "DELETE FROM dlr.reception_rows"
                " WHERE event_id IN (SELECT id FROM dlr.events WHERE message_id = 'c0000002')"
            )
            await conn.execute(_DELETE_EVENTS.format(message_id="c0000003"))
        finally:
            await conn.close()
        broken = compare(ledger, await store_rows(database_url, LOGIN))
        # The CLI says the same and exits non-zero.
        cli = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "scripts" / "invariants.py"),
            "--gateway", gateway.target, "--login", LOGIN, "--password", PASSWORD,
            "--database-url", database_url, "--json",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await cli.communicate()
    assert cli.returncode == 1
    assert json.loads(out)["failed"] == ["lost", "double_applied", "acked_but_missing"]
    assert broken["lost"] == 2  # c0000003: its progress and its result
    # c0000002's two receipts, and c0000003's: their rows name their key by the events deleted,
    # so no row of the login holds them any more.
    assert broken["acked_but_missing"] == 4
    # c0000001's repeat counter; c0000002's event counters (2) and its projection (no delivery
    # left to support it); c0000003's projection.
    assert broken["double_applied"] == 5, broken["samples"]


async def test_two_long_ids_with_one_prefix_are_two_logical_events(database_url: str) -> None:
    """P14/F8: the logical key is (login, id, level); two different ids must never be one event
    — here 600-character ids that differ only after the 512th character
    (parse.storable_id keeps a digest of the raw id)."""
    prefix = "7" * 600
    bodies = [
        {"id": prefix + "a", "level": 2, "stat": "DELIVRD", "err": "000"},
        {"id": prefix + "b", "level": 2, "stat": "DELIVRD", "err": "000"},
    ]
    async with running_gateway() as gateway:
        await store_through_pull(gateway, database_url, bodies)
        report = compare(gateway.ledger(LOGIN)["records"], await store_rows(database_url, LOGIN))
    assert report["events"] == 2
    assert report["lost"] == 0, report["samples"]


async def test_checker_detects_callbacks_lost_or_answered_but_missing(database_url: str) -> None:
    """The callback path's invariants can fail too: callbacks posted to a real receiver check
    clean, then a callback answered 2xx whose reception is gone is `acked_but_missing`, and one
    whose logical event is gone is `lost`."""
    async with (
        running_webhook(webhook_settings(database_url)) as receiver,
        running_gateway(callbacks=FAST_CALLBACKS) as gateway,
    ):
        bodies = receipt_bodies(20, prefix="w")
        await gateway.inject(LOGIN, [{**b, "dlr_url": webhook_url(receiver)} for b in bodies])
        await wait_until(lambda: _delivered(gateway, len(bodies)), 30, "every callback answered")
        ledger = gateway.ledger(LOGIN)["records"]
    clean = compare(ledger, await store_rows(database_url, LOGIN))
    assert (clean["lost"], clean["double_applied"], clean["acked_but_missing"]) == (0, 0, 0)
    assert clean["callbacks"] == clean["callbacks_answered"] == len(bodies)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ALTER TABLE dlr.reception_rows DISABLE TRIGGER receptions_append_only")
        await conn.execute(
            "DELETE FROM dlr.reception_rows"
            " WHERE event_id IN (SELECT id FROM dlr.events WHERE message_id = 'w0000002')"
        )
        await conn.execute(  # its uncorrelated exceptions first: they name the events
            "DELETE FROM dlr.exceptions WHERE message_id = 'w0000003';"
            + _DELETE_EVENTS.format(message_id="w0000003")
        )
    finally:
        await conn.close()
    broken = compare(ledger, await store_rows(database_url, LOGIN))
    # w0000002's two callbacks, answered, not stored; and w0000003's, whose rows name their
    # key by the events deleted.
    assert broken["acked_but_missing"] == 4
    assert broken["lost"] == 2  # w0000003: its progress and its result


async def _delivered(gateway: FakeGateway, count: int) -> bool:
    return bool(gateway.stats(LOGIN)["callbacks_delivered"] == count)
