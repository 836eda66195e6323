"""Print the status-change log: every change of a message's computed status, in order."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

import asyncpg

from dlrfeed.commands.output import cell
from dlrfeed.config import (
    add_database_url,
    non_negative_int,
    positive_float,
    positive_int,
    required,
)
from dlrfeed.daemon.logsetup import configure_logging
from dlrfeed.errors import ConfigError
from dlrfeed.store.changes import (
    FollowTiming,
    StatusChange,
    follow_changes,
    load_cursor,
    read_changes,
    save_cursor,
)
from dlrfeed.store.reports import connect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--after, --follow, --limit, --json, --consumer, --poll-interval."""
    add_database_url(parser)
    parser.add_argument(
        "--after",
        type=non_negative_int,
        metavar="POSITION",
        help="print changes after this position (default: the consumer's cursor, else 0)",
    )
    parser.add_argument(
        "--follow", action="store_true", help="keep printing new changes as they commit"
    )
    parser.add_argument(
        "--limit", type=positive_int, metavar="N", help="print at most N changes, then exit"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--consumer",
        metavar="NAME",
        help="a durable cursor: start after NAME's position, move it past each printed line",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_float,
        default=0.1,
        metavar="SECONDS",
        help="with --follow where LISTEN is unavailable (a transaction pooler): poll this often",
    )


def render(change: StatusChange) -> str:
    """One change as a line of text."""
    kinds = {None: "withdrawn", True: "final", False: "progress"}
    final = kinds[None if change.status is None else change.is_final]
    return (
        f"{change.position}  {change.changed_at.isoformat()}  {change.login}  "
        f"{change.message_id}  {cell(change.previous_status)} -> {cell(change.status)} ({final})  "
        f"{cell(change.reason)}"
    )


def _print(change: StatusChange, as_json: bool) -> None:
    line = json.dumps(change.to_json(), sort_keys=True) if as_json else render(change)
    sys.stdout.write(line + "\n")


async def run(args: argparse.Namespace) -> int:
    """Print the changes; with --consumer the cursor moves only after each batch is flushed
    (at least once: a crash between the two prints that batch again on the next run). A reader
    that closes the pipe (`| head`) ends the command quietly, its last batch not recorded."""
    try:
        return await _print_changes(args)
    except BrokenPipeError:
        # Python's docs: point stdout at /dev/null so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


async def _print_changes(args: argparse.Namespace) -> int:
    configure_logging("warning", "auto")
    dsn = required(args, "database_url")
    if args.consumer is not None and not args.consumer.strip():
        raise ConfigError("--consumer: the name must not be empty")
    conn = await connect(dsn, args.database_pooler)
    try:
        after = args.after
        if after is None:
            after = await load_cursor(conn, args.consumer) if args.consumer else 0
        remaining = args.limit
        if not args.follow:
            while remaining is None or remaining > 0:
                batch = await read_changes(conn, after, min(remaining or 1000, 1000))
                if not batch:
                    break
                after = await _emit(conn, args, batch)
                remaining = None if remaining is None else remaining - len(batch)
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        timing = FollowTiming(fallback_poll=args.poll_interval)
        limit = min(remaining or 1000, 1000)
        async for batch in follow_changes(dsn, after, limit=limit, stop=stop, timing=timing):
            if remaining is not None:
                batch = batch[:remaining]
                remaining -= len(batch)
            await _emit(conn, args, batch)
            if remaining == 0:
                break
        return 0
    finally:
        await conn.close()


async def _emit(
    conn: asyncpg.Connection, args: argparse.Namespace, batch: list[StatusChange]
) -> int:
    """Print `batch`, flush, then move the consumer's cursor; returns the last position."""
    for change in batch:
        _print(change, args.json)
    sys.stdout.flush()
    if args.consumer:
        await save_cursor(conn, args.consumer, batch[-1].position)
    return batch[-1].position
