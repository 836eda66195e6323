"""Record sent messages (JSON lines) so their receipts can be correlated.

The sending application's side of the command line (docs/spec/interfaces.md §3): its first
docstring line is the command's help and its entry in docs/configuration.md.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from dlrfeed.commands.progress import ProgressReport, add_progress_every
from dlrfeed.config import (
    add_database_url,
    add_integration_options,
    integration_options,
    required,
)
from dlrfeed.errors import BadDataError, ConfigError
from dlrfeed.store import Store, Submission, SubmissionResult

_BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """FILE (or `-` for stdin), the default login, and the destination normalisation option."""
    parser.add_argument("file", metavar="FILE", help="JSON lines of sent messages, or - for stdin")
    add_database_url(parser)
    parser.add_argument("--login", help="login of lines that do not name one")
    add_integration_options(parser)
    add_progress_every(parser)


def _timestamp(value: Any, line: int) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise BadDataError(f"line {line}: submitted_at must be ISO 8601 or epoch seconds")


def _text(record: dict[str, Any], key: str, line: int) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # ids are often sent as numbers; the gateway returned their digits
    raise BadDataError(f"line {line}: {key} must be a string")


def parse_lines(stream: Iterable[str], default_login: str | None) -> Iterator[Submission]:
    """One Submission per non-empty JSON line; BadDataError names the first bad line."""
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadDataError(f"line {number}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise BadDataError(f"line {number}: expected a JSON object")
        login = _text(record, "login", number) or default_login
        message_id = _text(record, "message_id", number)
        destination = _text(record, "destination", number)
        if login is None:
            raise ConfigError(f"line {number}: no login (give --login or a login key)")
        if not message_id or destination is None:
            raise BadDataError(f"line {number}: message_id and destination are required")
        level = record.get("dlr_level")
        if level is not None and level not in (1, 2, 3):
            raise BadDataError(f"line {number}: dlr_level must be 1, 2 or 3")
        yield Submission(
            login=login,
            message_id=message_id,
            destination=destination,
            internal_id=_text(record, "internal_id", number),
            source=_text(record, "source", number),
            submitted_at=_timestamp(record.get("submitted_at"), number),
            dlr_requested=bool(record.get("dlr_requested", True)),
            dlr_level=level,
            route=_text(record, "route", number),
        )


def _open(path: str) -> IO[str]:
    """The input stream; stdin for `-`. (Reading is line by line, a few KB at a time.)"""
    return sys.stdin if path == "-" else open(path, encoding="utf-8")


class _Counted:
    """The lines of a stream, counting the characters read (the progress of a file: its
    size in bytes is the total, one character a byte for the ASCII of JSON lines)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for line in self.stream:
            self.read += len(line)
            yield line

    def size(self) -> int | None:
        """The file's size; None for a pipe or a terminal."""
        try:
            info = os.fstat(self.stream.fileno())
        except (OSError, ValueError):  # a stream with no file behind it
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None


async def run(args: argparse.Namespace) -> int:
    """Read the file in batches of 1000 and record them, showing progress on stderr; print one
    JSON summary line. Recording is idempotent: stopped at any moment, the file is run again."""
    options = integration_options(args)
    store = await Store.open(
        required(args, "database_url"),
        pool_size=1,
        options=options,
        pooler=args.database_pooler,
    )
    totals = {"recorded": 0, "already_recorded": 0, "late_correlated_events": 0}
    stream = _open(args.file)
    lines = _Counted(stream)
    size = lines.size()
    report = ProgressReport("record-submissions", unit="bytes", every_s=args.progress_every)
    try:
        await store.check_schema()
        batch: list[Submission] = []
        for submission in parse_lines(lines, args.login):
            batch.append(submission)
            if len(batch) == _BATCH:
                _add(totals, await store.record_submissions(batch))
                report.update(lines.read, size, **totals)
                batch = []
        if batch:
            _add(totals, await store.record_submissions(batch))
        report.update(lines.read, size, **totals)
        report.finish()
    finally:
        if stream is not sys.stdin:
            stream.close()
        await store.close()
    print(json.dumps(totals))
    return 0


def _add(totals: dict[str, int], result: SubmissionResult) -> None:
    totals["recorded"] += result.recorded
    totals["already_recorded"] += result.already_recorded
    totals["late_correlated_events"] += result.late_correlated_events
