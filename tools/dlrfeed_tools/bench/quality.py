"""`dlrfeed quality` on a grown store: the report from the raw tables against the report from
the hourly rollup, and what keeping the rollup up to date costs (docs/quality.md, "Cost").

A throwaway server; a store of `--messages` messages sent over the last 7 days (10 routes, the
first a lying one: DELIVRD at submit time, never verified; half the OTP traffic verified)
written by SQL, statuses through their triggers (so the change log is written as the ingest
writes it). Figures are the server backend's CPU time (/proc), which the machine's other load
does not inflate, and the wall time. Then the ingest's receipts per second on that store,
alone and while week reports run back to back (each first bringing the rollup up to date);
the same with late finals over 48 hours written before each report; and last the first
again, on the server restarted with fsync on, as production runs it. With `--every SECONDS`,
then the ingest over rounds of twice that, alone and with a week report started every
`SECONDS`: reports at a cadence, as a script or the daemon's gauges run them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

import asyncpg

from dlrfeed.store import Store
from dlrfeed.store.migrate import migrate
from dlrfeed.store.quality import Window, quality, raw_quality, refresh
from dlrfeed_tools.bench.e2e import cpu_seconds
from dlrfeed_tools.bench.growth_traffic import Traffic, ingest_rounds
from dlrfeed_tools.pgcluster import scratch_directory, start_on_a_free_port

_T = TypeVar("_T")
_INGEST_RECEPTIONS = 100_000  # the ingest alone: about ten rounds of growth_traffic
_REPORTS_BESIDE = 2  # the ingest beside them runs as long as they do
_INGEST_ROUNDS = 4  # alone, beside; beside, alone; ... (ABBA)

# The traffic of `minutes` at the store's rate, sent in the last hour; and late finals of
# `late` messages sent within the 48 hours before.
_MESSAGES = """
INSERT INTO dlr.messages (login, message_id, internal_id, destination, destination_raw,
                          destination_is_e164, source, route, submitted_at, recorded_at)
SELECT 'acme', :prefix || g, :prefix || g, d, d, true,
       CASE WHEN abs(hashint4(g + 1)) % 3 = 0 THEN 'NEWS' ELSE 'OTP' END,
       'r' || abs(hashint4(g)) % 10, t, t
FROM generate_series(1, :count) AS g,
     LATERAL (SELECT :start::timestamptz + (g::float8 / :count) * :span::interval AS t,
                     '+' || (ARRAY[COUNTRIES])[1 + abs(hashint4(g + 2)) % 30]
                         || lpad(g::text, 8, '0') AS d) AS x
"""
# 30 destination countries, by a four-digit E.164 prefix each.
_PREFIXES = (
    "3461",
    "4479",
    "1416",
    "7701",
    "4915",
    "3362",
    "3934",
    "4475",
    "5511",
    "5255",
    "9198",
    "6281",
    "6391",
    "2348",
    "2547",
    "2771",
    "2010",
    "9053",
    "4860",
    "3161",
    "3247",
    "4176",
    "4369",
    "3519",
    "3069",
    "4072",
    "3630",
    "4670",
    "4794",
    "4540",
)
_MESSAGES = _MESSAGES.replace("COUNTRIES", ", ".join(f"'{p}'" for p in _PREFIXES))
_EVENTS = """
INSERT INTO dlr.message_events (message_ref, level, first_received_at, done_at, stat, status,
                                err, fingerprint, parser_version, rules_version)
SELECT m.id, 2, m.submitted_at + (2 + m.id % 50) * interval '1 second',
       CASE WHEN m.route = 'r0' THEN m.submitted_at
            ELSE m.submitted_at + (1 + m.id % 40) * interval '1 second' END,
       CASE WHEN m.id % 20 = 1 THEN 'UNDELIV' ELSE 'DELIVRD' END,
       CASE WHEN m.id % 20 = 1 THEN 'UNDELIVERABLE' ELSE 'DELIVERED' END,
       CASE WHEN m.id % 20 = 1 THEN '001' ELSE '000' END, 'f', 'bench', 'bench'
FROM dlr.messages AS m
WHERE m.message_id LIKE :prefix || '%' AND m.id % 25 <> 0
"""
_STATUSES = """
INSERT INTO dlr.statuses (message_ref, supporting_event_id, is_final, status, rules_version,
                          basis_err, basis_done_at, reason)
SELECT e.message_ref, e.id, true, e.status, 'bench', e.err, e.done_at, 'final: ' || e.stat
FROM dlr.message_events AS e
JOIN dlr.messages AS m ON m.id = e.message_ref
WHERE m.message_id LIKE :prefix || '%'
"""
_VERIFICATIONS = """
INSERT INTO dlr.verifications (login, message_id, kind, verified_at)
SELECT m.login, m.message_id, 'otp_confirmed', m.submitted_at + interval '40 seconds'
FROM dlr.messages AS m
WHERE m.message_id LIKE :prefix || '%' AND m.source = 'OTP' AND m.route <> 'r0' AND m.id % 2 = 0
"""
_LATE = """
INSERT INTO dlr.statuses (message_ref, supporting_event_id, is_final, status, rules_version,
                          basis_err, basis_done_at, reason)
SELECT m.id, 0, true, 'EXPIRED', 'bench', '002', now(), 'final: EXPIRED'
FROM dlr.messages AS m
WHERE coalesce(m.submitted_at, m.recorded_at) > now() - interval '48 hours'  -- its index
  AND m.submitted_at IS NOT NULL AND m.id % 25 = 0
  AND NOT EXISTS (SELECT FROM dlr.statuses AS s WHERE s.message_ref = m.id)
ORDER BY random() LIMIT :late
"""


def _sql(text: str, **values: object) -> str:
    for name, value in values.items():
        text = text.replace(f":{name}", f"'{value}'")
    return text


async def _cpu(
    conn: asyncpg.Connection, action: Callable[[], Awaitable[_T]]
) -> tuple[float, float, _T]:
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    before, started = cpu_seconds(pid), time.perf_counter()
    result = await action()
    return cpu_seconds(pid) - before, time.perf_counter() - started, result


async def _traffic(
    conn: asyncpg.Connection, prefix: str, count: int, start: datetime, span: timedelta
) -> None:
    values = {"prefix": prefix, "count": count, "start": start.isoformat(), "span": str(span)}
    await conn.execute(_sql(_MESSAGES, **values))
    await conn.execute(_sql(_EVENTS, prefix=prefix))
    await conn.execute(_sql(_STATUSES, prefix=prefix))
    await conn.execute(_sql(_VERIFICATIONS, prefix=prefix))


def _last(days: int) -> Window:
    """The messages sent in the last `days` days, pending measured from now."""
    now = datetime.now(UTC)
    return Window(since=now - timedelta(days=days), until=now, now=now)


async def run(messages: int, every: float) -> None:
    cluster = start_on_a_free_port(scratch_directory("bench-quality"))
    try:
        dsn = await cluster.create_database("bench")
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            now = datetime.now(UTC)
            started = time.perf_counter()
            await _traffic(conn, "m", messages, now - timedelta(days=7), timedelta(days=7))
            await conn.execute("VACUUM ANALYZE")
            took = time.perf_counter() - started
            print(f"store: {messages:,} messages over 7 days in {took:.0f} s")

            for days in (7, 1):
                cpu, wall, _ = await _cpu(conn, partial(raw_quality, conn, "route", _last(days)))
                print(f"raw report {days} d: backend CPU {cpu:.2f} s, wall {wall:.2f} s")
            cpu, wall, rewritten = await _cpu(conn, lambda: refresh(conn))
            print(
                f"rollup built ({rewritten} hours and slices): backend CPU {cpu:.2f} s, "
                f"wall {wall:.2f} s"
            )
            await conn.execute("ANALYZE dlr.quality_hours")
            rows = await conn.fetchval("SELECT count(*) FROM dlr.quality_hours")
            print(f"rollup rows: {rows:,}")
            for days in (7, 1):
                cpu, wall, _ = await _cpu(conn, partial(quality, conn, "route", _last(days)))
                print(f"rollup report {days} d, up to date: CPU {cpu:.2f} s, wall {wall:.2f} s")
            # Five minutes of traffic at the store's rate, and late finals over the last 48 h.
            fresh = max(1, messages * 5 // (7 * 24 * 60))
            at = datetime.now(UTC)
            await _traffic(conn, "n", fresh, at - timedelta(minutes=5), timedelta(minutes=5))
            cpu, wall, _ = await _cpu(conn, lambda: quality(conn, "route", _last(7)))
            print(
                f"rollup report 7 d after 5 min of traffic ({fresh:,} messages): "
                f"backend CPU {cpu:.2f} s, wall {wall:.2f} s"
            )
            for late in (10, 200):
                await conn.execute(_sql(_LATE, late=late))
                touched = await conn.fetchval(
                    "SELECT count(DISTINCT date_trunc('hour', submitted_at)) FROM dlr.messages m"
                    " JOIN dlr.statuses s ON s.message_ref = m.id WHERE s.status = 'EXPIRED'"
                )
                cpu, wall, _ = await _cpu(conn, lambda: quality(conn, "route", _last(7)))
                print(
                    f"rollup report 7 d after late finals in {touched} hours of the last 48: "
                    f"backend CPU {cpu:.2f} s, wall {wall:.2f} s"
                )
                await conn.execute("DELETE FROM dlr.statuses WHERE status = 'EXPIRED'")
                await refresh(conn)
            for late in (0, 200):
                await ingest_beside_reports(dsn, conn, late, seed=late)
        finally:
            await conn.close()
        # As production runs: every commit flushed, so the ingest waits on the disk too.
        cluster.fsync = True
        cluster.restart()
        conn = await asyncpg.connect(dsn)
        try:
            print("the server restarted with fsync, synchronous_commit and full_page_writes on")
            await ingest_beside_reports(dsn, conn, 0, seed=1)
            if every:
                await ingest_with_reports_every(dsn, conn, every, seed=2)
        finally:
            await conn.close()
    finally:
        cluster.destroy()


async def ingest_beside_reports(dsn: str, conn: asyncpg.Connection, late: int, seed: int) -> None:
    """Print the ingest's receipts per second on the store of `dsn` alone and while
    `_REPORTS_BESIDE` week reports run back to back on `conn` (each after `late` late finals
    over the last 48 hours, when `late`), rounds of each in ABBA order, and their ratio. The
    receipts are growth_traffic's for `seed`: another seed for each call, or the second call
    would store repeats."""

    written = 0  # late finals

    async def ingest_rate(
        store: Store, traffic: Traffic, beside: asyncio.Task[None] | None
    ) -> float:
        """Alone: `_INGEST_RECEPTIONS` receipts. Beside: whole rounds until the reports end."""
        started, stored = time.perf_counter(), 0
        while stored < _INGEST_RECEPTIONS if beside is None else not beside.done():
            stored += await ingest_rounds(store, traffic, 1)  # one round of growth_traffic
        return stored / (time.perf_counter() - started)

    async def reports() -> None:
        nonlocal written
        for _ in range(_REPORTS_BESIDE):
            if late:
                inserted = await conn.execute(_sql(_LATE, late=late))
                written += int(inserted.split()[-1])
            await quality(conn, "route", _last(7))

    alone, beside, ratios = await _alone_and_beside(dsn, seed, reports, ingest_rate)
    before = f"{written:,} late finals in all, " if late else ""
    print(
        f"ingest alone: {_spread(alone)}; beside {_REPORTS_BESIDE} week reports back to "
        f"back a round ({before}each report refreshing first): {_spread(beside)}; "
        f"{_ratio(ratios)}"
    )
    await conn.execute("DELETE FROM dlr.statuses WHERE status = 'EXPIRED'")


async def ingest_with_reports_every(
    dsn: str, conn: asyncpg.Connection, every: float, seed: int
) -> None:
    """Print the ingest's receipts per second over rounds of `2 * every` seconds, alone and
    with a week report (refreshing first) started at the round's start and `every` seconds
    later on `conn`, rounds of each in ABBA order, and their ratio; growth_traffic's receipts
    for `seed`, as in `ingest_beside_reports`."""
    seconds = 2 * every
    report_seconds: list[float] = []

    async def reports() -> None:
        started = time.perf_counter()
        for number in range(2):
            await asyncio.sleep(max(0.0, started + number * every - time.perf_counter()))
            began = time.perf_counter()
            await quality(conn, "route", _last(7))
            report_seconds.append(time.perf_counter() - began)

    async def ingest_rate(
        store: Store, traffic: Traffic, beside: asyncio.Task[None] | None
    ) -> float:
        """Whole rounds of growth_traffic for `seconds`, and until the reports have ended."""
        started, stored = time.perf_counter(), 0
        while time.perf_counter() - started < seconds or (beside is not None and not beside.done()):
            stored += await ingest_rounds(store, traffic, 1)
        return stored / (time.perf_counter() - started)

    alone, beside, ratios = await _alone_and_beside(dsn, seed, reports, ingest_rate)
    print(
        f"ingest alone: {_spread(alone)}; with a week report every {every:.0f} s (each "
        f"{statistics.median(report_seconds):.1f} s, refreshing first; rounds of "
        f"{seconds:.0f} s): {_spread(beside)}; {_ratio(ratios)}"
    )


IngestRate = Callable[[Store, Traffic, "asyncio.Task[None] | None"], Awaitable[float]]
"""The ingest's receipts per second in one round: alone (None), or beside the reports' task."""


async def _alone_and_beside(
    dsn: str, seed: int, reports: Callable[[], Awaitable[None]], ingest_rate: IngestRate
) -> tuple[list[float], list[float], list[float]]:
    """On one connection, after a warm-up, growth_traffic's receipts for `seed` (another seed
    for each call, or the second would store repeats): the ingest's rates alone, beside
    `reports`, and their ratios, in `_abba` rounds."""
    store = await Store.open(dsn, pool_size=1)
    traffic = Traffic(seed=seed)
    try:
        await ingest_rounds(store, traffic, _INGEST_RECEPTIONS // 10)  # warm-up
        rate = partial(ingest_rate, store, traffic)
        return await _abba(partial(rate, None), partial(_beside, reports, rate))
    finally:
        await store.close()


async def _beside(
    reports: Callable[[], Awaitable[None]],
    ingest_rate: Callable[[asyncio.Task[None]], Awaitable[float]],
) -> float:
    """The ingest's rate while `reports` run as a task; their error, if they failed, is raised
    (after a failed ingest they are cancelled)."""
    reporting = asyncio.ensure_future(reports())
    try:
        return await ingest_rate(reporting)
    finally:
        reporting.cancel()  # a no-op once they have ended
        with contextlib.suppress(asyncio.CancelledError):
            await reporting


async def _abba(
    alone_round: Callable[[], Awaitable[float]], beside_round: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float], list[float]]:
    """`_INGEST_ROUNDS` rounds of each, alone, beside; beside, alone; ...: the rates alone,
    beside, and the ratio of each pair."""
    alone: list[float] = []
    beside: list[float] = []
    for number in range(_INGEST_ROUNDS):
        if number % 2 == 0:
            alone.append(await alone_round())
        beside.append(await beside_round())
        if number % 2 == 1:
            alone.append(await alone_round())
    return alone, beside, [b / a for a, b in zip(alone, beside, strict=True)]


def _spread(rates: list[float]) -> str:
    return f"{statistics.median(rates):,.0f} receipts/s ({min(rates):,.0f}-{max(rates):,.0f})"


def _ratio(ratios: list[float]) -> str:
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    return f"ratio {statistics.median(ratios):.2f} (rounds: {rounds})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument(
        "--every",
        type=float,
        default=0,
        metavar="SECONDS",
        help="also measure the ingest with a week report every SECONDS (rounds of twice that)",
    )
    args = parser.parse_args()
    asyncio.run(run(args.messages, args.every))
    return 0
