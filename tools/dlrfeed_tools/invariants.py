"""The ledger-vs-store invariant checker: what fakegw handed out and had acked, against PostgreSQL.

fakegw's ledger records every receipt it enqueued and every successful ack, and for a receipt
meant for a `dlr_url` (F2) every callback it made and every one the receiver answered 2xx
(docs/fakegw.md). The store keeps every delivery raw in `dlr.receptions` (the serialized
receipt with its ack token, or the callback's body as posted) and the logical events,
projections and exceptions beside it. Both paths are checked alike. The checker proves:

- **lost** — an enqueued or called-back (login, id, level) with no logical event and no C8
  `unstorable` evidence (F5, F8, C4, C8);
- **double-applied** — a `message_status` row that differs from the independent reference
  (`dlrfeed_tools.oracle`, the rule table of docs/rules.md) over the message's stored
  deliveries in
  their recorded arrival order, or an event whose delivery counters differ from the
  deliveries actually stored (P13, P14, C1);
- **acked-but-missing** — a receipt the gateway removed on an Ack whose token is in no stored
  reception and no `unstorable` evidence (F8, C7), or a callback the receiver answered 2xx
  whose body is in no stored reception and no evidence (2xx only after the commit);
- **queued** — receipts still waiting or leased at the gateway, or callbacks it has not yet
  had answered 2xx (the queue must end empty);
- **drain time** — how long the queue took to empty, when asked to wait for it.

    python scripts/invariants.py --gateway H:P --login L --password P --database-url URL
                                 [--wait-drain SECONDS] [--json]

Exit status 0 when every invariant holds, 1 when one fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import asyncpg
import grpc

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import fingerprint
from dlrfeed_tools.oracle import Expected, Sent, expect
from fakegw.admin_client import AdminClient, JsonObject
from fakegw.callbacks import webhook_body
from gateway.receipts.v1 import feed_pb2

SAMPLE = 5
"""How many offending keys each failed invariant names in the report."""

INVARIANTS = ("lost", "double_applied", "acked_but_missing", "queued")
"""The counts that must all be zero for the check to pass."""


async def read_ledger(admin: AdminClient, page: int = 5_000) -> list[JsonObject]:
    """Every ledger record of the admin client's login, page after page.

    A page holding very large receipts (a 1 MB `text`) can exceed the client's 4 MB receive
    limit (RESOURCE_EXHAUSTED); the page is then read again in halves, down to one record.
    """
    records: list[JsonObject] = []
    after = 0
    limit = page
    while True:
        try:
            response = await admin.ledger(after, limit)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                limit = max(1, limit // 2)
                continue
            raise
        records.extend(response["records"])
        if response["next"] == after:
            return records
        after = response["next"]
        limit = page


async def wait_for_drain(admin: AdminClient, within_s: float) -> tuple[JsonObject, float | None]:
    """Poll the gateway's stats until nothing is queued, leased or waiting to be called back;
    (stats, seconds or None)."""
    started = time.monotonic()
    while True:
        stats = await admin.stats()
        if stats["queued"] == 0 and stats["in_flight"] == 0 and stats["callbacks_pending"] == 0:
            return stats, time.monotonic() - started
        if time.monotonic() - started >= within_s:
            return stats, None
        await asyncio.sleep(0.1)


def _token_of(raw: bytes) -> str | None:
    try:
        return feed_pb2.Receipt.FromString(raw).ack_token
    except Exception:  # noqa: BLE001  # evidence is arbitrary bytes; unparsable = no token
        return None


def _posted_receipt(body: bytes) -> feed_pb2.Receipt:
    """A callback's body (the gateway's webhook JSON, F4) as the Receipt it stands for."""
    message = feed_pb2.Receipt()
    for key, value in json.loads(body).items():
        setattr(message, key, value)
    return message


def _delivery_fingerprint(message: feed_pb2.Receipt) -> str:
    """P14: the fingerprint of one stored delivery, from its raw payload (never truncated)."""
    has = message.HasField
    return fingerprint(
        message.stat,
        message.err if has("err") else None,
        message.done_date if has("done_date") else None,
    )


def _ledger_key(record: Mapping[str, Any]) -> tuple[str, int]:
    return str(record["receipt"].get("id", "")), int(record["receipt"].get("level", 0))


def _projection(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        row["status"],
        row["is_final"],
        row["repeats"],
        row["conflicts"],
        row["progress_events"],
        row["deadline_superseded"],
        row["supporting_reception_id"],
        sorted(row["flags"]),
    )


def _expected_projection(expected: Expected, reception_ids: Sequence[int]) -> tuple[Any, ...]:
    return (
        expected.status,
        expected.is_final,
        expected.repeats,
        expected.conflicts,
        expected.progress_events,
        expected.superseded,
        None if expected.basis is None else reception_ids[expected.basis],
        sorted(expected.flags),
    )


async def store_rows(database_url: str, login: str) -> dict[str, list[asyncpg.Record]]:
    """The rows of `login` that `compare` reads, from one consistent snapshot."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            return {
                "receptions": await conn.fetch(
                    "SELECT id, event_id, delivery_count, outcome, payload, done_at,"
                    " received_at, channel::text AS channel"
                    " FROM dlr.receptions_readable WHERE login = $1 ORDER BY id",
                    login,
                ),
                "events": await conn.fetch(
                    "SELECT id, message_id, coalesce(correlation_id, message_id) AS correlation_id,"
                    " level, fingerprint, coalesce(updates, '{}') AS updates,"
                    " times_received, conflicting_receptions"
                    " FROM dlr.events WHERE login = $1",
                    login,
                ),
                "statuses": await conn.fetch(
                    "SELECT message_id, status, is_final, repeats, conflicts, progress_events,"
                    " deadline_superseded, supporting_reception_id, flags"
                    " FROM dlr.message_status WHERE login = $1",
                    login,
                ),
                "messages": await conn.fetch(
                    "SELECT message_id, submitted_at FROM dlr.messages WHERE login = $1",
                    login,
                ),
                "unstorable": await conn.fetch(
                    "SELECT evidence FROM dlr.exceptions WHERE kind = 'unstorable' AND login = $1",
                    login,
                ),
                "conflicts": await conn.fetch(
                    "SELECT count(*) AS n FROM dlr.exceptions WHERE kind = 'conflict'"
                    " AND login = $1",
                    login,
                ),
            }
    finally:
        await conn.close()


def compare(
    ledger: Iterable[Mapping[str, Any]],
    rows: Mapping[str, Sequence[Any]],
    options: IntegrationOptions | None = None,
) -> dict[str, Any]:
    """The invariants over one login's ledger records and store rows (pure; see the module doc).

    Returns counts (`receipts`, `acks`, `receptions`, `redeliveries`, `repeats`, `conflicts`,
    `unstorable`, `lost`, `double_applied`, `acked_but_missing`, ...) and a sample of offenders.
    """
    options = options or IntegrationOptions()
    enqueued = [r for r in ledger if r["kind"] == "enqueue"]
    acked = {str(r["token"]) for r in ledger if r["kind"] == "ack"}
    called_back = [r for r in ledger if r["kind"] == "callback"]
    answered = {r["token"]: r for r in ledger if r["kind"] == "callback_answered"}
    posted_bodies: set[bytes] = set()

    stored_tokens: set[str] = set()
    fingerprints: dict[int, list[str]] = defaultdict(list)
    deliveries: dict[int, list[tuple[int, Sent]]] = defaultdict(list)  # event id -> arrivals
    creators: dict[int, tuple[str, int]] = {}  # event id -> raw (id, level) that created it
    same_delivery: Counter[tuple[str, int]] = Counter()
    redeliveries = 0
    outcomes: Counter[str] = Counter()
    for row in rows["receptions"]:
        payload = bytes(row["payload"])
        if row["channel"] == "webhook":
            posted_bodies.add(payload)
            message = _posted_receipt(payload)
        else:
            message = feed_pb2.Receipt.FromString(payload)
            stored_tokens.add(message.ack_token)
            same_delivery[(message.ack_token, int(row["delivery_count"]))] += 1
            redeliveries += int(row["delivery_count"]) > 1
        outcomes[row["outcome"]] += 1
        fingerprints[row["event_id"]].append(_delivery_fingerprint(message))
        has = message.HasField
        # The raw content from the payload (never cut); the parsed done time as stored.
        arrival = Sent(
            message.id,
            message.level,
            message.stat,
            message.err if has("err") else None,
            row["done_at"],
            message.done_date if has("done_date") else None,
            row["received_at"].timestamp(),
        )
        deliveries[row["event_id"]].append((row["id"], arrival))
        creators.setdefault(row["event_id"], (message.id, message.level))
    unstorable_tokens = {
        token
        for row in rows["unstorable"]
        if row["evidence"] is not None
        for token in [_token_of(bytes(row["evidence"]))]
        if token is not None
    }

    # Lost: every enqueued (id, level), compared raw, must have created a logical event of its
    # own, or be C8 evidence of that very receipt. Raw, not the storable form: two ids that
    # truncation (docs/rules.md, ids cut to 512 characters) maps to one key are one event, and
    # the second id has none of its own.
    event_keys = {
        creators.get(row["id"], (row["message_id"], int(row["level"]))) for row in rows["events"]
    }
    lost: list[str] = []
    for record in enqueued:
        key = _ledger_key(record)
        if key not in event_keys and str(record["token"]) not in unstorable_tokens:
            lost.append(f"{key[0][:40]!r}/{key[1]}")
    evidence = {bytes(row["evidence"]) for row in rows["unstorable"] if row["evidence"]}
    for record in called_back:
        key = _ledger_key(record)
        if key not in event_keys and webhook_body(record["receipt"]) not in evidence:
            lost.append(f"{key[0][:40]!r}/{key[1]} (callback)")

    acked_missing = sorted(acked - stored_tokens - unstorable_tokens)
    acked_missing += sorted(
        f"callback {key}"
        for key, record in answered.items()
        if webhook_body(record["receipt"]) not in posted_bodies | evidence
    )
    # With an empty queue every enqueued receipt was acked, unless retention or the cap
    # removed it (F15, F16): reported, not an invariant of the daemon.
    never_acked = {str(r["token"]) for r in enqueued} - acked

    # Double-applied: counters against stored deliveries, projections against the reference
    # over each message's deliveries in their recorded arrival order (reception ids, P19).
    by_message: dict[str, list[tuple[int, Sent]]] = defaultdict(list)
    double: list[str] = []
    for row in rows["events"]:
        by_message[row["correlation_id"]] += deliveries.get(row["id"], [])
        delivered = fingerprints.get(row["id"], [])
        accepted = {row["fingerprint"], *row["updates"]}
        # P14: each conflicting content conflicts once; its redeliveries are repeats.
        conflicting = len({fp for fp in delivered if fp not in accepted})
        same = len(delivered) - conflicting
        counted = (row["times_received"], row["conflicting_receptions"])
        if (same, conflicting) != counted:
            double.append(
                f"event {row['id']} counters {counted[0]}+{counted[1]}"
                f" vs {same}+{conflicting} stored"
            )
    submitted = {row["message_id"]: row["submitted_at"] for row in rows["messages"]}
    for row in rows["statuses"]:
        arrivals = sorted(by_message.get(row["message_id"], []), key=lambda pair: pair[0])
        expected = expect(
            [sent for _, sent in arrivals],
            submitted_at=submitted.get(row["message_id"]),
            superseding=options.deadline_unknown_superseded,
        )
        actual = _projection(row)
        wanted = _expected_projection(expected, [reception_id for reception_id, _ in arrivals])
        if wanted != actual:
            double.append(f"{row['message_id'][:40]!r}: store {actual} reference {wanted}")

    report: dict[str, Any] = {
        "receipts": len(enqueued) + len(called_back),
        "callbacks": len(called_back),
        "callbacks_answered": len(answered),
        "distinct_keys": len({_ledger_key(r) for r in (*enqueued, *called_back)}),
        "acks": len(acked),
        "receptions": len(rows["receptions"]),
        "redeliveries": redeliveries,
        "repeats": outcomes.get("repeat", 0),
        "conflicts": int(rows["conflicts"][0]["n"]) if rows["conflicts"] else 0,
        "unstorable": len(rows["unstorable"]),
        "events": len(rows["events"]),
        "statuses": len(rows["statuses"]),
        "enqueued_never_acked": len(never_acked),
        "same_delivery_stored_twice": sum(n - 1 for n in same_delivery.values() if n > 1),
        "lost": len(lost),
        "double_applied": len(double),
        "acked_but_missing": len(acked_missing),
        "samples": {
            "lost": lost[:SAMPLE],
            "double_applied": double[:SAMPLE],
            "acked_but_missing": acked_missing[:SAMPLE],
        },
    }
    return report


async def check(
    gateway: str,
    login: str,
    password: str | None,
    database_url: str,
    *,
    wait_drain_s: float = 0.0,
    options: IntegrationOptions | None = None,
) -> dict[str, Any]:
    """Read fakegw's ledger and stats and the store of `login`; the invariant report.

    With `wait_drain_s > 0` it first waits up to that long for the gateway's queue to empty and
    reports the time as `drain_seconds` (None if it did not). `ok` is True when `lost`,
    `double_applied`, `acked_but_missing` and `queued` (waiting + leased) are all zero.
    """
    async with AdminClient(gateway, login, password) as admin:
        stats, drain = await wait_for_drain(admin, wait_drain_s)
        ledger = await read_ledger(admin)
    rows = await store_rows(database_url, login)
    report = compare(ledger, rows, options)
    # What the gateway still holds: waiting, leased, or callbacks not yet answered 2xx.
    report["queued"] = (
        int(stats["queued"]) + int(stats["in_flight"]) + int(stats["callbacks_pending"])
    )
    report["gateway_callbacks_retried"] = int(stats["callbacks_retried"])
    report["gateway_callbacks_duplicated"] = int(stats["callbacks_duplicated"])
    report["gateway_callbacks_given_up"] = int(stats["callbacks_failed"]) + int(
        stats["callbacks_refused"]
    )
    report["gateway_redelivered"] = int(stats["redelivered"])
    report["gateway_already_gone"] = int(stats["already_gone"])
    report["gateway_lease_expired"] = int(stats["lease_expired"])
    report["drain_seconds"] = None if drain is None else round(drain, 2)
    report["failed"] = [name for name in INVARIANTS if report[name]]
    report["ok"] = not report["failed"]
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: print the report (one JSON object with --json) and exit 1 if an invariant fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", required=True, metavar="HOST:PORT")
    parser.add_argument("--login", required=True)
    parser.add_argument("--password", help="omit to use fakegw's loopback admin login")
    parser.add_argument("--database-url", required=True)
    parser.add_argument(
        "--wait-drain", type=float, default=0.0, metavar="S", help="wait up to S s for the queue"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    report = asyncio.run(
        check(
            args.gateway,
            args.login,
            args.password,
            args.database_url,
            wait_drain_s=args.wait_drain,
        )
    )
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for name, value in report.items():
            print(f"{name:28} {value}")
        print("OK" if report["ok"] else f"FAILED: {', '.join(report['failed'])}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
