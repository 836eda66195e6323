"""The investigation queue: list open exceptions by kind and age, resolve one with a note."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

from dlrfeed.commands.output import print_json, table
from dlrfeed.config import add_database_url, required
from dlrfeed.errors import ConfigError
from dlrfeed.store.reports import connect, list_exceptions, resolve_exception

KINDS = ("uncorrelated", "conflict", "unrecognized", "unstorable", "malformed", "second_record")
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> timedelta:
    """'90s', '15m', '2h', '7d' → a timedelta (argparse type)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Filters (--kind, --login, --older-than, --newer-than, --all, --limit), --resolve, --json."""
    add_database_url(parser)
    parser.add_argument("--kind", choices=KINDS, help="only this kind of exception")
    parser.add_argument("--login", help="only this login")
    parser.add_argument(
        "--older-than", type=duration, metavar="AGE", help="opened at least AGE ago (e.g. 2h)"
    )
    parser.add_argument(
        "--newer-than", type=duration, metavar="AGE", help="opened at most AGE ago (e.g. 15m)"
    )
    parser.add_argument("--all", action="store_true", help="include resolved exceptions")
    parser.add_argument("--limit", type=int, default=100, help="at most this many rows")
    parser.add_argument("--resolve", type=int, metavar="ID", help="resolve exception ID")
    parser.add_argument("--note", help="why it is resolved (required with --resolve)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


async def run(args: argparse.Namespace) -> int:
    """List the queue, or resolve one item when --resolve is given."""
    database_url = required(args, "database_url")
    if args.resolve is not None and not (args.note or "").strip():
        raise ConfigError("--resolve needs --note saying why the exception is resolved")
    conn = await connect(database_url)
    try:
        if args.resolve is not None:
            done = await resolve_exception(conn, args.resolve, args.note.strip())
            if args.json:
                print_json({"resolved": done, "id": args.resolve})
            else:
                print(f"exception {args.resolve} " + ("resolved" if done else "is not open"))
            return 0 if done else 1
        now = datetime.now(UTC)
        rows = await list_exceptions(
            conn,
            kind=args.kind,
            login=args.login,
            include_resolved=args.all,
            opened_before=now - args.older_than if args.older_than else None,
            opened_after=now - args.newer_than if args.newer_than else None,
            limit=args.limit,
        )
    finally:
        await conn.close()
    if args.json:
        print_json({"exceptions": rows})
        return 0
    print(
        table(
            ["id", "kind", "login", "message_id", "opened", "resolved", "details"],
            [
                [
                    x["id"],
                    x["kind"],
                    x["login"],
                    x["message_id"],
                    x["opened_at"],
                    x["resolution"] if x["resolved_at"] else None,
                    x["details"],
                ]
                for x in rows
            ],
        )
    )
    return 0
