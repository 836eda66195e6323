"""The protobuf wire format read by hand: each top-level field, its value and its bytes.

Pure (no I/O, no protobuf library). The feed adapter reads with it the receipts the strict
decoder refuses (dlrfeed.feed.wire, C8); the store keys a poison receipt's evidence on its
bytes without the fields the gateway sets per delivery (`evidence_key`).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

ACK_TOKEN_FIELD, DELIVERY_COUNT_FIELD = 100, 101
"""A Receipt's two delivery fields (docs/spec/interfaces.md §1): new at every delivery."""

_UINT64 = 0xFFFFFFFFFFFFFFFF
_MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit


class WireDamageError(Exception):
    """The wire ends inside a field (or holds a wire type this proto never uses)."""


class Field(NamedTuple):
    """One top-level field: `data[start:end]` is its tag and value, whole."""

    number: int
    start: int
    end: int
    value: int | bytes | None
    """A varint as int, length-delimited bytes as bytes; None for fixed32/64 and groups."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & _UINT64, pos
        shift += 7
    raise WireDamageError


def _walk(
    data: bytes, pos: int, found: list[Field] | None, group: int | None, depth: int = 0
) -> int:
    """Read fields from `pos` to the end (or to the end of `group`); `found` None skips them.
    Unknown groups are skipped whole, as protobuf does, so both agree on what follows; nesting
    deeper than protobuf's own limit is damage (bytes of start-group tags must not recurse
    without bound, C8)."""
    if depth > _MAX_GROUP_DEPTH:
        raise WireDamageError
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireDamageError
        value: int | bytes | None = None
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireDamageError
            value = data[pos : pos + size]
            pos += size
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            if pos > len(data):
                raise WireDamageError
        elif wire_type == 3:
            pos = _walk(data, pos, None, number, depth + 1)
        elif wire_type == 4 and number == group:
            return pos
        else:  # an end-group without its start, or wire types 6 and 7 (they do not exist)
            raise WireDamageError
        if found is not None:
            found.append(Field(number, start, pos, value))
    if group is not None:
        raise WireDamageError
    return pos


def top_level_fields(data: bytes) -> tuple[list[Field], int]:
    """The fields of a message in wire order up to the first unreadable byte, and where
    reading stopped (`len(data)` when the whole message was read)."""
    found: list[Field] = []
    try:
        stopped = _walk(data, 0, found, None)
    except WireDamageError:
        stopped = found[-1].end if found else 0
    return found, stopped


def evidence_key(raw: bytes) -> str:
    """One key for every delivery of one serialized receipt (C8): the SHA-256 of its bytes
    without the delivery fields (ack_token, delivery_count). Bytes after damage are kept as
    they are, so two different damaged receipts never share a key."""
    found, stopped = top_level_fields(raw)
    digest = hashlib.sha256()
    for field in found:
        if field.number not in (ACK_TOKEN_FIELD, DELIVERY_COUNT_FIELD):
            digest.update(raw[field.start : field.end])
    digest.update(raw[stopped:])
    return digest.hexdigest()


def callback_evidence_key(raw: bytes) -> str:
    """One key for every post of one HTTP callback (C8): the SHA-256 of its bytes, whole (a
    callback carries no per-delivery field to leave out)."""
    return hashlib.sha256(raw).hexdigest()
