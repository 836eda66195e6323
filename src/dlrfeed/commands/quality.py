"""Route quality: accepted, DLR status and independent verification per route, country or err.

C6 keeps the three facts apart: what the gateway accepted at submit (the sender's record), what
the network reported (P2: DELIVRD is the network's word, not a person's), and what the sender
verified (`dlrfeed record-verifications`). Groups whose DLRs the verifications contradict are
flagged `suspicious`, with the signals that fired (docs/quality.md).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from dlrfeed.commands.exceptions import duration
from dlrfeed.commands.output import cell, print_csv, print_json, table
from dlrfeed.config import add_database_url, required
from dlrfeed.domain.quality import Thresholds
from dlrfeed.store.quality import GROUP_BY, JsonDict, Window, quality
from dlrfeed.store.reports import connect

_DEFAULTS = Thresholds()
# The columns of --csv and of the text table, after the group's key.
_COUNTS = (
    "accepted",
    "delivered",
    "failed",
    "pending",
    "verified",
    "verified_without_delivered",
    "delivered_without_verification",
)


def since(text: str) -> datetime | timedelta:
    """'7d', '24h' (that long ago) or an ISO 8601 date or time, UTC unless it says (argparse
    type)."""
    try:
        return duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration like 24h or 7d nor an ISO 8601 date or time"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--by, --since, --login, the signals' thresholds, --json or --csv."""
    add_database_url(parser)
    parser.add_argument(
        "--by", choices=GROUP_BY, default="route", help="group by route, destination country "
        "(from the E.164 destination) or the err of the final receipt (default: route)"
    )  # fmt: skip
    parser.add_argument(
        "--since", type=since, default=timedelta(days=7), metavar="WHEN",
        help="messages sent since WHEN: a duration ago (24h, 7d) or an ISO 8601 date or time "
        "(default: 7d)",
    )  # fmt: skip
    parser.add_argument("--login", help="only this login (default: all)")
    parser.add_argument(
        "--deadline", type=duration, default=timedelta(hours=48), metavar="AGE",
        help="a message without a final status this long after it was sent is pending past "
        "the deadline (default: 48h)",
    )  # fmt: skip
    parser.add_argument(
        "--min-messages", type=int, default=_DEFAULTS.min_messages, metavar="N",
        help="a signal needs at least N messages of its kind in the group "
        f"(default: {_DEFAULTS.min_messages})",
    )  # fmt: skip
    parser.add_argument(
        "--max-gap", type=float, default=_DEFAULTS.max_gap, metavar="RATE",
        help="delivered_above_verified: DELIVRD rate minus verification rate on verifiable "
        f"traffic (default: {_DEFAULTS.max_gap})",
    )  # fmt: skip
    parser.add_argument(
        "--same-time-seconds", type=float, default=_DEFAULTS.same_time_seconds, metavar="S",
        help="done_at_submit: a done time this close to the submission is the same time "
        f"(default: {_DEFAULTS.same_time_seconds})",
    )  # fmt: skip
    parser.add_argument(
        "--max-same-time-share", type=float, default=_DEFAULTS.max_same_time_share,
        metavar="RATE", help="done_at_submit: the share of DELIVERED messages done at submit "
        f"time (default: {_DEFAULTS.max_same_time_share})",
    )  # fmt: skip
    parser.add_argument(
        "--min-latency-spread", type=float, default=_DEFAULTS.min_latency_spread, metavar="S",
        help="uniform_latency: seconds between the 25th and 75th percentile of submit to done "
        f"(default: {_DEFAULTS.min_latency_spread})",
    )  # fmt: skip
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per group and line")
    output.add_argument("--csv", action="store_true", help="CSV: one line per group")


def window(args: argparse.Namespace, now: datetime) -> Window:
    """The messages and thresholds the options ask for."""
    start = now - args.since if isinstance(args.since, timedelta) else args.since
    return Window(
        since=start,
        until=now,
        now=now,
        login=args.login,
        deadline=args.deadline,
        thresholds=Thresholds(
            min_messages=args.min_messages,
            max_gap=args.max_gap,
            same_time_seconds=args.same_time_seconds,
            max_same_time_share=args.max_same_time_share,
            min_latency_spread=args.min_latency_spread,
        ),
    )


async def run(args: argparse.Namespace) -> int:
    """Print one report per group, the busiest first."""
    conn = await connect(required(args, "database_url"), args.database_pooler)
    try:
        groups = await quality(conn, args.by, window(args, datetime.now(UTC)))
    finally:
        await conn.close()
    if args.json:
        for group in groups:
            print_json(group)
    elif args.csv:
        print_csv(_csv_headers(args.by), [_csv_row(args.by, g) for g in groups])
    else:
        print(render(args.by, groups))
    return 0


_LATENCIES = (("latency_submit_to_done_s", "done"), ("latency_submit_to_received_s", "received"))


def _csv_headers(by: str) -> list[str]:
    return [
        by,
        *_COUNTS,
        "verifiable",
        *(f"{short}_p{p}_s" for _, short in _LATENCIES for p in (50, 95, 99)),
        "suspicious",
        "signals",
    ]


def _csv_row(by: str, g: JsonDict) -> list[Any]:
    return [
        g[by],
        *(g[c] for c in _COUNTS),
        g["verifiable"],
        *(g[key][f"p{p}"] for key, _ in _LATENCIES for p in (50, 95, 99)),
        g["suspicious"],
        " ".join(g["signals"]),
    ]


def render(by: str, groups: list[JsonDict]) -> str:
    """The groups as a table: the three facts side by side (C6), then the signals."""
    rows = [
        [
            g[by],
            g["accepted"],
            g["delivered"],
            g["failed"],
            g["pending"],
            g["verified"],
            g["verified_without_delivered"],
            g["delivered_without_verification"],
            _latency(g["latency_submit_to_done_s"]),
            _latency(g["latency_submit_to_received_s"]),
            " ".join(g["signals"]) or None,
        ]
        for g in groups
    ]
    headers = [
        by,
        "accepted",
        "DELIVRD",
        "failed",
        "pending",
        "verified",
        "verified, no DELIVRD",
        "DELIVRD, not verified",
        "submit->done p50/p95/p99 s",
        "submit->received p50/p95/p99 s",
        "suspicious",
    ]
    return (
        "accepted at submit | reported by the network (P2: DELIVRD is not 'read') | "
        "verified by the sender (C6)\n" + table(headers, rows)
    )


def _latency(p: dict[str, float | None]) -> str:
    return "/".join(
        cell(None if (v := p[k]) is None else round(v, 1)) for k in ("p50", "p95", "p99")
    )
