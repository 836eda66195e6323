"""Route quality reads (sql/quality.sql): the three facts of C6 per group, with the signals.

`dlrfeed quality`, the `quality` section of `dlrfeed stats` and the daemon's route gauges read
the hourly rollup dlr.quality_hours, which they first bring up to date
(dlr.refresh_quality_hours, run as the schema owner; only the writer may call it), and the raw
tables only for the partial first hour of their window and the messages sent from the rollup's
frontier on (docs/quality.md, "Cost"). A role that may not refresh (the reader) is answered
from the raw tables.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

import asyncpg

from dlrfeed.domain.quality import Thresholds, prefix_countries, signals, verification_gap
from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection

JsonDict = dict[str, Any]
GroupBy = Literal["route", "country", "err"]
GROUP_BY: tuple[GroupBy, ...] = ("route", "country", "err")

_PLAN = query("plan_quality")
_GROUPS = query("quality_groups")
_REFRESH = query("refresh_quality_hours")
_REFRESH_BUILT = query("refresh_built_quality_hours")
_LOCK_REFRESH = query("lock_quality_refresh")
_DROP_UNREAD_MARKS = query("drop_unread_quality_marks")
_ROLLUP_GROUPS = query("quality_rollup_groups")
_HOUR = timedelta(hours=1)
_TOTALS = query("verification_totals")


@dataclass(frozen=True, slots=True)
class Window:
    """The messages a report covers: sent in [since, until), of one login or all; `now` is when
    pending is measured from (the deadline before it)."""

    since: datetime
    until: datetime
    now: datetime
    login: str | None = None
    deadline: timedelta = timedelta(hours=48)
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def cutoff(self) -> datetime:
        """A message not final and sent before this is pending: the deadline in elapsed time,
        here, where no session's time zone makes a day of it 23 or 25 hours."""
        return self.now.astimezone(UTC) - self.deadline


def _percentiles(values: list[float] | None, names: tuple[str, ...]) -> dict[str, float | None]:
    if values is None:
        return dict.fromkeys(names)
    return {name: round(value, 3) for name, value in zip(names, values, strict=True)}


async def quality(conn: Connection, by: GroupBy, window: Window) -> list[JsonDict]:
    """One report per group of the messages sent in `window`, the busiest first.

    Each holds the group's key (under the name `by`), the counts (accepted, delivered, failed,
    pending past the deadline, verified, verified_without_delivered,
    delivered_without_verification on verifiable traffic, ...), the latencies in seconds, and
    `suspicious` with the `signals` that fired (dlrfeed.domain.quality).

    The rollup answers when `same_time_seconds` is a bucket boundary (LATENCY_BOUNDARIES: the
    default 1 s is) and the rollup can be brought up to date (not a standby, by a role that may
    refresh it); else the raw tables answer, exactly, at their cost. The refresh and the read
    share one snapshot (a repeatable-read transaction, whose first statement takes the
    refresh's lock): a message committed after the refresh counted its slice is in neither the
    rollup nor the raw range the read counts, so a read with a later snapshot would miss it.
    Refreshes take turns, so reports do, through their reads; the bulk of a refresh (the first
    build, a busy minute) is committed before, apart, and does not wait for a read.
    """
    t = window.thresholds
    same_time_bucket = _boundary_bucket(t.same_time_seconds)
    if same_time_bucket is None:
        return await raw_quality(conn, by, window)
    ranges = _raw_ranges(window)
    try:
        # Up to the window's end: a window ending now counts nothing raw, but for a refresh
        # sooner than a slice's 30 seconds.
        await refresh(conn, window.until)
        async with conn.transaction(isolation="repeatable_read"):
            await _LOCK_REFRESH.execute(conn)
            await refresh(conn, window.until)
            await _PLAN.fetchrow(conn)
            records = await _ROLLUP_GROUPS.fetch(
                conn,
                hours_from=ranges.hours_from,
                hours_to=ranges.hours_to,
                raw_from=[lo for lo, _ in ranges.raw],
                raw_to=[hi for _, hi in ranges.raw],
                until=window.until,
                same_time_bucket=same_time_bucket,
                **_group_parameters(by, window),
            )
    except (asyncpg.ReadOnlySQLTransactionError, asyncpg.InsufficientPrivilegeError):
        # A standby, a session read-only by default, or a role that may not write the rollup
        # (the reader: the caller supplies the country map): the rollup cannot be brought up
        # to date here, and a stale one would be wrong; the raw tables answer.
        return await raw_quality(conn, by, window)
    return [_group(by, r, t, _bucket_percentiles(r)) for r in records]


async def refresh(conn: Connection, up_to: datetime | None = None) -> int:
    """Bring the rollup up to date with the messages sent before `up_to` (never past the
    database's clock; the clock when None); the number of hours, or slices of the hour not
    over, holding messages it counted again."""
    rewritten = await _REFRESH.fetchval(conn, countries=countries_json(), up_to=up_to)
    return int(rewritten)


async def refresh_before_retention(conn: Connection) -> None:
    """Bring a built rollup up to date before days of the change log are dropped: the changes
    it has not read yet would be gone."""
    await _REFRESH_BUILT.fetchval(conn, countries=countries_json())


async def drop_unread_marks(conn: Connection) -> None:
    """`maintain`: with no rollup built, the marks the triggers write have no reader."""
    async with conn.transaction():
        await _LOCK_REFRESH.execute(conn)
        await _DROP_UNREAD_MARKS.execute(conn)


async def raw_quality(conn: Connection, by: GroupBy, window: Window) -> list[JsonDict]:
    """`quality` counted from the raw tables alone, with exact percentiles: for a
    `same_time_seconds` that is no bucket boundary (and the reference the rollup is tested
    against)."""
    t = window.thresholds
    async with conn.transaction(readonly=True):
        await _PLAN.fetchrow(conn)
        records = await _GROUPS.fetch(
            conn,
            since=window.since,
            until=window.until,
            same_time_seconds=t.same_time_seconds,
            **_group_parameters(by, window),
        )
    return [
        _group(
            by,
            r,
            t,
            (
                None if r["to_done"] is None else list(r["to_done"]),
                None if r["to_received"] is None else list(r["to_received"]),
            ),
        )
        for r in records
    ]


def _group_parameters(by: GroupBy, window: Window) -> dict[str, Any]:
    """What the rollup's statement and the raw one both take: the grouping, the login, the
    pending cutoff, the signals' minimum, the country map."""
    return {
        "key": by,
        "login": window.login,
        "cutoff": window.cutoff,
        "min_messages": window.thresholds.min_messages,
        "countries": countries_json(),
    }


@dataclass(frozen=True, slots=True)
class _Ranges:
    hours_from: datetime
    hours_to: datetime
    raw: list[tuple[datetime, datetime]]


def _floor_hour(moment: datetime) -> datetime:
    """The start of the rollup's hour (UTC, as dlr.quality_facts cuts them) holding `moment`."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _raw_ranges(window: Window) -> _Ranges:
    """The whole hours of the window, which the rollup answers up to its frontier
    (quality_rollup_groups, which counts the rest from the raw tables), and its partial first
    hour, which the raw tables answer."""
    start = _floor_hour(window.since)
    hours_from = start if start == window.since else start + _HOUR
    hours_to = max(_floor_hour(window.until), hours_from)
    raw = [(window.since, min(hours_from, window.until))]
    return _Ranges(hours_from, hours_to, [(lo, hi) for lo, hi in raw if lo < hi])


LATENCY_BOUNDARIES = tuple(10 ** (k / 10) for k in range(-30, 81))
"""The latency buckets' bounds in seconds (dlr.latency_bucket): ten a decade, 1 ms to 10^8 s,
each bucket a factor of 10^0.1 (26 %) wide; a percentile stands at its bucket's geometric
middle, within a factor of 10^0.05 (12 %) of the exact one (docs/quality.md)."""


def _boundary_bucket(seconds: float) -> int | None:
    """The first bucket (dlr.latency_bucket, absolute) not under `seconds`, or None when
    `seconds` is no bucket boundary."""
    if seconds <= 0:
        return None
    tenths = 10 * math.log10(seconds)
    k = round(tenths)
    if abs(tenths - k) > 1e-9 or not -30 <= k <= 80:
        return None
    return k + 32


def _bucket_value(bucket: int) -> float:
    """The latency a bucket stands for: 0, else the geometric middle of its bounds."""
    if bucket == 0:
        return 0.0
    sign = 1.0 if bucket > 0 else -1.0
    if abs(bucket) == 1:
        return sign * 0.0005
    return sign * 10 ** ((abs(bucket) - 32 + 0.5) / 10)


def _percentiles_of(
    buckets: list[int] | None, counts: list[int] | None, ps: tuple[float, ...]
) -> list[float] | None:
    """percentile_cont of the bucketed latencies: each value stands at its bucket's value."""
    if not buckets or not counts:
        return None
    cumulative: list[int] = []
    total = 0
    for count in counts:
        total += count
        cumulative.append(total)

    def at(rank: int) -> float:
        return _bucket_value(buckets[bisect_right(cumulative, rank)])

    found = []
    for p in ps:
        rank = p * (total - 1)
        low = math.floor(rank)
        found.append(at(low) + (rank - low) * (at(math.ceil(rank)) - at(low)))
    return found


def _bucket_percentiles(r: asyncpg.Record) -> tuple[list[float] | None, list[float] | None]:
    return (
        _percentiles_of(r["to_done_buckets"], r["to_done_counts"], (0.25, 0.5, 0.75, 0.95, 0.99)),
        _percentiles_of(r["to_received_buckets"], r["to_received_counts"], (0.5, 0.95, 0.99)),
    )


@cache
def countries_json() -> str:
    """prefix_countries as the JSON object the statement looks prefixes up in."""
    return json.dumps(prefix_countries(), separators=(",", ":"))


# The counts of a group, as both the rollup and the raw tables give them.
COUNTS = (
    "accepted",
    "delivered",
    "failed",
    "awaiting",
    "pending",
    "verified",
    "verified_without_delivered",
    "delivered_without_verification",
    "verifiable",
    "verifiable_delivered",
    "verifiable_verified",
    "delivered_with_done_time",
    "done_at_submit",
    "silent_delivered",
)


def _group(
    by: GroupBy,
    r: asyncpg.Record,
    t: Thresholds,
    latencies: tuple[list[float] | None, list[float] | None],
) -> JsonDict:
    counts = {name: int(r[name]) for name in COUNTS}
    to_done, to_received = latencies
    fired = signals(counts, to_done, t)
    verifiable = counts["verifiable"]
    return {
        by: r["key"],
        **counts,
        "final_by_status": json.loads(r["final_by_status"]),
        "delivered_rate_verifiable": _rate(counts["verifiable_delivered"], verifiable),
        "verified_rate_verifiable": _rate(counts["verifiable_verified"], verifiable),
        "verification_gap": None if (gap := verification_gap(counts)) is None else round(gap, 4),
        "silent_countries": list(r["silent_countries"]),
        "latency_submit_to_done_s": _percentiles(to_done, ("p25", "p50", "p75", "p95", "p99")),
        "latency_submit_to_received_s": _percentiles(to_received, ("p50", "p95", "p99")),
        "suspicious": bool(fired),
        "signals": fired,
    }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


async def verification_totals(conn: asyncpg.Connection, login: str | None) -> JsonDict:
    """Verifications recorded, and those whose message is not recorded (yet)."""
    record = await _TOTALS.fetchrow(conn, login=login)
    assert record is not None, "an aggregate without GROUP BY returns one row"
    return {
        "recorded": int(record["recorded"]),
        "waiting_for_message": int(record["waiting_for_message"]),
    }


async def stats_section(conn: asyncpg.Connection, window: Window) -> JsonDict:
    """The `quality` section of `dlrfeed stats`: verifications, and each route's three facts
    and signals over `window` (C6)."""
    routes = await quality(conn, "route", window)
    return {
        "since": window.since.isoformat(),
        "verifications": await verification_totals(conn, window.login),
        "routes": {
            route_name(g["route"]): {
                key: g[key]
                for key in (
                    "accepted",
                    "delivered",
                    "failed",
                    "pending",
                    "verified",
                    "verified_without_delivered",
                    "delivered_without_verification",
                    "suspicious",
                    "signals",
                )
            }
            for g in routes
        },
        "suspicious_routes": [route_name(g["route"]) for g in routes if g["suspicious"]],
    }


NO_ROUTE = "(none)"
"""How a message recorded without a route is named where a name is needed (stats, metrics)."""


def route_name(route: str | None) -> str:
    """A route's name, NO_ROUTE for none."""
    return NO_ROUTE if route is None else route
