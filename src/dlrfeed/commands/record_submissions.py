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
from typing import IO

from dlrfeed.commands import json_lines
from dlrfeed.commands.progress import ProgressReport, add_progress_every
from dlrfeed.config import (
    add_database_url,
    add_integration_options,
    integration_options,
    required,
)
from dlrfeed.errors import BadDataError
from dlrfeed.store import Store, Submission, SubmissionResult

_BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """FILE (or `-` for stdin), the default login, and the destination normalisation option."""
    parser.add_argument("file", metavar="FILE", help="JSON lines of sent messages, or - for stdin")
    add_database_url(parser)
    parser.add_argument("--login", help="login of lines that do not name one")
    add_integration_options(parser)
    add_progress_every(parser)


def parse_lines(stream: Iterable[str], default_login: str | None) -> Iterator[Submission]:
    """One Submission per non-empty JSON line; BadDataError names the first bad line."""
    for number, record in json_lines.records(stream):
        login = json_lines.login(record, default_login, number)
        message_id = json_lines.text(record, "message_id", number)
        destination = json_lines.text(record, "destination", number)
        if not message_id or destination is None:
            raise BadDataError(f"line {number}: message_id and destination are required")
        level = record.get("dlr_level")
        if level is not None and level not in (1, 2, 3):
            raise BadDataError(f"line {number}: dlr_level must be 1, 2 or 3")
        yield Submission(
            login=login,
            message_id=message_id,
            destination=destination,
            internal_id=json_lines.text(record, "internal_id", number),
            source=json_lines.text(record, "source", number),
            submitted_at=json_lines.timestamp(record, "submitted_at", number),
            dlr_requested=bool(record.get("dlr_requested", True)),
            dlr_level=level,
            route=json_lines.text(record, "route", number),
        )


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
    stream = json_lines.open_input(args.file)
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
