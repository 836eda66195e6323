"""Read side of the store for operators: one message's story, the investigation queue, totals.

Everything here reads (only `resolve_exception` and `resolve_matching_exceptions` write, and
only the resolution columns), so the operator commands can run as the read-only role. Results
are plain JSON-ready dicts: the commands print them as tables or, with `--json`, as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from dlrfeed.config import Pooler
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.migrate import ensure_current
from dlrfeed.store.server import behind_transaction_pooler, connect_options

JsonDict = dict[str, Any]

# -- name: logins
# Every login with anything stored, for `show` without --login: a loose index scan (one probe
# per login) of each table's (login, ...) index, so it costs the number of logins, not rows.
_LOGINS = """
WITH RECURSIVE
event_logins(login) AS (
    SELECT min(login) FROM dlr.events
    UNION ALL
    SELECT (SELECT min(x.login) FROM dlr.events AS x WHERE x.login > l.login)
    FROM event_logins AS l WHERE l.login IS NOT NULL
),
message_logins(login) AS (
    SELECT min(login) FROM dlr.messages
    UNION ALL
    SELECT (SELECT min(x.login) FROM dlr.messages AS x WHERE x.login > l.login)
    FROM message_logins AS l WHERE l.login IS NOT NULL
),
exception_logins(login) AS (
    SELECT min(login) FROM dlr.exceptions
    UNION ALL
    SELECT (SELECT min(x.login) FROM dlr.exceptions AS x WHERE x.login > l.login)
    FROM exception_logins AS l WHERE l.login IS NOT NULL
)
SELECT login FROM event_logins WHERE login IS NOT NULL
UNION SELECT login FROM message_logins WHERE login IS NOT NULL
UNION SELECT login FROM exception_logins WHERE login IS NOT NULL
"""

# The queries of one message's story below take the logins as an array ($1), so that every
# lookup is an index probe per login: the tables are keyed by login first.

# -- name: message_rows
_MESSAGES = """
SELECT login, message_id, internal_id, destination, destination_raw, destination_is_e164,
       source, route, submitted_at, dlr_requested, dlr_level, recorded_at
FROM dlr.messages
WHERE login = ANY($1::text[]) AND message_id = $2
ORDER BY login
"""

# -- name: status_row
_STATUS = """
SELECT s.status, s.is_final, s.reason, s.supporting_event_id, s.repeats, s.conflicts,
       s.progress_events, s.deadline_superseded, s.rules_version, s.updated_at,
       s.supporting_reception_id, s.flags
FROM dlr.message_status AS s
WHERE s.login = $1 AND s.message_id = $2
"""

# -- name: event_rows
# Events correlate by correlation_id (the id used to find the message, P10); a receipt that
# never correlated is found by its own id. Written so that both event indexes serve it: the
# correlation index holds only ids that differ (migration 0005).
_EVENTS = """
SELECT id, login, level, stat, status, err, done_date_raw, done_at, fingerprint, flags,
       times_received, conflicting_receptions, parser_version, rules_version,
       first_received_at, last_received_at, message_id AS receipt_id
FROM dlr.events
WHERE login = ANY($1::text[])
  AND (message_id = $2 OR (correlation_id = $2 AND correlation_id <> message_id))
ORDER BY login, level, id
"""

# -- name: reception_rows
# The receptions of those events: found by the receptions' only index, (login, message_id as
# received), then kept if they belong to one of the events.
_RECEPTIONS = """
SELECT r.id, r.login, r.level, r.stat, r.err, r.submit_date_raw, r.submit_at, r.done_date_raw,
       r.done_at, r.delivery_count, r.received_at, r.outcome, r.flags, r.event_id,
       r.payload_json::text AS payload_json
FROM dlr.receptions_readable AS r
WHERE r.login = ANY($1::text[]) AND r.message_id = ANY($2::text[])
  AND r.event_id = ANY($3::bigint[])
ORDER BY r.received_at, r.id
"""

# -- name: exception_rows_for_message
_MESSAGE_EXCEPTIONS = """
SELECT id, kind, login, message_id, details::text AS details, event_id, reception_id,
       opened_at, resolved_at, resolution
FROM dlr.exceptions
WHERE login = ANY($1::text[]) AND (message_id = $2 OR event_id = ANY($3::bigint[]))
ORDER BY opened_at, id
"""

# -- name: list_exceptions
_LIST_EXCEPTIONS = """
SELECT id, kind, login, message_id, details::text AS details, event_id, reception_id,
       opened_at, resolved_at, resolution
FROM dlr.exceptions
WHERE ($1::text IS NULL OR kind = $1)
  AND ($2::text IS NULL OR login = $2)
  AND ($3 OR resolved_at IS NULL)
  AND ($4::timestamptz IS NULL OR opened_at <= $4)
  AND ($5::timestamptz IS NULL OR opened_at >= $5)
ORDER BY opened_at, id
LIMIT $6
"""

# -- name: resolve_exception
_RESOLVE_EXCEPTION = """
UPDATE dlr.exceptions SET resolved_at = now(), resolution = $2
WHERE id = $1 AND resolved_at IS NULL
RETURNING id
"""

# The open exceptions a filter picks, as `exceptions --resolve` (by filter) takes them: $1 kind,
# $2 login, $3 opened at or before, $4 opened at or after (NULL: no such condition). The list
# above, with the same filters and resolved ones left out, shows the very same rows.
_OPEN_MATCHING = """
    resolved_at IS NULL
    AND ($1::text IS NULL OR kind = $1)
    AND ($2::text IS NULL OR login = $2)
    AND ($3::timestamptz IS NULL OR opened_at <= $3)
    AND ($4::timestamptz IS NULL OR opened_at >= $4)
"""
_BY_KIND_AND_LOGIN = """
SELECT kind, login, count(*) AS exceptions, min(opened_at) AS oldest, max(opened_at) AS newest
"""

# -- name: count_matching_exceptions
_COUNT_MATCHING = f"""
{_BY_KIND_AND_LOGIN}
FROM dlr.exceptions
WHERE {_OPEN_MATCHING}
GROUP BY kind, login
ORDER BY kind, login
"""

# -- name: resolve_matching_exceptions
# One statement, so one transaction: every match is resolved with the note, or none is. A row
# resolved meanwhile by someone else (e.g. late correlation, P12) fails the re-checked
# `resolved_at IS NULL` and keeps its own resolution.
_RESOLVE_MATCHING = f"""
WITH resolved AS (
    UPDATE dlr.exceptions SET resolved_at = now(), resolution = $5
    WHERE {_OPEN_MATCHING}
    RETURNING kind, login, opened_at
)
{_BY_KIND_AND_LOGIN}
FROM resolved
GROUP BY kind, login
ORDER BY kind, login
"""

# -- name: stats_*
_STATUS_COUNTS = """
SELECT status, is_final, count(*) AS messages
FROM dlr.message_status
WHERE ($1::text IS NULL OR login = $1)
GROUP BY status, is_final
ORDER BY is_final DESC, count(*) DESC, status
"""

_SUBMISSIONS = """
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE s.message_id IS NULL) AS without_status
FROM dlr.messages AS m
LEFT JOIN dlr.message_status AS s USING (login, message_id)
WHERE ($1::text IS NULL OR m.login = $1)
"""

_RECEPTION_OUTCOMES = """
SELECT outcome, count(*) AS receptions
FROM dlr.receptions
WHERE ($1::text IS NULL OR login = $1)
GROUP BY outcome
ORDER BY outcome
"""

_EVENT_TOTALS = """
SELECT count(*) AS events,
       coalesce(sum(times_received - 1), 0)::bigint AS repeated_deliveries,
       coalesce(sum(conflicting_receptions), 0)::bigint AS conflicting_deliveries
FROM dlr.events
WHERE ($1::text IS NULL OR login = $1)
"""

_OPEN_EXCEPTIONS = """
SELECT kind, count(*) FILTER (WHERE resolved_at IS NULL) AS open, count(*) AS total
FROM dlr.exceptions
WHERE ($1::text IS NULL OR login = $1)
GROUP BY kind
ORDER BY kind
"""

# DLR latency: the reported done time of the receipt behind a final status minus the time the
# message was submitted (as recorded by the sender; P19 — reported times, never arrival).
# `basis_done_at` is that time only when plausible (NULL when absent or implausible).
_LATENCY = """
SELECT count(*) AS samples,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.basis_done_at - m.submitted_at)) AS seconds
FROM dlr.message_status AS s
JOIN dlr.messages AS m ON m.login = s.login AND m.message_id = s.message_id
WHERE s.is_final AND s.basis_done_at IS NOT NULL AND m.submitted_at IS NOT NULL
  AND ($1::text IS NULL OR s.login = $1)
"""


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
    logins = [login] if login is not None else [r[0] for r in await conn.fetch(_LOGINS)]
    messages = {r["login"]: _row(r) for r in await conn.fetch(_MESSAGES, logins, message_id)}
    events = [_row(r) for r in await conn.fetch(_EVENTS, logins, message_id)]
    event_ids = [int(e["id"]) for e in events]
    receipt_ids = sorted({str(e["receipt_id"]) for e in events})
    receptions = [
        _row(r, ("payload_json",))
        for r in await conn.fetch(_RECEPTIONS, logins, receipt_ids, event_ids)
    ]
    exceptions = [
        _row(r, ("details",))
        for r in await conn.fetch(_MESSAGE_EXCEPTIONS, logins, message_id, event_ids)
    ]
    reports: list[JsonDict] = []
    # A login may know the id only through exceptions: a receipt kept as `unstorable` (C8).
    known_at = set(messages) | {e["login"] for e in events} | {x["login"] for x in exceptions}
    for each_login in sorted(known_at):
        status_record = await conn.fetchrow(_STATUS, each_login, message_id)
        login_events = [e for e in events if e["login"] == each_login]
        login_event_ids = {e["id"] for e in login_events}
        reports.append(
            {
                "login": each_login,
                "message_id": message_id,
                "message": messages.get(each_login),
                "status": _row(status_record) if status_record else None,
                "events": login_events,
                "receptions": [r for r in receptions if r["event_id"] in login_event_ids],
                "exceptions": [x for x in exceptions if x["login"] == each_login],
            }
        )
    return reports


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
    records = await conn.fetch(
        _LIST_EXCEPTIONS, kind, login, include_resolved, opened_before, opened_after, limit
    )
    return [_row(r, ("details",)) for r in records]


async def resolve_exception(conn: asyncpg.Connection, exception_id: int, note: str) -> bool:
    """Close an open exception with the operator's note; False when none open has that id."""
    try:
        return await conn.fetchval(_RESOLVE_EXCEPTION, exception_id, note) is not None
    except asyncpg.exceptions.InsufficientPrivilegeError:
        raise _may_not_resolve() from None


@dataclass(frozen=True)
class ExceptionFilter:
    """Which open exceptions a bulk resolve takes (None: no condition on that column)."""

    kind: str | None = None
    login: str | None = None
    opened_before: datetime | None = None
    opened_after: datetime | None = None

    def parameters(self) -> tuple[str | None, str | None, datetime | None, datetime | None]:
        return (self.kind, self.login, self.opened_before, self.opened_after)


async def count_matching_exceptions(
    conn: asyncpg.Connection, where: ExceptionFilter
) -> list[JsonDict]:
    """The open exceptions `where` picks, counted by kind and login (with the oldest and the
    newest opening time): what a bulk resolve would take, changing nothing."""
    return [_row(r) for r in await conn.fetch(_COUNT_MATCHING, *where.parameters())]


async def resolve_matching_exceptions(
    conn: asyncpg.Connection, where: ExceptionFilter, note: str
) -> list[JsonDict]:
    """Resolve every open exception `where` picks with the operator's note, in one transaction;
    returns what was resolved, counted by kind and login as `count_matching_exceptions` does."""
    try:
        records = await conn.fetch(_RESOLVE_MATCHING, *where.parameters(), note)
    except asyncpg.exceptions.InsufficientPrivilegeError:
        raise _may_not_resolve() from None
    return [_row(r) for r in records]


def _may_not_resolve() -> FatalError:
    # docs/security.md: resolving is the dlrfeed_operator grant; readers may only read.
    return FatalError(
        "this database login may not resolve exceptions (permission denied): use a login "
        "of the dlrfeed_operator role (docs/security.md)"
    )


async def _aggregate(conn: asyncpg.Connection, query: str, login: str | None) -> asyncpg.Record:
    """The one row an aggregate query without GROUP BY always returns."""
    record = await conn.fetchrow(query, login)
    assert record is not None, "an aggregate without GROUP BY returns one row"
    return record


async def statistics(conn: asyncpg.Connection, login: str | None) -> JsonDict:
    """Totals an operator asks for first (C6 keeps the three kinds of fact apart).

    - `submitted`: what the sender recorded as accepted at submit (P3);
    - `reported_by_network`: computed statuses, which are what the network reported (P2);
    - `independent_verification`: dlrfeed has no such source, and says so rather than infer.
    """
    submissions = await _aggregate(conn, _SUBMISSIONS, login)
    statuses = [_row(r) for r in await conn.fetch(_STATUS_COUNTS, login)]
    outcomes = {
        r["outcome"]: int(r["receptions"]) for r in await conn.fetch(_RECEPTION_OUTCOMES, login)
    }
    events = await _aggregate(conn, _EVENT_TOTALS, login)
    exceptions = {
        r["kind"]: {"open": int(r["open"]), "total": int(r["total"])}
        for r in await conn.fetch(_OPEN_EXCEPTIONS, login)
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
        "independent_verification": None,
        "receptions": {"total": receptions, "by_outcome": outcomes},
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
