"""The quality report from its hourly rollup (dlr.quality_hours) against the same report counted
from the raw tables alone (`raw_quality`, the reference): the same counts, to the message, on a
generated store with late receipts, status changes, messages recorded after their receipts,
late verifications, a forgetting pass, and two refreshes at once; latencies within one bucket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest

from dlrfeed.domain.quality import Thresholds
from dlrfeed.feed.client import receipt_from_proto
from dlrfeed.store import Store, Submission, Verification
from dlrfeed.store import quality as quality_reads
from dlrfeed.store.quality import (
    COUNTS,
    GROUP_BY,
    JsonDict,
    Window,
    countries_json,
    quality,
    raw_quality,
    refresh,
)
from dlrfeed.store.retention import RetentionPolicy, forget, maintain
from dlrfeed_tools.daemon_harness import wait_until
from gateway.receipts.v1 import feed_pb2

LOGINS = ("acme", "beta")
SOURCES = ("OTP", "NEWS", None)
ROUTES = ("r1", "r2", "grey", None)
DESTINATIONS = ("+3461", "+4479", "+1416", "+7701", "0612")  # the last is not E.164
# Equal to the message; the signals too on this traffic (uniform_latency reads percentiles from
# the buckets, where equal latencies stay equal).
EQUAL_FIELDS = (
    *COUNTS,
    "final_by_status",
    "silent_countries",
    "signals",
)
# A percentile from the buckets is within half a bucket of the exact one (docs/quality.md).
HALF_BUCKET = 10**0.05


def _date(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%y%m%d%H%M%S")


def _receipt(message_id: str, level: int, stat: str, sent: datetime, done: datetime) -> Any:
    wire = feed_pb2.Receipt(
        id=message_id,
        level=level,
        stat=stat,
        err="000" if stat == "DELIVRD" else f"0{level}{len(stat)}",
        submit_date=_date(sent),
        done_date=_date(done),
        ack_token=f"t-{message_id}-{level}-{stat}",
        delivery_count=1,
    )
    return receipt_from_proto(wire, wire.SerializeToString(), time.time())


class Traffic:
    """Messages sent over the 60 hours before the current one (the deadline's cutoff falls
    among them), a few of them ahead of the clock, in the next hour (ahead of the rollup's
    frontier), their receipts and verifications, in rounds, from one seed. None is sent in
    the current hour: it may be over before the test is."""

    def __init__(self, seed: int, now: datetime) -> None:
        self.rng = random.Random(seed)
        self.now = now
        this_hour = now.replace(minute=0, second=0, microsecond=0)
        self.base = this_hour - timedelta(hours=60, minutes=self.rng.randrange(60))
        self.messages: list[tuple[Submission, datetime]] = []
        for n in range(360):
            sent = self.base + timedelta(seconds=self.rng.randrange(60 * 3600))
            login = self.rng.choice(LOGINS)
            submission = Submission(
                login,
                f"m{n}",
                f"{self.rng.choice(DESTINATIONS)}{n:07d}",
                source=self.rng.choice(SOURCES),
                submitted_at=sent,
                route=self.rng.choice(ROUTES),
            )
            self.messages.append((submission, sent))
        for n, (submission, _) in enumerate(self.messages[-6:]):
            sent = this_hour + timedelta(hours=1, minutes=10 * n)
            self.messages[n - 6] = (dataclasses.replace(submission, submitted_at=sent), sent)

    def receipts(self, share: float) -> dict[str, list[Any]]:
        """Receipts for a share of the messages, by login: progress, finals, fake DELIVRDs at
        submit time on the grey route, latencies of whole seconds."""
        by_login: dict[str, list[Any]] = {login: [] for login in LOGINS}
        for submission, sent in self.messages:
            if self.rng.random() >= share:
                continue
            key = submission.message_id
            if self.rng.random() < 0.3:
                later = sent + timedelta(seconds=self.rng.randrange(1, 30))
                by_login[submission.login].append(_receipt(key, 1, "ENROUTE", sent, later))
                continue
            if submission.route == "grey":
                done = sent
            else:
                done = sent + timedelta(seconds=self.rng.choice((0, 1, 4, 9, 10, 30, 200, 4000)))
            stat = self.rng.choice(("DELIVRD", "DELIVRD", "DELIVRD", "UNDELIV", "EXPIRED"))
            by_login[submission.login].append(_receipt(key, 2, stat, sent, done))
        return by_login

    def verifications(self, share: float) -> list[Verification]:
        return [
            Verification(
                s.login,
                s.message_id,
                self.rng.choice(("otp_confirmed", "click")),
                sent + timedelta(seconds=self.rng.randrange(-3600, 7200)),
            )
            for s, sent in self.messages
            if s.source == "OTP" and s.route != "grey" and self.rng.random() < share
        ]

    def windows(self) -> list[Window]:
        """Windows starting in the middle of an hour, or before every message; one login or all;
        pending measured from the end of the window, or from a cutoff among the messages."""
        until = datetime.now(UTC)
        middle = self.base + timedelta(hours=20, minutes=self.rng.randrange(1, 59))
        return [
            Window(since=self.base - timedelta(hours=1), until=until, now=until),
            Window(since=middle, until=until, now=until, login="acme"),
            # Ending in an hour to come: all it holds from the frontier on is counted raw.
            Window(since=self.base, until=until + timedelta(hours=2), now=until),
            Window(since=middle, until=until, now=until, deadline=timedelta(hours=30)),
            Window(since=self.base, until=middle, now=middle, deadline=timedelta(hours=5)),
            # Done at submit within 10 s, a bucket bound; signals on few messages.
            Window(
                since=self.base,
                until=until,
                now=until,
                thresholds=Thresholds(min_messages=5, same_time_seconds=10),
            ),
            # Given in a zone half an hour off UTC: the rollup's hours are UTC's.
            Window(
                since=middle.astimezone(timezone(timedelta(hours=5, minutes=30))).replace(
                    minute=0, second=0
                ),
                until=until,
                now=until,
            ),
        ]


async def _ingest(store: Store, receipts: dict[str, list[Any]]) -> None:
    for login, batch in receipts.items():
        if batch:
            await store.ingest(login, batch)


def _close(exact: float | None, from_buckets: float | None) -> bool:
    """Within half a bucket, both rounded to the millisecond."""
    if exact is None or from_buckets is None:
        return exact is from_buckets
    low, high = sorted((exact / HALF_BUCKET, exact * HALF_BUCKET))
    return low - 0.0015 <= from_buckets <= high + 0.0015


_OPEN_FROM = "(SELECT open_from FROM dlr.quality_refresh)"
_WAITING_FOR_THE_REFRESH = (
    "SELECT count(*) FROM pg_locks"
    " WHERE relation = 'dlr.quality_refresh_lock'::regclass AND NOT granted"
)
_MARKS_BEFORE_THE_FRONTIER = (
    f"SELECT count(*) FROM dlr.quality_marks WHERE sent_at IS NULL OR sent_at < {_OPEN_FROM}"
)


async def _sent_in_hours_over(conn: asyncpg.Connection) -> int:
    """The messages sent before the rollup's frontier."""
    sent = "coalesce(submitted_at, recorded_at)"
    return int(
        await conn.fetchval(f"SELECT count(*) FROM dlr.messages WHERE {sent} < {_OPEN_FROM}")
    )


async def _same_route_report(conn: asyncpg.Connection, window: Window) -> list[JsonDict]:
    """The report by route from the rollup, once asserted equal to the raw one, group by group
    and in order."""
    rolled = await quality(conn, "route", window)
    exact = await raw_quality(conn, "route", window)
    assert [{c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in rolled] == [
        {c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in exact
    ]
    return rolled


async def _fetches(conn: asyncpg.Connection, sql: str, value: int) -> bool:
    return bool(await conn.fetchval(sql) == value)


async def _same_report(conn: asyncpg.Connection, traffic: Traffic) -> int:
    """The rollup's report equals the raw one for every grouping and window; the messages
    they covered."""
    covered = 0
    for window in traffic.windows():
        for by in GROUP_BY:
            rolled = {g[by]: g for g in await quality(conn, by, window)}
            exact = {g[by]: g for g in await raw_quality(conn, by, window)}
            assert rolled.keys() == exact.keys(), (by, window)
            for key, group in exact.items():
                assert {c: rolled[key][c] for c in EQUAL_FIELDS} == {
                    c: group[c] for c in EQUAL_FIELDS
                }, (
                    by,
                    key,
                    window,
                )
                for latency in ("latency_submit_to_done_s", "latency_submit_to_received_s"):
                    for name, value in group[latency].items():
                        assert _close(value, rolled[key][latency][name]), (by, key, latency, name)
            covered += sum(g["accepted"] for g in exact.values()) if by == "route" else 0
    return covered


@pytest.mark.parametrize("seed", [3, 11])
async def test_the_rollup_counts_what_the_raw_tables_count(
    store: Store, db: asyncpg.Connection, seed: int
) -> None:
    traffic = Traffic(seed, datetime.now(UTC).replace(microsecond=0))
    submissions = [s for s, _ in traffic.messages]
    first, rest = submissions[:250], submissions[250:]
    # Receipts before and after their messages are recorded (late correlation), a refresh in
    # between, verifications before their message and late ones.
    await _ingest(store, traffic.receipts(0.3))
    await store.record_verifications(traffic.verifications(0.2))
    await store.record_submissions(first)
    assert await _same_report(db, traffic) > 0
    await _ingest(store, traffic.receipts(0.5))  # progress to finals, new finals, repeats
    await store.record_verifications(traffic.verifications(0.4))
    await store.record_submissions(rest)
    assert await _same_report(db, traffic) > 0
    await _ingest(store, traffic.receipts(0.4))
    await store.record_verifications(traffic.verifications(0.3))
    assert await _same_report(db, traffic) > 0
    # A verification of a message never recorded leaves nothing to do behind it; the marks
    # left are those ahead of the frontier, kept until it passes them.
    await store.record_verifications([Verification("acme", "never", "click", traffic.now)])
    await refresh(db)
    assert await db.fetchval(_MARKS_BEFORE_THE_FRONTIER) == 0
    # Nothing changed since: nothing to re-aggregate.
    assert await refresh(db) == 0
    rolled = await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours")
    assert rolled == await _sent_in_hours_over(db) < len(submissions)


async def test_two_refreshes_at_once_count_each_message_once(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    traffic = Traffic(5, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    await _ingest(store, traffic.receipts(0.6))
    await store.record_verifications(traffic.verifications(0.5))
    other = await asyncpg.connect(database_url)
    try:
        async with db.transaction():
            assert await refresh(db) > 0
            second = asyncio.create_task(refresh(other))
            # The second waits for the first's lock...
            for _ in range(600):
                waiting = await db.fetchval(_WAITING_FOR_THE_REFRESH)
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting == 1
        # ...then finds nothing left to do.
        assert await second == 0
    finally:
        await other.close()
    rolled = await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours")
    assert rolled == await _sent_in_hours_over(db)
    assert await _same_report(db, traffic) > 0


async def test_two_reports_at_once_both_answer_exactly(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    """Two reports waiting for a refresh that holds the lock take turns, and each takes its
    snapshot after the refreshes before it committed: both count exactly."""
    traffic = Traffic(31, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    await refresh(db)
    await _ingest(store, traffic.receipts(0.6))
    window = traffic.windows()[0]
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        async with db.transaction():
            await db.execute("LOCK TABLE dlr.quality_refresh_lock IN EXCLUSIVE MODE")
            reports = [asyncio.create_task(quality(c, "route", window)) for c in (first, second)]
            await wait_until(
                lambda: _fetches(db, _WAITING_FOR_THE_REFRESH, 2),
                60,
                "both reports to wait for the lock",
            )
        done = await asyncio.gather(*reports)
    finally:
        for conn in (first, second):
            await conn.close()
    exact = await raw_quality(db, "route", window)
    for report in done:
        assert [{c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in report] == [
            {c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in exact
        ]


async def test_forgetting_messages_leaves_the_rollup_exact(
    store: Store, db: asyncpg.Connection
) -> None:
    traffic = Traffic(7, datetime.now(UTC).replace(microsecond=0))
    submissions = [s for s, _ in traffic.messages]
    await store.record_submissions(submissions)
    await _ingest(store, traffic.receipts(0.5))
    await store.record_verifications(traffic.verifications(0.5))
    assert await _same_report(db, traffic) > 0
    await asyncio.sleep(0.01)
    cutoff = await db.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(0.01)
    # Something new for some messages after the cutoff: those are kept, the others forgotten.
    await _ingest(store, traffic.receipts(0.3))
    forgotten = await forget(db, cutoff)
    left = await db.fetchval("SELECT count(*) FROM dlr.messages")
    assert forgotten.messages > 0
    assert 0 < left < len(submissions)
    assert await _same_report(db, traffic) > 0
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == (
        await _sent_in_hours_over(db)
    )


async def test_dropping_days_of_the_change_log_loses_no_change_of_the_rollup(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    traffic = Traffic(13, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    assert await refresh(db) > 0
    # Changes the rollup has not read when `maintain` drops their day.
    await _ingest(store, traffic.receipts(0.7))
    await store.record_verifications(traffic.verifications(0.5))
    await maintain(
        database_url,
        RetentionPolicy(retention_days=30),
        now=datetime.now(UTC) + timedelta(days=40),
    )
    assert await db.fetchval("SELECT count(*) FROM dlr.status_change_rows") == 0
    assert await _same_report(db, traffic) > 0


async def test_a_read_only_server_answers_from_the_raw_tables(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    """A standby cannot bring the rollup up to date: a stale one would be wrong."""
    traffic = Traffic(17, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    await _ingest(store, traffic.receipts(0.5))
    read_only = await asyncpg.connect(
        database_url, server_settings={"default_transaction_read_only": "on"}
    )
    try:
        window = traffic.windows()[0]
        assert await quality(read_only, "route", window) == await raw_quality(db, "route", window)
    finally:
        await read_only.close()
    assert await db.fetchval("SELECT position FROM dlr.quality_refresh") is None


async def test_changes_committed_while_a_transaction_is_open_are_counted(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    """A session idle in a transaction holds the change log's horizon back: the changes
    committed above it are counted at once, and read again later."""
    traffic = Traffic(19, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    assert await refresh(db) > 0
    idle = await asyncpg.connect(database_url)
    try:
        held = idle.transaction()
        await held.start()
        await idle.fetchval("SELECT pg_current_xact_id()")
        await _ingest(store, traffic.receipts(0.7))
        window = traffic.windows()[0]
        rolled = await quality(db, "route", window)
        exact = await raw_quality(db, "route", window)
        assert sum(g["delivered"] for g in exact) > 0
        assert [{c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in rolled] == [
            {c: g[c] for c in ("route", *EQUAL_FIELDS)} for g in exact
        ]
        await held.rollback()
    finally:
        await idle.close()
    # Read again once the horizon passes them: still counted once.
    await refresh(db)
    assert await _same_report(db, traffic) > 0


async def test_a_refresh_with_another_country_map_rebuilds_the_rollup_whole(
    store: Store, db: asyncpg.Connection
) -> None:
    """Two maps are never mixed in the rollup: another map (another phonenumbers) rebuilds it."""
    traffic = Traffic(23, datetime.now(UTC).replace(microsecond=0))
    await store.record_submissions([s for s, _ in traffic.messages])
    assert await refresh(db) > 0
    spain = sum(1 for s, _ in traffic.messages if s.destination.startswith("+3461"))
    assert spain > 0
    await db.fetchval("""SELECT dlr.refresh_quality_hours('{"3461": "XX"}', NULL)""")
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == (
        await _sent_in_hours_over(db)
    )
    spain_in_hours_over = await db.fetchval(
        "SELECT count(*) FROM dlr.messages WHERE destination LIKE '+3461%'"
        f" AND coalesce(submitted_at, recorded_at) < {_OPEN_FROM}"
    )
    assert (
        await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours WHERE country = 'XX'")
        == spain_in_hours_over
    )
    assert await _same_report(db, traffic) > 0


async def test_messages_recorded_during_the_first_build_are_counted_and_never_wait(
    store: Store, database_url: str, db: asyncpg.Connection
) -> None:
    """The marks are written before the rollup exists too: a message recorded while the first
    build runs neither waits for it nor goes unread. `maintain` drops the marks of a rollup
    never built (nothing reads them), and only those."""
    traffic = Traffic(29, datetime.now(UTC).replace(microsecond=0))
    first, rest = traffic.messages[:300], traffic.messages[300:]
    await store.record_submissions([s for s, _ in first])
    await _ingest(store, traffic.receipts(0.5))
    await store.record_verifications(traffic.verifications(0.5))
    assert await db.fetchval("SELECT count(*) FROM dlr.quality_marks") > 0
    await maintain(database_url, RetentionPolicy())
    assert await db.fetchval("SELECT count(*) FROM dlr.quality_marks") == 0
    build = db.transaction()
    await build.start()
    assert await refresh(db) > 0
    async with asyncio.timeout(30):  # nothing waits for the build
        recorded = await store.record_submissions([s for s, _ in rest])
    assert recorded.recorded == len(rest)
    dropping = asyncio.create_task(maintain(database_url, RetentionPolicy()))
    await wait_until(
        lambda: _fetches(db, _WAITING_FOR_THE_REFRESH, 1), 60, "maintain to wait for the build"
    )
    await build.commit()
    await dropping  # waited for the build, then found it built: the marks stay
    assert await db.fetchval("SELECT count(*) FROM dlr.quality_marks") > 0
    await refresh(db)
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == (
        await _sent_in_hours_over(db)
    )
    assert await _same_report(db, traffic) > 0


async def test_a_recompute_that_changes_only_the_supporting_receipt_is_counted(
    store: Store, db: asyncpg.Connection
) -> None:
    """P8: a status computed again on another receipt keeps its status, finality and reason
    (no change is logged) but may move its done time: the rollup reads the message again."""
    sent = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    await store.record_submissions([Submission("acme", "m1", "+34610000001", submitted_at=sent)])
    await store.ingest(
        "acme",
        [
            _receipt("m1", 1, "DELIVRD", sent, sent),
            _receipt("m1", 2, "DELIVRD", sent, sent + timedelta(seconds=100)),
        ],
    )
    # As an older rules version left it: based on the level-1 receipt, done at submit.
    await db.execute(
        "UPDATE dlr.statuses AS s SET rules_version = 'rules-1', basis_level = 1,"
        " basis_done_at = m.submitted_at, supporting_event_id = (SELECT id FROM dlr.events"
        "   WHERE message_id = 'm1' AND level = 1)"
        " FROM dlr.messages AS m WHERE m.id = s.message_ref AND m.message_id = 'm1'"
    )
    assert await refresh(db) > 0
    window = Window(since=sent - timedelta(hours=1), until=datetime.now(UTC), now=sent)
    (before,) = await quality(db, "route", window)
    assert before["done_at_submit"] == 1
    result = await store.recompute()
    assert result.changed == 1
    assert await db.fetchval("SELECT basis_done_at FROM dlr.statuses") == sent + timedelta(
        seconds=100
    )
    (after,) = await quality(db, "route", window)
    (exact,) = await raw_quality(db, "route", window)
    assert {c: after[c] for c in EQUAL_FIELDS} == {c: exact[c] for c in EQUAL_FIELDS}
    assert after["done_at_submit"] == 0
    done = "latency_submit_to_done_s"
    assert _close(exact[done]["p50"], after[done]["p50"])


async def test_a_late_receipt_re_aggregates_only_its_messages_group_in_its_hour(
    store: Store, db: asyncpg.Connection
) -> None:
    """A receipt for a message sent hours ago rewrites the rollup rows of its message's group
    (login, source, route, country) in that hour, and no other: a group whose keys are NULL
    (no route, a destination that is not E.164) as exactly as the others."""
    now = datetime.now(UTC).replace(microsecond=0)
    hour = now.replace(minute=0, second=0) - timedelta(hours=5)
    groups = {"r1": ("r1", "+3461"), "r2": ("r2", "+4479"), "none": (None, "0612")}
    sent = {name: hour + timedelta(minutes=10 * n) for n, name in enumerate(groups, 1)}
    await store.record_submissions(
        [
            Submission(
                "acme", f"{name}-{n}", f"{prefix}{n:07d}", route=route, submitted_at=sent[name]
            )
            for name, (route, prefix) in groups.items()
            for n in range(3)
        ]
    )
    assert await refresh(db) == 1

    async def rows() -> dict[str | None, set[str]]:
        found: dict[str | None, set[str]] = {}
        for r in await db.fetch(
            "SELECT route, ctid::text AS row FROM dlr.quality_hours WHERE hour = $1", hour
        ):
            found.setdefault(r["route"], set()).add(r["row"])
        return found

    before = await rows()
    await store.ingest(
        "acme",
        [
            _receipt(f"{name}-0", 2, "DELIVRD", sent[name], sent[name] + timedelta(seconds=4))
            for name in ("r1", "none")
        ],
    )
    assert await refresh(db) == 1
    after = await rows()
    assert after["r2"] == before["r2"]  # not rewritten
    assert after["r1"].isdisjoint(before["r1"])
    assert after[None].isdisjoint(before[None])
    window = Window(since=hour, until=now, now=now)
    for by in GROUP_BY:
        rolled = await quality(db, by, window)
        exact = await raw_quality(db, by, window)
        assert [{c: g[c] for c in (by, *EQUAL_FIELDS)} for g in rolled] == [
            {c: g[c] for c in (by, *EQUAL_FIELDS)} for g in exact
        ]
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == 9
    delivered = await db.fetchval(
        "SELECT sum(messages) FROM dlr.quality_hours WHERE status = 'DELIVERED'"
    )
    assert delivered == 2


async def test_the_hours_not_over_are_counted_raw_then_rolled_up_once_over(
    store: Store, db: asyncpg.Connection
) -> None:
    """The rollup leaves out the messages sent from its frontier on, the clock when refreshed (a
    report counts them from the raw tables), and keeps their marks, the first build too; once
    the frontier passes their hour, the next refresh counts it whole, with every change it had
    meanwhile. The frontier never moves back."""
    this_hour = await db.fetchval("SELECT date_trunc('hour', clock_timestamp(), 'UTC')")
    ahead = this_hour + timedelta(hours=1)  # sent ahead of the clock, and of the frontier
    past = this_hour - timedelta(hours=2)
    await store.record_submissions(
        [
            Submission("acme", f"past-{n}", f"+3461{n:07d}", route="r1", submitted_at=past)
            for n in range(3)
        ]
        + [
            Submission("acme", f"ahead-{n}", f"+4479{n:07d}", route="r2", submitted_at=ahead)
            for n in range(4)
        ]
    )
    # The first build: the past hour; the hour ahead is left out, its marks written again.
    assert await refresh(db) == 1
    assert await db.fetchval("SELECT count(*) FROM dlr.quality_marks WHERE sent_at = $1", ahead) > 0
    await store.ingest(
        "acme", [_receipt("ahead-0", 2, "DELIVRD", ahead, ahead + timedelta(seconds=3))]
    )
    assert await refresh(db) == 0  # a change ahead of the frontier: left for when it passes
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == 3
    window = Window(since=past, until=ahead + timedelta(hours=1), now=ahead + timedelta(hours=1))

    async def same() -> None:
        assert sum(g["accepted"] for g in await _same_route_report(db, window)) == 7

    await same()
    # The frontier moves on past `ahead`: that hour is counted whole, its marks consumed.
    later = ahead + timedelta(hours=1)
    await db.execute("UPDATE dlr.quality_refresh SET open_from = $1", later)
    assert await refresh(db) == 1
    assert await db.fetchval("SELECT open_from FROM dlr.quality_refresh") == later  # not back
    assert await db.fetchval("SELECT count(*) FROM dlr.quality_marks") == 0
    assert await db.fetchval("SELECT sum(messages) FROM dlr.quality_hours") == 7
    delivered = (
        "SELECT sum(messages) FROM dlr.quality_hours WHERE hour = $1 AND status = 'DELIVERED'"
    )
    assert await db.fetchval(delivered, ahead) == 1
    await same()


async def test_the_hour_not_over_is_rolled_up_in_slices_up_to_the_frontier(
    store: Store, db: asyncpg.Connection
) -> None:
    """In the frontier's hour the rollup holds slices, each counted once: a change re-aggregates
    its message's group within its slice; a message recorded in a slice counted already counts
    that slice again, whole, within its bounds, and every other slice the rest of its minute
    overlaps (a mark holds the first send time of its statement in its minute); once the
    frontier leaves the hour, the hour is counted whole. Reports agree with the raw tables
    wherever their windows end. The frontier is given (`up_to`), in an hour ahead of the
    clock."""
    this_hour: datetime = await db.fetchval("SELECT date_trunc('hour', clock_timestamp(), 'UTC')")
    hour = this_hour + timedelta(hours=3)
    frontier = hour

    def at(minutes: float) -> datetime:
        return hour + timedelta(minutes=minutes)

    async def refresh_to(minutes: float) -> int:
        rewritten = await db.fetchval(
            "SELECT dlr.refresh_quality_hours_up_to($1::jsonb, $2)", countries_json(), at(minutes)
        )
        assert await db.fetchval("SELECT open_from FROM dlr.quality_refresh") == max(
            at(minutes), frontier
        )
        return int(rewritten)

    async def slices() -> dict[datetime, int]:
        rows = await db.fetch(
            "SELECT hour, sum(messages) AS messages FROM dlr.quality_hours GROUP BY hour"
        )
        return {r["hour"]: r["messages"] for r in rows}

    def message(minutes: float, route: str) -> Submission:
        tenths = round(minutes * 10)
        return Submission(
            "acme", f"m{tenths}", f"+3461{tenths:07d}", route=route, submitted_at=at(minutes)
        )

    async def same_reports() -> None:
        for until, now in ((at(58), at(58)), (at(25), at(25)), (at(58), at(20) + timedelta(2))):
            for since in (hour - timedelta(hours=1), at(10)):
                window = Window(since=since, until=until, now=now)
                await _same_route_report(db, window)

    await store.record_submissions(
        [message(5, "r1"), message(12, "r1"), message(15, "r1"), message(20, "r2")]
    )
    await store.record_submissions([message(40, "r1")])
    assert await refresh_to(15) == 1  # the first build: the slice [hour, 15)
    frontier = at(15)
    assert await slices() == {hour: 2}
    await same_reports()

    # A final for a message of the first slice: its group there, and the new slice [15, 30).
    await store.ingest("acme", [_receipt("m120", 2, "DELIVRD", at(12), at(12))])
    assert await refresh_to(30) == 2
    frontier = at(30)
    assert await slices() == {hour: 2, at(15): 2}
    await same_reports()
    # A refresh whose clock is behind the frontier leaves it there, and rewrites nothing; so
    # does one within 30 seconds after it (a slice spans 30 seconds at least).
    assert await refresh_to(29) == 0
    soon = at(30) + timedelta(seconds=20)
    refreshed = "SELECT dlr.refresh_quality_hours_up_to($1::jsonb, $2)"
    assert await db.fetchval(refreshed, countries_json(), soon) == 0
    assert await db.fetchval("SELECT open_from FROM dlr.quality_refresh") == at(30)

    # Recorded late, in the slice [15, 30): that slice counted again, and the new one.
    await store.record_submissions([message(17, "r2"), message(35, "r2"), message(45, "r1")])
    assert await refresh_to(45) == 2
    frontier = at(45)
    assert await slices() == {hour: 2, at(15): 3, at(30): 2}
    await same_reports()

    # Finals in two slices: each one's group counted again within the slice's own bounds.
    await store.ingest(
        "acme",
        [
            _receipt("m50", 2, "UNDELIV", at(5), at(6)),
            _receipt("m400", 2, "DELIVRD", at(40), at(41)),
        ],
    )
    assert await refresh_to(50) == 3  # and the new slice [45, 50)
    frontier = at(50)
    assert await slices() == {hour: 2, at(15): 3, at(30): 2, at(45): 1}
    await same_reports()

    # Slices bounded within a minute (52:30); then one statement recording messages on both
    # sides of that bound, late: one mark, at 52:12, and both slices counted again.
    await store.record_submissions([message(51, "r1")])
    assert await refresh_to(52.5) == 1
    await store.record_submissions([message(53, "r2")])
    frontier = at(52.5)
    assert await refresh_to(55) == 1
    frontier = at(55)
    await store.record_submissions([message(52.2, "r1"), message(52.8, "r2")])
    assert await refresh_to(57) == 2
    frontier = at(57)
    assert await slices() == {hour: 2, at(15): 3, at(30): 2, at(45): 1, at(50): 2, at(52.5): 2}
    await same_reports()

    # The frontier leaves the hour: the hour counted whole, its slices gone.
    assert await refresh_to(70) == 1
    frontier = at(70)
    assert await slices() == {hour: 12}
    delivered = "SELECT sum(messages) FROM dlr.quality_hours WHERE status = 'DELIVERED'"
    assert await db.fetchval(delivered) == 2
    await same_reports()


async def test_a_report_counts_one_snapshot_of_the_messages_committed_while_it_runs(
    store: Store, database_url: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh and the read of a report share one snapshot. A transaction committing after
    the refresh counted its slices holds a message sent before the frontier (in no slice, and
    before the raw range) and one sent after it (in the raw range): the report counts both or
    neither, never the second alone."""
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    await store.record_submissions(
        [Submission("acme", f"m{n}", f"+3461{n:07d}", submitted_at=past) for n in range(3)]
    )
    await refresh(db)
    frontier: datetime = await db.fetchval("SELECT open_from FROM dlr.quality_refresh")
    writer = await asyncpg.connect(database_url)
    late = writer.transaction()
    await late.start()
    for message_id, sent in (
        ("before", frontier - timedelta(seconds=10)),
        ("after", frontier + timedelta(minutes=10)),
    ):
        await writer.execute(
            "INSERT INTO dlr.messages (login, message_id, internal_id, destination,"
            " destination_raw, destination_is_e164, submitted_at)"
            " VALUES ('acme', $1, $1, '+34610000009', '+34610000009', true, $2)",
            message_id,
            sent,
        )
    plan = quality_reads._PLAN

    class CommitFirst:
        """The plan statement, run between the refresh and the read: the writer commits."""

        async def fetchrow(self, conn: asyncpg.Connection) -> Any:
            if writer.is_in_transaction():
                await late.commit()
            return await plan.fetchrow(conn)

    monkeypatch.setattr(quality_reads, "_PLAN", CommitFirst())
    window = Window(since=past - timedelta(hours=1), until=frontier + timedelta(hours=1), now=past)
    try:
        (during,) = await quality(db, "route", window)
        assert not writer.is_in_transaction()
    finally:
        await writer.close()
    assert during["accepted"] == 3
    (after,) = await _same_route_report(db, window)
    assert after["accepted"] == 5


async def test_a_verification_counts_within_24_hours_before_its_message_in_any_time_zone(
    store: Store, db: asyncpg.Connection
) -> None:
    """A verification counts when dated at most 24 hours before its message was sent, whatever
    the session's time zone: in Adelaide, a day before the hour 2026-10-04 16:00 UTC falls in
    the gap its clocks skip (02:30 local), which a local-time day would move past a
    verification the message's own day still counts. The rollup and the raw tables agree."""
    await db.execute("SET TimeZone TO 'Australia/Adelaide'")
    hour = datetime(2026, 10, 4, 16, tzinfo=UTC)
    sent = hour + timedelta(minutes=40)
    await store.record_submissions(
        [
            Submission("acme", f"otp-{n}", f"+3461{n:07d}", route="r1", submitted_at=sent)
            for n in range(2)
        ]
    )
    await store.record_verifications(
        [
            Verification("acme", "otp-0", "otp_confirmed", sent - timedelta(hours=23, minutes=50)),
            Verification("acme", "otp-1", "otp_confirmed", sent - timedelta(hours=24, minutes=5)),
        ]
    )
    window = Window(since=hour, until=hour + timedelta(hours=1), now=datetime.now(UTC))
    rolled = await _same_route_report(db, window)
    assert [(g["accepted"], g["verified"]) for g in rolled] == [(2, 1)]


async def test_the_deadline_is_elapsed_time_in_any_time_zone(
    store: Store, db: asyncpg.Connection
) -> None:
    """Pending means not final 48 hours after it was sent, whatever the session's time zone: in
    Adelaide, two days before 2026-10-05 16:00 UTC is 02:30 local on the day its clocks skip
    that hour, which a local-time day would move an hour later, past a message sent 47.5
    hours before."""
    await db.execute("SET TimeZone TO 'Australia/Adelaide'")
    hour = datetime(2026, 10, 3, 16, tzinfo=UTC)
    await store.record_submissions(
        [
            Submission(
                "acme",
                "young",
                "+34610000001",
                route="r1",
                submitted_at=hour + timedelta(minutes=30),
            ),
            Submission(
                "acme", "old", "+34610000002", route="r1", submitted_at=hour - timedelta(minutes=1)
            ),
        ]
    )
    now = datetime(2026, 10, 5, 16, tzinfo=UTC)
    window = Window(since=hour - timedelta(hours=1), until=hour + timedelta(hours=1), now=now)
    rolled = await _same_route_report(db, window)
    assert [(g["accepted"], g["pending"]) for g in rolled] == [(2, 1)]
