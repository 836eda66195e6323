"""Read side of the store for operators: one message's story, the investigation queue, totals.

Everything here reads (only `resolve_exception` and `resolve_matching_exceptions` write, and
only the resolution columns), so the operator commands can run as the read-only role. Results
are plain JSON-ready dicts: the commands print them as tables or, with `--json`, as they are.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from dlrfeed.config import Pooler
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.migrate import ensure_current
from dlrfeed.store.server import behind_transaction_pooler, connect_options
from dlrfeed.store.sql import Query, query

JsonDict = dict[str, Any]

_LOGINS = query("logins")
_MESSAGES = query("message_rows")
_STATUS = query("status_row")
_EVENTS = query("event_rows")
_RECEPTIONS = query("reception_rows")
_MESSAGE_EXCEPTIONS = query("exception_rows_for_message")
_LIST_EXCEPTIONS = query("list_exceptions")
_RESOLVE_EXCEPTION = query("resolve_exception")
_COUNT_MATCHING = query("count_matching_exceptions")
_RESOLVE_MATCHING = query("resolve_matching_exceptions")
_STATUS_COUNTS = query("stats_status_counts")
_SUBMISSIONS = query("stats_submissions")
_RECEPTION_OUTCOMES = query("stats_reception_outcomes")
_EVENT_TOTALS = query("stats_event_totals")
_OPEN_EXCEPTIONS = query("stats_open_exceptions")
_LATENCY = query("stats_latency")
_VERIFICATIONS = query("verification_rows")


async def connect(dsn: str, pooler: Pooler = Pooler.AUTO) -> asyncpg.Connection:
    """One connection for an operator command, to a schema of exactly this code's version.

    An unreachable server is one clear line; so is a schema behind this code (run `dlrfeed
    migrate`) or ahead of it (upgrade dlrfeed), whose tables these queries may misread.
    `pooler` as for Store.open: behind a transaction pooler, no named prepared statements.
    """
    try:
        through_pooler = await behind_transaction_pooler(dsn, pooler)
        conn: asyncpg.Connection = await asyncpg.connect(dsn, **connect_options(through_pooler))
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
    try:
        await ensure_current(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


def _row(record: asyncpg.Record, json_columns: tuple[str, ...] = ()) -> JsonDict:
    row = {key: _jsonable(value) for key, value in record.items()}
    for column in json_columns:
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    return row


async def message_reports(
    conn: asyncpg.Connection, message_id: str, login: str | None
) -> list[JsonDict]:
    """Everything known of one gateway message id: one report per login that has it.

    A report holds the sent message (or None when it was never recorded — its receipts are then
    uncorrelated, P12), the computed status (P7), every logical event, every reception with our
    receive time beside the reported dates (P19), and the exceptions it opened (P20).
    """
    # One snapshot for the whole story, so its parts agree even while daemons write.
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _message_reports(conn, message_id, login)


async def _message_reports(
    conn: asyncpg.Connection, message_id: str, login: str | None
) -> list[JsonDict]:
    logins = [login] if login is not None else [r[0] for r in await _LOGINS.fetch(conn)]
    messages = {
        r["login"]: _row(r)
        for r in await _MESSAGES.fetch(conn, logins=logins, message_id=message_id)
    }
    events = [_row(r) for r in await _EVENTS.fetch(conn, logins=logins, message_id=message_id)]
    event_ids = [int(e["id"]) for e in events]
    receptions = [
        _row(r, ("payload_json",)) for r in await _RECEPTIONS.fetch(conn, event_ids=event_ids)
    ]
    exceptions = [
        _row(r, ("details",))
        for r in await _MESSAGE_EXCEPTIONS.fetch(
            conn, logins=logins, message_id=message_id, event_ids=event_ids
        )
    ]
    verifications = [
        _row(r) for r in await _VERIFICATIONS.fetch(conn, logins=logins, message_id=message_id)
    ]
    reports: list[JsonDict] = []
    # A login may know the id only through exceptions: a receipt kept as `unstorable` (C8);
    # or only through a verification recorded before its message (it waits for it).
    known_at = (
        set(messages)
        | {e["login"] for e in events}
        | {x["login"] for x in exceptions}
        | {v["login"] for v in verifications}
    )
    for each_login in sorted(known_at):
        status_record = await _STATUS.fetchrow(conn, login=each_login, message_id=message_id)
        login_events = [e for e in events if e["login"] == each_login]
        login_event_ids = {e["id"] for e in login_events}
        message = messages.get(each_login)
        status = _row(status_record) if status_record else None
        verified = [v for v in verifications if v["login"] == each_login]
        reports.append(
            {
                "login": each_login,
                "message_id": message_id,
                "facts": _three_facts(message, status, verified),
                "message": message,
                "status": status,
                "verifications": verified,
                "events": login_events,
                "receptions": [r for r in receptions if r["event_id"] in login_event_ids],
                "exceptions": [x for x in exceptions if x["login"] == each_login],
            }
        )
    return reports


def _three_facts(
    message: JsonDict | None, status: JsonDict | None, verifications: list[JsonDict]
) -> JsonDict:
    """C6: the three facts of a message side by side, never merged: accepted at submit (the
    sender's record, P3), the status the network reported (P2), independent verification."""
    return {
        "accepted_at_submit": None
        if message is None
        else {"submitted_at": message["submitted_at"], "recorded_at": message["recorded_at"]},
        "reported_by_network": None
        if status is None
        else {"status": status["status"], "is_final": status["is_final"]},
        "verified": None
        if not verifications
        else {
            "first_at": verifications[0]["verified_at"],
            "kinds": sorted({v["kind"] for v in verifications}),
        },
    }


async def list_exceptions(
    conn: asyncpg.Connection,
    *,
    kind: str | None = None,
    login: str | None = None,
    include_resolved: bool = False,
    opened_before: datetime | None = None,
    opened_after: datetime | None = None,
    limit: int = 100,
) -> list[JsonDict]:
    """The investigation queue, oldest first, filtered by kind, login and opening time."""
    records = await _LIST_EXCEPTIONS.fetch(
        conn,
        kind=kind,
        login=login,
        include_resolved=include_resolved,
        opened_before=opened_before,
        opened_after=opened_after,
        limit=limit,
    )
    return [_row(r, ("details",)) for r in records]


async def resolve_exception(conn: asyncpg.Connection, exception_id: int, note: str) -> bool:
    """Close an open exception with the operator's note; False when none open has that id."""
    try:
        return await _RESOLVE_EXCEPTION.fetchval(conn, id=exception_id, note=note) is not None
    except asyncpg.exceptions.InsufficientPrivilegeError:
        raise _may_not_resolve() from None


@dataclass(frozen=True)
class ExceptionFilter:
    """Which open exceptions a bulk resolve takes (None: no condition on that column)."""

    kind: str | None = None
    login: str | None = None
    opened_before: datetime | None = None
    opened_after: datetime | None = None

    def parameters(self) -> dict[str, Any]:
        """The filter as the parameters of the matching statements (sql/reports.sql)."""
        return dataclasses.asdict(self)


async def count_matching_exceptions(
    conn: asyncpg.Connection, where: ExceptionFilter
) -> list[JsonDict]:
    """The open exceptions `where` picks, counted by kind and login (with the oldest and the
    newest opening time): what a bulk resolve would take, changing nothing."""
    return [_row(r) for r in await _COUNT_MATCHING.fetch(conn, **where.parameters())]


async def resolve_matching_exceptions(
    conn: asyncpg.Connection, where: ExceptionFilter, note: str
) -> list[JsonDict]:
    """Resolve every open exception `where` picks with the operator's note, in one transaction;
    returns what was resolved, counted by kind and login as `count_matching_exceptions` does."""
    try:
        records = await _RESOLVE_MATCHING.fetch(conn, **where.parameters(), note=note)
    except asyncpg.exceptions.InsufficientPrivilegeError:
        raise _may_not_resolve() from None
    return [_row(r) for r in records]


def _may_not_resolve() -> FatalError:
    # docs/security.md: resolving is the dlrfeed_operator grant; readers may only read.
    return FatalError(
        "this database login may not resolve exceptions (permission denied): use a login "
        "of the dlrfeed_operator role (docs/security.md)"
    )


async def _aggregate(
    conn: asyncpg.Connection, statement: Query, login: str | None
) -> asyncpg.Record:
    """The one row an aggregate query without GROUP BY always returns."""
    record = await statement.fetchrow(conn, login=login)
    assert record is not None, "an aggregate without GROUP BY returns one row"
    return record


async def statistics(conn: asyncpg.Connection, login: str | None) -> JsonDict:
    """Totals an operator asks for first (C6 keeps the three kinds of fact apart).

    - `submitted`: what the sender recorded as accepted at submit (P3);
    - `reported_by_network`: computed statuses, which are what the network reported (P2);
    independent verification is the `quality` section `dlrfeed stats` adds
    (dlrfeed.store.quality.stats_section), never inferred from the DLRs.
    """
    submissions = await _aggregate(conn, _SUBMISSIONS, login)
    statuses = [_row(r) for r in await _STATUS_COUNTS.fetch(conn, login=login)]
    outcomes: Counter[str] = Counter()
    channels: Counter[str] = Counter()
    for r in await _RECEPTION_OUTCOMES.fetch(conn, login=login):
        outcomes[r["outcome"]] += int(r["receptions"])
        channels[r["channel"]] += int(r["receptions"])
    events = await _aggregate(conn, _EVENT_TOTALS, login)
    exceptions = {
        r["kind"]: {"open": int(r["open"]), "total": int(r["total"])}
        for r in await _OPEN_EXCEPTIONS.fetch(conn, login=login)
    }
    latency = await _aggregate(conn, _LATENCY, login)
    receptions = sum(outcomes.values())
    percentiles = latency["seconds"] or [None, None, None]

    def rate(part: int) -> float | None:
        return round(part / receptions, 6) if receptions else None

    return {
        "login": login,
        "submitted": {
            "recorded": int(submissions["recorded"]),
            "without_any_status": int(submissions["without_status"]),
        },
        "reported_by_network": {
            "final": {s["status"]: int(s["messages"]) for s in statuses if s["is_final"]},
            "progress": {s["status"]: int(s["messages"]) for s in statuses if not s["is_final"]},
        },
        "receptions": {
            "total": receptions,
            "by_outcome": dict(outcomes),
            "by_channel": dict(channels),
        },
        "events": int(events["events"]),
        "repeats": {
            "deliveries": int(events["repeated_deliveries"]),
            "rate": rate(int(events["repeated_deliveries"])),
        },
        "conflicts": {
            "deliveries": int(events["conflicting_deliveries"]),
            "open": exceptions.get("conflict", {}).get("open", 0),
        },
        "uncorrelated": {
            "receptions": outcomes.get("uncorrelated", 0),
            "rate": rate(outcomes.get("uncorrelated", 0)),
            "open": exceptions.get("uncorrelated", {}).get("open", 0),
        },
        "exceptions": exceptions,
        "dlr_latency_seconds": {
            "samples": int(latency["samples"]),
            "p50": percentiles[0],
            "p90": percentiles[1],
            "p99": percentiles[2],
        },
    }
