"""The sending side (`sql/submissions.sql`, for `Store.record_submissions`): recording sent
messages (P5), the late correlation of the receipts that were waiting for them (P19), and
second records (P12).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.rules import EMPTY_STATE, RULES_VERSION, Planner
from dlrfeed.domain.sent_records import RECORD_FIELDS, record_differences
from dlrfeed.store.correlation import LOCK_CORRELATION_IDS
from dlrfeed.store.replay import WAITING_RECEPTIONS, replay, with_retired_counts, write_as_replayed
from dlrfeed.store.rows import ExceptionRow, column_arrays, planned_exceptions, status_json
from dlrfeed.store.sql import query
from dlrfeed.store.submission import Submission, SubmissionResult
from dlrfeed.store.transactions import write_transaction

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

INSERT_MESSAGES = query("insert_messages")
RECORDED_MESSAGES = query("recorded_messages")
OPEN_SECOND_RECORDS = query("open_second_records")
IDS_WITH_WAITING_EVENTS = query("ids_with_waiting_events")
LOCK_OPEN_UNCORRELATED = query("lock_open_uncorrelated")
WRITE_LATE_CORRELATION = query("write_late_correlation")
COMMIT_WITHOUT_FLUSH_WAIT = query("commit_without_flush_wait")
# The parameters of INSERT_MESSAGES that take the columns of Submission.normalised,
# in its order.
_SUBMISSION_COLUMNS = (
    "message_ids",
    "internal_ids",
    "destinations",
    "destinations_raw",
    "destinations_e164",
    "sources",
    "routes",
    "submitted_at",
    "dlr_requested",
    "dlr_levels",
)
# Submissions per transaction: each holds its ids' correlation locks until it commits, and the
# server's shared lock table is bounded (docs/postgresql.md, "Locks").
_CHUNK = 500
# Where each of sent_records.RECORD_FIELDS sits in a row of Submission.normalised.
_RECORD_POSITIONS = (1, 3, 5, 6, 7, 8, 9)


async def record_submissions(
    conn: Connection,
    options: IntegrationOptions,
    submissions: Sequence[Submission],
) -> SubmissionResult:
    """`Store.record_submissions` on `conn`: a chunk of one login at a time, each in its own
    transaction; only the last chunk, and one whose late correlation changed statuses, waits for
    the WAL flush (sql/submissions.sql, commit_without_flush_wait)."""
    by_login: dict[str, list[Submission]] = {}
    for submission in submissions:
        by_login.setdefault(submission.login, []).append(submission)
    chunks = [
        (login, group[start : start + _CHUNK])
        for login, group in sorted(by_login.items())
        for start in range(0, len(group), _CHUNK)
    ]
    recorded = late = 0
    for number, (login, chunk) in enumerate(chunks, 1):
        async with write_transaction(conn):
            new, applied = await _record_chunk(conn, options, login, chunk)
            if number < len(chunks) and not applied:  # read at the commit
                await COMMIT_WITHOUT_FLUSH_WAIT.fetchval(conn)
        recorded += new
        late += applied
    return SubmissionResult(
        recorded=recorded,
        already_recorded=len(submissions) - recorded,
        late_correlated_events=late,
    )


async def _record_chunk(
    conn: Connection,
    options: IntegrationOptions,
    login: str,
    chunk: list[Submission],
) -> tuple[int, int]:
    """Record one chunk of `login`'s submissions in the caller's transaction: the number newly
    recorded and the number of events correlated late."""
    rows = [s.normalised(options) for s in chunk]
    ids = sorted({row[0] for row in rows})
    # The same advisory locks as ingest takes for ids it cannot correlate: whichever of us
    # comes second sees what the first committed (late correlation is never missed), and
    # two recorders of one id see each other's record.
    await LOCK_CORRELATION_IDS.fetchval(conn, login=login, ids=ids)
    first_rows: dict[str, tuple[Any, ...]] = {}
    for row in rows:
        first_rows.setdefault(row[0], row)
    firsts = list(first_rows.values())
    columns = dict(zip(_SUBMISSION_COLUMNS, column_arrays(firsts, 10), strict=True))
    new_rows = await INSERT_MESSAGES.fetch(conn, login=login, **columns)
    inserted: dict[str, datetime | None] = {r["message_id"]: r["submitted_at"] for r in new_rows}
    # P12: every record that was not inserted is compared with the one recorded.
    others = [row for row in rows if row[0] not in inserted or first_rows[row[0]] is not row]
    if others:
        await _keep_second_records(conn, login, others)
    new_ids = sorted(inserted)
    if not new_ids:
        return 0, 0
    waiting_ids = [
        r["id"] for r in await IDS_WITH_WAITING_EVENTS.fetch(conn, login=login, ids=new_ids)
    ]
    if not waiting_ids:
        return len(new_ids), 0
    replayed_receptions = await WAITING_RECEPTIONS.fetch(
        conn, login=login, correlation_ids=waiting_ids
    )
    if not replayed_receptions:
        return len(new_ids), 0
    # Late correlation: every delivery that arrived before the message was recorded,
    # replayed through the planner in its recorded arrival order (P19), from no state; the
    # deliveries retention took count as the live path counted them (P21).
    version = options.rules_version(RULES_VERSION)
    planner = Planner(options, {}, dict.fromkeys(new_ids, EMPTY_STATE), inserted)
    replay_ = replay(planner, replayed_receptions)
    for retired_id in replay_.retired_messages():
        planner.messages[retired_id] = with_retired_counts(
            planner.messages[retired_id],
            (r for r in replay_.retired.values() if r.correlation_id == retired_id),
        )
    resolutions: dict[int, str] = {}
    exceptions: list[ExceptionRow] = []
    for delivery, event_id, reception_id, (outcome, planned), _ in replay_.deliveries:
        resolutions.setdefault(
            event_id,
            f"correlated late: message {delivery.correlation_id} recorded; "
            f"rules outcome {outcome.value}",
        )
        # Only the message layer's items: the others were opened when it was stored.
        exceptions += planned_exceptions(
            (p for p in planned if p.message_level),
            delivery.message_id,
            event_id,
            reception_id or None,
        )
    kinds, message_ids, details, event_ids, reception_ids = column_arrays(exceptions, 5)
    late_events = sorted(resolutions)  # sorted: row locks always taken in one order
    to_resolve = await LOCK_OPEN_UNCORRELATED.fetch(
        conn, event_ids=late_events, resolutions=[resolutions[e] for e in late_events]
    )
    await WRITE_LATE_CORRELATION.fetchval(
        conn,
        login=login,
        rules_version=version,
        statuses=status_json(planner.messages, {r["message_id"]: r["id"] for r in new_rows}),
        exception_ids=[r["id"] for r in to_resolve],
        resolutions=[r["resolution"] for r in to_resolve],
        exception_kinds=kinds,
        exception_message_ids=message_ids,
        exception_details=details,
        exception_event_ids=event_ids,
        exception_reception_ids=reception_ids,
    )
    # P22: what was kept under other options is as these rules see it.
    late = {d.delivery.correlation_id for d in replay_.deliveries}
    await write_as_replayed(conn, login, version, planner, replay_, late)
    return len(new_ids), len(resolutions)


async def _keep_second_records(conn: Connection, login: str, others: list[tuple[Any, ...]]) -> None:
    """P12: a record of an already recorded message id that differs from it is kept as
    evidence in a `second_record` exception (once per distinct record); an identical one
    changes nothing."""
    recorded = {
        r["message_id"]: r
        for r in await RECORDED_MESSAGES.fetch(
            conn, login=login, message_ids=sorted({row[0] for row in others})
        )
    }
    found: dict[str, tuple[str, str]] = {}
    for row in others:
        second = {name: row[i] for name, i in zip(RECORD_FIELDS, _RECORD_POSITIONS, strict=True)}
        differs = record_differences(dict(recorded[row[0]]), second)
        if not differs:
            continue
        evidence = {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in second.items()
        }
        details = json.dumps(
            {
                "rule": "P12",
                "cause": "second_record",
                "differs_in": differs,
                "recorded_internal_id": recorded[row[0]]["internal_id"],
                "second_record": evidence,
            },
            ensure_ascii=False,
        )
        key = hashlib.sha256(
            json.dumps([row[0], evidence], sort_keys=True).encode("utf-8")
        ).hexdigest()
        found.setdefault(key, (row[0], details))
    if found:
        await OPEN_SECOND_RECORDS.execute(
            conn,
            login=login,
            message_ids=[v[0] for v in found.values()],
            details=[v[1] for v in found.values()],
            evidence_keys=list(found),
        )
