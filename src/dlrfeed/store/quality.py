"""Route quality reads (sql/quality.sql): the three facts of C6 per group, with the signals.

Read-only, like the other operator reports: `dlrfeed quality`, the `quality` section of
`dlrfeed stats` and the daemon's route gauges run it as the reader role.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
    """
    t = window.thresholds
    async with conn.transaction(readonly=True):
        await _PLAN.fetchrow(conn)
        records = await _GROUPS.fetch(
            conn,
            key=by,
            since=window.since,
            until=window.until,
            now=window.now,
            login=window.login,
            deadline=window.deadline,
            min_messages=t.min_messages,
            same_time_seconds=t.same_time_seconds,
            countries=countries_json(),
        )
    return [_group(by, r, t) for r in records]


@cache
def countries_json() -> str:
    """prefix_countries as the JSON object the statement looks prefixes up in."""
    return json.dumps(prefix_countries(), separators=(",", ":"))


def _group(by: GroupBy, r: asyncpg.Record, t: Thresholds) -> JsonDict:
    counts = {
        name: int(r[name])
        for name in (
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
    }
    to_done = list(r["to_done"]) if r["to_done"] is not None else None
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
        "latency_submit_to_received_s": _percentiles(
            list(r["to_received"]) if r["to_received"] is not None else None,
            ("p50", "p95", "p99"),
        ),
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
