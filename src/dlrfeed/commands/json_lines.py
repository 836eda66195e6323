"""The JSON lines the sending application hands to `record-submissions` and
`record-verifications`: one object a line, each bad line named by its number, nothing guessed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from dlrfeed.errors import BadDataError, ConfigError


def open_input(path: str) -> IO[str]:
    """The input stream; stdin for `-`. (Reading is line by line, a few KB at a time.)"""
    return sys.stdin if path == "-" else open(path, encoding="utf-8")


def records(stream: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each non-empty line's number and object; BadDataError names the first bad line."""
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadDataError(f"line {number}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise BadDataError(f"line {number}: expected a JSON object")
        yield number, record


def text(record: dict[str, Any], key: str, line: int) -> str | None:
    """A string field; a whole number is taken as its digits (ids are often sent as numbers)."""
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise BadDataError(f"line {line}: {key} must be a string")


def login(record: dict[str, Any], default: str | None, line: int) -> str:
    """The line's login, or the command's `--login`."""
    found = text(record, "login", line) or default
    if found is None:
        raise ConfigError(f"line {line}: no login (give --login or a login key)")
    return found


def timestamp(record: dict[str, Any], key: str, line: int) -> datetime | None:
    """An ISO 8601 time (UTC when it names no offset) or epoch seconds; None when absent."""
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise BadDataError(f"line {line}: {key} must be ISO 8601 or epoch seconds")
