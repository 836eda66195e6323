"""Record independent verifications (JSON lines): OTP codes entered, replies, clicks (C6).

The sending application's evidence that a message reached a person, kept apart from the DLR
status, which it never changes (P2). Each line: `message_id` (as the gateway returned it), an
optional `login`, `kind` (`otp_confirmed`, `reply`, `click`, or the sender's own word),
`verified_at` (ISO 8601 or epoch seconds) and an optional `source`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator

from dlrfeed.commands import json_lines
from dlrfeed.config import add_database_url, required
from dlrfeed.errors import BadDataError
from dlrfeed.store import Store, Verification, VerificationResult

_BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """FILE (or `-` for stdin) and the default login."""
    parser.add_argument("file", metavar="FILE", help="JSON lines of verifications, or - for stdin")
    add_database_url(parser)
    parser.add_argument("--login", help="login of lines that do not name one")


def parse_lines(stream: Iterable[str], default_login: str | None) -> Iterator[Verification]:
    """One Verification per non-empty JSON line; BadDataError names the first bad line."""
    for number, record in json_lines.records(stream):
        login = json_lines.login(record, default_login, number)
        message_id = json_lines.text(record, "message_id", number)
        kind = json_lines.text(record, "kind", number)
        if not message_id or not kind:
            raise BadDataError(f"line {number}: message_id and kind are required")
        verified_at = json_lines.timestamp(record, "verified_at", number)
        if verified_at is None:
            raise BadDataError(f"line {number}: verified_at is required")
        yield Verification(
            login=login,
            message_id=message_id,
            kind=kind,
            verified_at=verified_at,
            source=json_lines.text(record, "source", number),
        )


async def run(args: argparse.Namespace) -> int:
    """Read the file in batches of 1000 and record them; print one JSON summary line."""
    store = await Store.open(
        required(args, "database_url"), pool_size=1, pooler=args.database_pooler
    )
    totals = {"recorded": 0, "already_recorded": 0, "waiting_for_message": 0}
    stream = json_lines.open_input(args.file)
    try:
        await store.check_schema()
        batch: list[Verification] = []
        for verification in parse_lines(stream, args.login):
            batch.append(verification)
            if len(batch) == _BATCH:
                _add(totals, await store.record_verifications(batch))
                batch = []
        if batch:
            _add(totals, await store.record_verifications(batch))
    finally:
        if stream is not sys.stdin:
            stream.close()
        await store.close()
    print(json.dumps(totals))
    return 0


def _add(totals: dict[str, int], result: VerificationResult) -> None:
    totals["recorded"] += result.recorded
    totals["already_recorded"] += result.already_recorded
    totals["waiting_for_message"] += result.waiting
