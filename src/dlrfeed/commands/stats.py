"""Totals: statuses reported by the network, repeats, conflicts, exceptions, DLR latency."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from dlrfeed.commands.exceptions import duration
from dlrfeed.commands.output import cell, print_csv, print_json, table
from dlrfeed.config import add_database_url, required
from dlrfeed.store.quality import Window, stats_section
from dlrfeed.store.reports import JsonDict, connect, statistics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--login to narrow to one login, --json or --csv."""
    add_database_url(parser)
    parser.add_argument("--login", help="only this login (default: all)")
    parser.add_argument(
        "--quality-since", type=duration, default=timedelta(days=7), metavar="AGE",
        help="the quality section covers the messages sent in the last AGE (default: 7d; "
        "`dlrfeed quality` for the thresholds and other groupings)",
    )  # fmt: skip
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON document")
    output.add_argument(
        "--csv", action="store_true", help="CSV: one line per figure (login, measure, value)"
    )


async def run(args: argparse.Namespace) -> int:
    """Print the totals."""
    conn = await connect(required(args, "database_url"), args.database_pooler)
    try:
        totals = await statistics(conn, args.login)
        now = datetime.now(UTC)
        totals["quality"] = await stats_section(
            conn, Window(since=now - args.quality_since, until=now, now=now, login=args.login)
        )
    finally:
        await conn.close()
    if args.json:
        print_json(totals)
    elif args.csv:
        login = totals["login"] or ""  # empty: every login
        print_csv(["login", "measure", "value"], [[login, m, v] for m, v in measures(totals)])
    else:
        print(render(totals))
    return 0


def measures(totals: JsonDict) -> Iterator[tuple[str, Any]]:
    """Every figure of the totals as (dotted path, value), in the JSON document's order: the
    long format a spreadsheet pivots (e.g. `reported_by_network.final.DELIVERED`, 1234)."""

    def walk(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            yield prefix, value

    for key, value in totals.items():
        if key != "login":
            yield from walk(key, value)


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.2f} %"


def render(totals: JsonDict) -> str:
    """The totals as text, keeping submit acceptance and network reports apart (C6)."""
    submitted = totals["submitted"]
    network = totals["reported_by_network"]
    latency = totals["dlr_latency_seconds"]
    lines = [
        f"login: {totals['login'] or 'all'}",
        "",
        "accepted at submit (recorded by the sender, P3):",
        f"  messages recorded {submitted['recorded']}, "
        f"of which with no receipt yet {submitted['without_any_status']}",
        "",
        "status reported by the network (P2: delivered to the handset, not read):",
        table(
            ["status", "kind", "messages"],
            [[s, "final", n] for s, n in network["final"].items()]
            + [[s, "progress", n] for s, n in network["progress"].items()],
        ),
        "",
        *_quality_lines(totals["quality"]),
        "",
        f"receptions {totals['receptions']['total']} ("
        + ", ".join(
            f"{n} by {channel}" for channel, n in sorted(totals["receptions"]["by_channel"].items())
        )
        + f"), logical events {totals['events']}",
        f"  repeats: {totals['repeats']['deliveries']} ({_percent(totals['repeats']['rate'])})",
        f"  conflicts: {totals['conflicts']['deliveries']} conflicting deliveries, "
        f"{totals['conflicts']['open']} open",
        f"  uncorrelated: {totals['uncorrelated']['receptions']} receptions "
        f"({_percent(totals['uncorrelated']['rate'])}), {totals['uncorrelated']['open']} open",
        "",
        "exceptions:",
        table(
            ["kind", "open", "total"],
            [[k, v["open"], v["total"]] for k, v in sorted(totals["exceptions"].items())],
        ),
        "",
        f"DLR latency (reported done - submitted, {latency['samples']} finals): "
        f"p50 {cell(_seconds(latency['p50']))}  p90 {cell(_seconds(latency['p90']))}  "
        f"p99 {cell(_seconds(latency['p99']))}",
    ]
    return "\n".join(lines)


def _quality_lines(quality: JsonDict) -> list[str]:
    """C6: the sender's verifications and each route's three facts, apart."""
    verifications = quality["verifications"]
    rows = [
        [
            route,
            g["accepted"],
            g["delivered"],
            g["verified"],
            g["delivered_without_verification"],
            " ".join(g["signals"]) or None,
        ]
        for route, g in quality["routes"].items()
    ]
    return [
        f"independent verification (recorded by the sender, C6): {verifications['recorded']} "
        f"verifications, {verifications['waiting_for_message']} waiting for their message",
        f"routes since {quality['since']} (dlrfeed quality for more):",
        table(
            ["route", "accepted", "DELIVRD", "verified", "DELIVRD, not verified", "suspicious"],
            rows,
        ),
    ]


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f} s"
