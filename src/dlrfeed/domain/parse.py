"""Parsing and normalisation: raw receipt fields in, storable raw + normalised fields out.

Pure (no I/O). Nothing is discarded: a value that cannot be normalised stays raw and is flagged
(P9, P17, C4). Everything here runs once per receipt on the ingest hot path, so it is written
for speed: dictionary look-ups and string slicing, no regular expressions, no strptime.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from typing import NamedTuple
from zoneinfo import ZoneInfo

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.receipt import Channel, Receipt
from dlrfeed.domain.status import STAT_TO_STATUS, Status
from dlrfeed.domain.transitions import level_stat_mismatch

PARSER_VERSION = "parse-4"
"""P8: recorded on every reception and event; bump when the parse of some input changes."""

_NUL = "\x00"
_NUL_ESCAPE = "\\u0000"  # the six characters \u0000: visible, storable in text and jsonb
_ABSENT = "\x1e"  # stands for an absent field inside the fingerprint (never in a storable value)
# A btree index entry must stay under ~2,700 bytes: ids (indexed) get a tighter cap than other
# fields; 512 characters is at most 2,048 bytes of UTF-8.
MAX_ID_CHARS = 512
# An id that had to be altered to be storable keeps a digest of its raw value, so that two ids
# that differ only past the cut, or in a NUL against a literal "\u0000", never share one
# logical event key (P14, F8): ID_MARK + 32 hex characters of BLAKE2b-128.
_ID_DIGEST_CHARS = 33
ID_MARK = "\u241f"
"""P24: the mark (SYMBOL FOR UNIT SEPARATOR) between an altered id and its digest. An id that
contains it is altered too, on receipts and on recorded messages alike, so no id kept as
received contains it, and an altered id can never equal a literal one."""
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class LogicalEvent(NamedTuple):
    """One delivery, parsed: every text field storable, the normalised forms beside the raw.

    `message_id` and `level` are the logical key within a login (P14, F8); `fingerprint` tells a
    repeat from a conflict; `correlation_id` is the id looked up among sent messages (P10).
    Immutable; a named tuple because one is built per receipt on the ingest hot path and a
    frozen dataclass of 22 fields costs several times as much to construct.
    """

    message_id: str
    correlation_id: str
    level: int
    stat: str
    status: Status
    err: str | None
    sub: str | None
    dlvrd: str | None
    submit_date_raw: str | None
    submit_at: datetime | None
    done_date_raw: str | None
    done_at: datetime | None
    text: str | None
    source_addr: str | None
    destination_addr: str | None
    smsc_message_id: str | None
    connector: str | None
    delivery_count: int
    received_at: float
    raw: bytes
    fingerprint: str
    flags: tuple[str, ...]
    channel: Channel = "feed"
    peer: str | None = None


@lru_cache(maxsize=8192)  # a batch's receipts mostly share stat, err and done date
def fingerprint(stat: str, err: str | None, done_date: str | None) -> str:
    """P14: the documented fingerprint of a logical event's content.

    The content that makes two deliveries of one key "the same" is the raw `stat`, `err` and
    `done_date` (processing.md P14). Absent and empty are different values. The raw text is
    hashed (surrogates passed through), so truncation for storage never merges two contents.
    """
    joined = "\x1f".join(
        (stat, _ABSENT if err is None else err, _ABSENT if done_date is None else done_date)
    )
    return hashlib.blake2b(joined.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def storable(value: str, field: str, limit: int, flags: list[str]) -> str:
    """A text value PostgreSQL accepts: NUL escaped as `\\u0000`, at most `limit` characters.

    Flags `nul_escaped:<field>` / `truncated:<field>` record that the column differs from the
    raw payload, which is always kept whole (C8, docs/rules.md "storable fields").
    """
    if _NUL in value:
        value = value.replace(_NUL, _NUL_ESCAPE)
        flags.append(f"nul_escaped:{field}")
    if len(value) > limit:
        value = value[:limit]
        flags.append(f"truncated:{field}")
    return value


@lru_cache(maxsize=32)
def zone(name: str) -> tzinfo:
    """The tzinfo of an IANA zone name (cached: looked up once per name)."""
    return ZoneInfo(name)


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


@lru_cache(maxsize=8192)  # receipts of one batch mostly share their minute: parse each once
def parse_reported_date(raw: str, tz: tzinfo) -> datetime | None:
    """A reported date in one of the documented forms, in `tz` unless it names its own offset,
    as the UTC instant it names.

    Forms: SMPP `YYMMDDhhmm` and `YYMMDDhhmmss` (years 00-99 → 2000-2099), `YYYYMMDDhhmmss`,
    and ISO 8601 (`YYYY-MM-DD hh:mm[:ss]`, `T` separator, optional `Z`/offset). None when `raw`
    is none of these or names an impossible time. P24: a local time that does not exist (the
    clock jumped past it) is read with the offset in force before the jump (02:30 in a gap
    02:00-03:00 is 03:30 after it); one that exists twice is its first occurrence. Returned in
    UTC, so every comparison is of instants whichever path the time took (a datetime compared
    with another of the same zone compares wall clocks).
    """
    local = _local_reported_date(raw, tz)
    return None if local is None else local.astimezone(UTC)


def _local_reported_date(raw: str, tz: tzinfo) -> datetime | None:
    try:
        if _digits(raw):
            n = len(raw)
            if n in (10, 12):
                second = int(raw[10:12]) if n == 12 else 0
                return datetime(
                    2000 + int(raw[0:2]),
                    int(raw[2:4]),
                    int(raw[4:6]),
                    int(raw[6:8]),
                    int(raw[8:10]),
                    second,
                    tzinfo=tz,
                )
            if n == 14:
                return datetime(
                    int(raw[0:4]),
                    int(raw[4:6]),
                    int(raw[6:8]),
                    int(raw[8:10]),
                    int(raw[10:12]),
                    int(raw[12:14]),
                    tzinfo=tz,
                )
            return None
        if len(raw) >= 16 and raw[4:5] == "-" and raw.isascii():
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=tz)
    except ValueError:
        return None
    return None


def _date(
    raw: str | None, field: str, tz: tzinfo, limit: int, flags: list[str]
) -> tuple[str | None, datetime | None]:
    if raw is None:
        return None, None
    if raw == "" or raw.upper() == "ND":
        # SMPP "not delivered"/empty date: a documented absence of a time, kept raw and flagged.
        flags.append(f"{field}_{'empty' if raw == '' else 'nd'}")
        return raw, None
    parsed = parse_reported_date(raw, tz)
    if parsed is None:
        flags.append(f"{field}_unparsed")
    return storable(raw, field, limit, flags), parsed


def correlation_id(message_id: str, options: IntegrationOptions, flags: list[str]) -> str:
    """P10: the id to look up among sent messages; the raw id unless an option says otherwise."""
    if options.receipt_ids_hex:
        # Only plain hex digits: int(x, 16) also takes "0x", "_", a sign and spaces, which
        # would make different receipt ids one message (P11: never guess a correlation).
        if message_id and all(c in _HEX_DIGITS for c in message_id):
            return str(int(message_id, 16))
        flags.append("id_not_hex")
    return message_id


def storable_id(raw: str, limit: int, flags: list[str]) -> str:
    """A storable id that stays one-to-one with the raw id (P14: the key must not merge ids).

    Like `storable`, but the altered value ends in `#` and a digest of the raw id, and is flagged
    `id_digest`. An id that needs no change never reaches here and is kept exactly (P10).
    """
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    value = storable(raw, "id", max(limit - _ID_DIGEST_CHARS, 1), flags)
    flags.append("id_digest")
    return f"{value}{ID_MARK}{digest}"


def id_needs_altering(raw: str, limit: int = MAX_ID_CHARS) -> bool:
    """P24: whether an id cannot be kept as received: a NUL, more than `limit` characters, or
    the mark that only altered ids carry."""
    return _NUL in raw or len(raw) > limit or ID_MARK in raw


def stored_id(raw: str, limit: int = MAX_ID_CHARS) -> str:
    """P24: the form an id is kept in, the same for a receipt's id and a recorded message's:
    the id itself, or its altered form (`storable_id`) when it cannot be kept as received."""
    return storable_id(raw, limit, []) if id_needs_altering(raw, limit) else raw


def parse(receipt: Receipt, options: IntegrationOptions) -> LogicalEvent:
    """Parse one delivery: raw fields made storable, status and dates normalised, flags set.

    Never raises for any field content: garbage is kept and flagged (C4). Unknown `stat` maps to
    UNRECOGNIZED (P17); a level other than 1 or 2 is kept and flagged `level_unexpected`, a stat
    that does not fit its level (F4) `level_stat_mismatch`.
    """
    flags: list[str] = list(receipt.flags)
    limit = options.max_field_chars
    tz = zone(options.receipt_timezone)
    # Each field is made storable only when it needs it (a NUL or too long): the common case
    # costs one substring test and one length check, and flags keep the field order.
    message_id: str = receipt.message_id
    if id_needs_altering(message_id, min(limit, MAX_ID_CHARS)):
        message_id = storable_id(message_id, min(limit, MAX_ID_CHARS), flags)
    stat = receipt.stat
    status = STAT_TO_STATUS.get(stat)
    if status is None:
        status = Status.UNRECOGNIZED
        flags.append("stat_unrecognized")
        stat = storable(stat, "stat", limit, flags)
    level = receipt.level
    if level != 1 and level != 2:
        flags.append("level_unexpected")
    elif level_stat_mismatch(level, status):
        flags.append("level_stat_mismatch")  # F4: kept, flagged, its level decides its kind
    err = receipt.err
    if err is not None and (_NUL in err or len(err) > limit):
        err = storable(err, "err", limit, flags)
    submit_raw, submit_at = _date(receipt.submit_date, "submit_date", tz, limit, flags)
    done_raw, done_at = _date(receipt.done_date, "done_date", tz, limit, flags)
    sub = receipt.sub
    if sub is not None and (_NUL in sub or len(sub) > limit):
        sub = storable(sub, "sub", limit, flags)
    dlvrd = receipt.dlvrd
    if dlvrd is not None and (_NUL in dlvrd or len(dlvrd) > limit):
        dlvrd = storable(dlvrd, "dlvrd", limit, flags)
    text = receipt.text
    if text is not None and (_NUL in text or len(text) > limit):
        text = storable(text, "text", limit, flags)
    source_addr = receipt.source_addr
    if source_addr is not None and (_NUL in source_addr or len(source_addr) > limit):
        source_addr = storable(source_addr, "source_addr", limit, flags)
    destination_addr = receipt.destination_addr
    if destination_addr is not None and (_NUL in destination_addr or len(destination_addr) > limit):
        destination_addr = storable(destination_addr, "destination_addr", limit, flags)
    smsc_message_id = receipt.smsc_message_id
    if smsc_message_id is not None and (_NUL in smsc_message_id or len(smsc_message_id) > limit):
        smsc_message_id = storable(smsc_message_id, "smsc_message_id", limit, flags)
    connector = receipt.connector
    if connector is not None and (_NUL in connector or len(connector) > limit):
        connector = storable(connector, "connector", limit, flags)
    correlation = (
        correlation_id(message_id, options, flags) if options.receipt_ids_hex else message_id
    )
    return LogicalEvent(
        message_id,
        correlation,
        level,
        stat,
        status,
        err,
        sub,
        dlvrd,
        submit_raw,
        submit_at,
        done_raw,
        done_at,
        text,
        source_addr,
        destination_addr,
        smsc_message_id,
        connector,
        receipt.delivery_count,
        receipt.received_at,
        receipt.raw,
        fingerprint(receipt.stat, receipt.err, receipt.done_date),
        tuple(flags),
        receipt.channel,
        receipt.peer,
    )


def normalise_destination(raw: str, options: IntegrationOptions) -> tuple[str, bool]:
    """P5: the destination in E.164 (`+` and 8-15 digits) when that is certain, else raw.

    Spaces, dots, dashes and parentheses are dropped; a leading `00` is the international
    prefix. Bare digits count as international only with `bare_digits_are_international`.
    Returns (value, is_e164).
    """
    compact = raw.strip()
    for separator in (" ", "-", ".", "(", ")"):
        compact = compact.replace(separator, "")
    if compact.startswith("+"):
        digits = compact[1:]
    elif compact.startswith("00"):
        digits = compact[2:]
    elif options.bare_digits_are_international:
        digits = compact
    else:
        return raw, False
    if _digits(digits) and 8 <= len(digits) <= 15 and digits[0] != "0":
        return "+" + digits, True
    return raw, False
