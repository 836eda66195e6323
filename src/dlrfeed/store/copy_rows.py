"""The receptions of a batch in PostgreSQL's binary COPY format, encoded in two steps.

A reception's own fields depend on the receipt alone, so they are encoded while the server runs
the batch's events insert; its parsed content only where it is not its event's (`AS_EVENT`),
and its id, outcome and event id as the plan decides them (`complete`). asyncpg's
`copy_records_to_table` would encode it all after the plan, on the critical path.

The format: a signature and two int32 header words, then per row an int16 field count and each
field as an int32 length (-1 for NULL) and its binary send form; an int16 -1 ends the data.
Values the encoding refuses raise the driver's errors (UnicodeEncodeError, OverflowError), so
the store's C8 bisection treats them alike.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import get_args

from dlrfeed.domain.parse import PARSER_VERSION, LogicalEvent
from dlrfeed.domain.receipt import Channel
from dlrfeed.domain.status import Outcome

# Where the receptions go, and the COPY column order: the receipt's own fields, its parsed
# content, then the late ones (see `complete`). A reception names its login, message id and
# level by its event.
SCHEMA = "dlr"
TABLE = "reception_rows"
OWN_COLUMNS = (
    "submit_date_raw",
    "submit_at",
    "delivery_count",
    "received_at",
    "payload",
    "channel",
    "peer",
)
CONTENT_COLUMNS = (
    "stat",
    "err",
    "done_date_raw",
    "done_at",
    "flags",
    "parser_version",
    "fingerprint",
)
COLUMNS = (*OWN_COLUMNS, *CONTENT_COLUMNS, "id", "outcome", "event_id")

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)  # no flags, no extension
TRAILER = struct.pack(">h", -1)
_FIELD_COUNT = struct.pack(">h", len(COLUMNS))
_NULL = struct.pack(">i", -1)
_length = struct.Struct(">i").pack
_int8_field = struct.Struct(">iq").pack  # length 8, then the value
_TEXT_OID = 25
_EMPTY_TEXT_ARRAY = _length(12) + struct.pack(">iiI", 0, 0, _TEXT_OID)  # no dimensions
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz counts µs from here
_MICROSECOND = timedelta(microseconds=1)
_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1


def _text(value: str | None) -> bytes:
    if value is None:
        return _NULL
    encoded = value.encode("utf-8")  # strict, as the driver: a lone surrogate is a data error
    return _length(len(encoded)) + encoded


def _int8(value: int) -> bytes:
    if not _INT8_MIN <= value <= _INT8_MAX:
        raise OverflowError(f"value out of int64 range: {value}")
    return _int8_field(8, value)


def _timestamptz(value: datetime | None) -> bytes:
    if value is None:
        return _NULL
    return _int8_field(8, (value - _POSTGRES_EPOCH) // _MICROSECOND)


def _timestamptz_once(
    encoded: dict[tuple[datetime | None, int], bytes], value: datetime | None
) -> bytes:
    """`_timestamptz(value)`, encoded once per batch: a batch repeats few distinct dates.
    Keyed with `fold` too: two times of one zone that differ only in it compare equal in
    Python, yet are an hour apart at a DST change."""
    key = (value, 0 if value is None else value.fold)
    field = encoded.get(key)
    if field is None:
        field = encoded[key] = _timestamptz(value)
    return field


def _text_array(values: Sequence[str]) -> bytes:
    if not values:
        return _EMPTY_TEXT_ARRAY
    body = struct.pack(">iiIii", 1, 0, _TEXT_OID, len(values), 1) + b"".join(
        _text(v) for v in values
    )
    return _length(len(body)) + body


_OUTCOME_FIELDS = {outcome: _text(outcome.value) for outcome in Outcome}
AS_EVENT = _NULL * len(CONTENT_COLUMNS)
"""The content fields of a reception whose content is its event's: all NULL."""
# An enum's binary form is its label: the two channels, encoded once.
_CHANNEL_FIELDS: dict[str, bytes] = {channel: _text(channel) for channel in get_args(Channel)}


def encode_receipt_fields(events: Iterable[LogicalEvent]) -> list[bytes]:
    """Each reception's own fields (P6): the field count and every field of `OWN_COLUMNS`, in
    that order."""
    received: dict[float, bytes] = {}  # a batch's receipts mostly share their receive time
    dates: dict[tuple[datetime | None, int], bytes] = {}  # ... and their reported dates
    rows = []
    for e in events:
        received_at = received.get(e.received_at)
        if received_at is None:
            received_at = received[e.received_at] = _timestamptz(
                datetime.fromtimestamp(e.received_at, UTC)
            )
        submit_at = _timestamptz_once(dates, e.submit_at)
        rows.append(
            b"".join(
                (
                    _FIELD_COUNT,
                    _text(e.submit_date_raw),
                    submit_at,
                    _int8(e.delivery_count),
                    received_at,
                    _length(len(e.raw)),
                    e.raw,
                    _CHANNEL_FIELDS[e.channel],
                    _text(e.peer),
                )
            )
        )
    return rows


def encode_contents(events: Iterable[LogicalEvent]) -> list[bytes]:
    """The parsed content of each reception that holds its own: the fields of
    `CONTENT_COLUMNS`, in that order (the others get `AS_EVENT`)."""
    parser_version = _text(PARSER_VERSION)
    dates: dict[tuple[datetime | None, int], bytes] = {}
    contents = []
    for e in events:
        done_at = _timestamptz_once(dates, e.done_at)
        contents.append(
            b"".join(
                (
                    _text(e.stat),
                    _text(e.err),
                    _text(e.done_date_raw),
                    done_at,
                    _text_array(e.flags),
                    parser_version,
                    _text(e.fingerprint),
                )
            )
        )
    return contents


def contents(
    events: Sequence[LogicalEvent],
    event_ids: Sequence[int],
    event_contents: Mapping[int, tuple[str, tuple[str, ...]] | None],
) -> list[bytes]:
    """The content fields of each reception: `AS_EVENT` where its fingerprint and flags are
    its event's first content (`event_contents`, by event id: ingest.event_contents), its own
    encoding elsewhere."""
    own = [
        (e.fingerprint, e.flags) != event_contents[event_id]
        for e, event_id in zip(events, event_ids, strict=True)
    ]
    encoded = iter(encode_contents(e for e, o in zip(events, own, strict=True) if o))
    return [next(encoded) if o else AS_EVENT for o in own]


def complete(
    rows: Sequence[bytes],
    contents: Sequence[bytes],
    ids: Iterable[int],
    outcomes: Sequence[Outcome],
    event_ids: Sequence[int],
) -> bytes:
    """COPY data rows: each row of `encode_receipt_fields` with its content (its own, or
    `AS_EVENT`), id, outcome and event id appended. The whole COPY data is `SIGNATURE`, then
    the rows, in one or more pieces, then `TRAILER`."""
    parts: list[bytes] = []
    for row, content, reception_id, outcome, event_id in zip(
        rows, contents, ids, outcomes, event_ids, strict=True
    ):
        parts += (
            row,
            content,
            _int8_field(8, reception_id),
            _OUTCOME_FIELDS[outcome],
            _int8_field(8, event_id),
        )
    return b"".join(parts)
