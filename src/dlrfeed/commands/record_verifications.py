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
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any

from dlrfeed.config import add_database_url, required
from dlrfeed.errors import BadDataError, ConfigError
from dlrfeed.store import Store, Verification, VerificationResult

_BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """FILE (or `-` for stdin) and the default login."""
    parser.add_argument("file", metavar="FILE", help="JSON lines of verifications, or - for stdin")
    add_database_url(parser)
    parser.add_argument("--login", help="login of lines that do not name one")


def _text(record: dict[str, Any], key: str, line: int) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # ids are often sent as numbers; the gateway returned their digits
    raise BadDataError(f"line {line}: {key} must be a string")


def _verified_at(value: Any, line: int) -> datetime:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise BadDataError(f"line {line}: verified_at is required, ISO 8601 or epoch seconds")


def parse_lines(stream: IO[str], default_login: str | None) -> Iterator[Verification]:
    """One Verification per non-empty JSON line; BadDataError names the first bad line."""
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
        if login is None:
            raise ConfigError(f"line {number}: no login (give --login or a login key)")
        message_id = _text(record, "message_id", number)
        kind = _text(record, "kind", number)
        if not message_id or not kind:
            raise BadDataError(f"line {number}: message_id and kind are required")
        yield Verification(
            login=login,
            message_id=message_id,
            kind=kind,
            verified_at=_verified_at(record.get("verified_at"), number),
            source=_text(record, "source", number),
        )


def _open(path: str) -> IO[str]:
    """The input stream; stdin for `-`. (Reading is line by line, a few KB at a time.)"""
    return sys.stdin if path == "-" else open(path, encoding="utf-8")


async def run(args: argparse.Namespace) -> int:
    """Read the file in batches of 1000 and record them; print one JSON summary line."""
    store = await Store.open(
        required(args, "database_url"), pool_size=1, pooler=args.database_pooler
    )
    totals = {"recorded": 0, "already_recorded": 0, "waiting_for_message": 0}
    stream = _open(args.file)
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
