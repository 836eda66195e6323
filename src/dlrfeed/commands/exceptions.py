"""The investigation queue: list open exceptions by kind and age, resolve them with a note."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from dlrfeed.commands.output import print_csv, print_json, table
from dlrfeed.config import add_database_url, required
from dlrfeed.errors import ConfigError
from dlrfeed.store.reports import (
    ExceptionFilter,
    JsonDict,
    connect,
    count_matching_exceptions,
    list_exceptions,
    resolve_exception,
    resolve_matching_exceptions,
)

KINDS = ("uncorrelated", "conflict", "unrecognized", "unstorable", "malformed", "second_record")
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# `--resolve` given without an ID: every open exception the filters pick. Not a string, which
# argparse would pass through the option's type.
_MATCHING = object()
_LIST_COLUMNS = (
    "id",
    "kind",
    "login",
    "message_id",
    "opened_at",
    "resolved_at",
    "resolution",
    "event_id",
    "reception_id",
    "details",
)
_GROUP_COLUMNS = ("kind", "login", "exceptions", "oldest", "newest")


def duration(text: str) -> timedelta:
    """'90s', '15m', '2h', '7d' → a timedelta (argparse type)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def _exception_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an exception id")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Filters (--kind, --login, --older-than, --newer-than, --all, --limit), --resolve [ID]
    with --note (and --yes for many), --json or --csv."""
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
    parser.add_argument(
        "--resolve",
        nargs="?",
        const=_MATCHING,
        type=_exception_id,
        metavar="ID",
        help="resolve exception ID; without ID, every open exception the filters pick "
        "(shows them and changes nothing unless --yes)",
    )
    parser.add_argument("--note", help="why it is resolved (required with --resolve)")
    parser.add_argument(
        "--yes",
        action="store_true",
        help="with --resolve and filters: really resolve them (command line only)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON document")
    output.add_argument("--csv", action="store_true", help="CSV with a header line")


async def run(args: argparse.Namespace) -> int:
    """List the queue, or resolve one item (--resolve ID) or every match of the filters."""
    database_url = required(args, "database_url")
    _check_combination(args)
    now = datetime.now(UTC)
    where = ExceptionFilter(
        kind=args.kind,
        login=args.login,
        opened_before=now - args.older_than if args.older_than is not None else None,
        opened_after=now - args.newer_than if args.newer_than is not None else None,
    )
    conn = await connect(database_url, args.database_pooler)
    try:
        if args.resolve is _MATCHING:
            return await _resolve_matching(conn, args, where)
        if args.resolve is not None:
            return await _resolve_one(conn, args)
        rows = await list_exceptions(
            conn,
            kind=where.kind,
            login=where.login,
            include_resolved=args.all,
            opened_before=where.opened_before,
            opened_after=where.opened_after,
            limit=args.limit,
        )
    finally:
        await conn.close()
    _print_rows(args, rows)
    return 0


def _check_combination(args: argparse.Namespace) -> None:
    """Refuse, in one line, a --resolve that could do something else than the operator meant."""
    if args.yes and getattr(args, "_sources", {}).get("yes", "flag") != "flag":
        # A confirmation is the operator's act: DLRFEED_YES or a config file would give it
        # to every run in advance.
        raise ConfigError("--yes must be given on the command line, not by env or config file")
    if args.resolve is None:
        if args.yes:
            raise ConfigError("--yes goes with --resolve (without an ID) and filters")
        return
    if not (args.note or "").strip():
        raise ConfigError("--resolve needs --note saying why the exception is resolved")
    filters = [args.kind, args.login, args.older_than, args.newer_than]
    if args.resolve is not _MATCHING:
        if any(f is not None for f in filters) or args.all or args.yes:
            raise ConfigError(
                "--resolve ID resolves that one exception: drop the filters and --yes, or drop "
                "the ID to resolve every open exception the filters pick"
            )
        return
    if args.all:
        raise ConfigError("--resolve takes open exceptions only: drop --all")
    if all(f is None for f in filters):
        raise ConfigError(
            "--resolve without an ID needs a filter (--kind, --login, --older-than or "
            "--newer-than); --older-than 0s picks every open exception"
        )


async def _resolve_one(conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    done = await resolve_exception(conn, args.resolve, args.note.strip())
    if args.json:
        print_json({"resolved": done, "id": args.resolve})
    elif args.csv:
        print_csv(["id", "resolved"], [[args.resolve, done]])
    else:
        print(f"exception {args.resolve} " + ("resolved" if done else "is not open"))
    return 0 if done else 1


async def _resolve_matching(
    conn: asyncpg.Connection, args: argparse.Namespace, where: ExceptionFilter
) -> int:
    """Without --yes: the count, the groups and the oldest matches, nothing changed. With it:
    everything the filters pick, resolved in one transaction, and the count of what was."""
    note = args.note.strip()
    if args.yes:
        groups = await resolve_matching_exceptions(conn, where, note)
        total = sum(int(g["exceptions"]) for g in groups)
        if args.json:
            print_json({"dry_run": False, "resolved": total, "groups": groups, "note": note})
            return 0
        _say(args, f"resolved {total} open exception(s) with note {note!r}")
        _print_groups(args, groups)
        return 0
    groups = await count_matching_exceptions(conn, where)
    total = sum(int(g["exceptions"]) for g in groups)
    rows = await list_exceptions(
        conn,
        kind=where.kind,
        login=where.login,
        opened_before=where.opened_before,
        opened_after=where.opened_after,
        limit=args.limit,
    )
    if args.json:
        print_json(
            {"dry_run": True, "matched": total, "groups": groups, "exceptions": rows, "note": note}
        )
        return 0
    _say(
        args,
        f"{total} open exception(s) match; nothing changed: add --yes to resolve them "
        f"with note {note!r}"
        if total
        else "no open exception matches; nothing changed",
    )
    if args.csv:
        _print_rows(args, rows)
        return 0
    _print_groups(args, groups)
    if rows:
        shown = f"the oldest {len(rows)}" if len(rows) < total else "all of them"
        print(f"\n{shown}:")
        _print_rows(args, rows)
    return 0


def _say(args: argparse.Namespace, line: str) -> None:
    """A line for the person: on stderr under --csv, so that stdout stays one CSV table."""
    print(line, file=sys.stderr if args.csv else sys.stdout)


def _print_groups(args: argparse.Namespace, groups: list[JsonDict]) -> None:
    rows = [[g[column] for column in _GROUP_COLUMNS] for g in groups]
    if args.csv:
        print_csv(_GROUP_COLUMNS, rows)
    else:
        print(table(_GROUP_COLUMNS, rows))


def _print_rows(args: argparse.Namespace, rows: list[JsonDict]) -> None:
    if args.json:
        print_json({"exceptions": rows})
        return
    if args.csv:
        print_csv(_LIST_COLUMNS, [[x[column] for column in _LIST_COLUMNS] for x in rows])
        return
    print(
        table(
            ["id", "kind", "login", "message_id", "opened", "resolved", "details"],
            [_text_row(x) for x in rows],
        )
    )


def _text_row(x: JsonDict) -> list[Any]:
    resolution = x["resolution"] if x["resolved_at"] else None
    return [
        x["id"],
        x["kind"],
        x["login"],
        x["message_id"],
        x["opened_at"],
        resolution,
        x["details"],
    ]
