"""Hypothesis strategies for hostile receipts: any unicode, any length, any level, any bytes.

Shared by the parse fuzz (tests/unit/test_fuzz_parse.py) and the ingest fuzz against the real
database (tests/integration/test_fuzz_ingest.py). Proto strings are UTF-8, so surrogates cannot
occur in a well-formed receipt (hypothesis' text never draws them); NUL, control characters,
the highest code points and multi-megabyte values can, and so can bytes no decoder accepts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st

from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import STAT_TO_STATUS
from dlrfeed.feed.wire import receipt_from_wire
from gateway.receipts.v1 import feed_pb2

UINT32_MAX = 2**32 - 1
FUZZING = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"


def examples(short: int) -> settings:
    """The loaded profile under `make fuzz` (10,000 examples); `short` examples in `make test`,
    so that every fuzz test stays in the suite at a cost the suite can afford."""
    return settings() if FUZZING else settings(max_examples=short)


# The Receipt fields that may be absent (proto3 `optional`, F4), read from the contract itself.
OPTIONAL_FIELDS = tuple(f.name for f in feed_pb2.Receipt.DESCRIPTOR.fields if f.has_presence)

# Characters that break naive code: NUL, controls, a BOM, the last code points of the BMP and
# of Unicode, combining marks, right-to-left text, 4-byte UTF-8.
_NASTY = st.sampled_from(
    ["\x00", "\x1f", "\x7f", "\ufeff", "\uffff", "\U0010ffff", "\u0301", "\u202e", "😀", "\\"]
)
_CHARACTERS = st.one_of(st.characters(codec="utf-8"), _NASTY)  # proto strings are UTF-8


@dataclass(frozen=True, slots=True)
class Text:
    """A string drawn as a piece and a repeat count, expanded only when the test runs: hypothesis
    keeps every drawn value of every example in memory, so 10,000 examples of expanded
    kilobyte-to-megabyte strings would hold gigabytes."""

    piece: str
    times: int = 1

    def value(self) -> str:
        return self.piece * self.times


def _short(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[Text]:
    return strategy.map(Text)


# Any length: mostly short, sometimes beyond the storable limits (512 characters for ids, 4096
# otherwise); megabyte fields (C8) are drawn separately and rarely (they cost the database time).
any_text = st.one_of(
    _short(st.text(_CHARACTERS, max_size=40)),
    _short(st.text(_CHARACTERS, max_size=40)),
    _short(st.text(_CHARACTERS, max_size=40)),
    st.builds(Text, st.text(_CHARACTERS, min_size=1, max_size=8), st.integers(60, 700)),
    st.builds(Text, _CHARACTERS, st.integers(4090, 4200)),  # around the 4096 limit
)
huge_text = st.builds(Text, _CHARACTERS, st.integers(1_000_000, 1_200_000))

levels = st.one_of(st.sampled_from([0, 1, 2, 3, UINT32_MAX]), st.integers(0, UINT32_MAX))
delivery_counts = st.one_of(st.sampled_from([0, 1, 2, UINT32_MAX]), st.integers(0, UINT32_MAX))
stats = st.one_of(_short(st.sampled_from(sorted(STAT_TO_STATUS))), any_text)
dates = st.one_of(
    _short(st.builds("{:010d}".format, st.integers(0, 9_999_999_999))),
    _short(st.builds("{:012d}".format, st.integers(0, 999_999_999_999))),
    _short(st.sampled_from(["ND", "", "2613321299", "2611291200"])),
    any_text,
)
message_ids = st.one_of(_short(st.sampled_from(["m1", "m2", "m3"])), any_text)


@dataclass(frozen=True, slots=True)
class ReceiptRecipe:
    """A proto Receipt to build: field name → Text or int (absent optional fields left out)."""

    fields: tuple[tuple[str, Text | int], ...]

    def message(self) -> feed_pb2.Receipt:
        message = feed_pb2.Receipt()
        for name, value in self.fields:
            setattr(message, name, value.value() if isinstance(value, Text) else value)
        return message

    def payload(self) -> bytes:
        return self.message().SerializeToString()


@st.composite
def wire_receipts(draw: st.DrawFn, *, allow_huge: bool = False) -> ReceiptRecipe:
    """A proto Receipt with arbitrary content in every field; optional fields absent or set."""
    fields: list[tuple[str, Text | int]] = [
        ("id", draw(message_ids)),
        ("level", draw(levels)),
        ("stat", draw(stats)),
        ("ack_token", draw(any_text)),
        ("delivery_count", draw(delivery_counts)),
    ]
    for name in OPTIONAL_FIELDS:
        value = draw(st.none() | (dates if name.endswith("_date") else any_text))
        if value is not None:
            fields.append((name, value))
    if allow_huge and draw(st.integers(0, 199)) == 0:
        fields.append((draw(st.sampled_from(["text", "err", "connector"])), draw(huge_text)))
    return ReceiptRecipe(tuple(fields))


@dataclass(frozen=True, slots=True)
class DamagedPayload:
    """A real serialization damaged one way (positions as fractions of its length)."""

    base: ReceiptRecipe
    how: str
    at: float
    xor: int
    junk: bytes

    def payload(self) -> bytes:
        raw = self.base.payload()
        at = int(self.at * len(raw))
        if self.how == "flip" and raw:
            at = min(at, len(raw) - 1)
            return raw[:at] + bytes([raw[at] ^ self.xor]) + raw[at + 1 :]
        if self.how == "truncate":
            return raw[:at]
        if self.how == "splice":
            return raw[:at] + self.junk + raw[at:]
        if self.how == "bad_utf8":
            # A length-delimited field (id = 1, stat = 3, text = 9, ack_token = 100) whose
            # bytes are not UTF-8: what a gateway that does not validate its strings sends.
            tag = (b"\x0a", b"\x1a", b"\x4a", b"\xa2\x06")[self.xor % 4]
            junk = self.junk + b"\xff"
            return raw + tag + bytes([len(junk)]) + junk
        return self.junk  # "random"


def hostile_payloads() -> st.SearchStrategy[ReceiptRecipe | DamagedPayload]:
    """Bytes as a gateway might send them (`.payload()`): a real serialization, or one damaged
    (a byte flipped, cut short, spliced with junk, a field made invalid UTF-8), or random bytes."""
    return st.one_of(
        wire_receipts(),
        st.builds(
            DamagedPayload,
            base=wire_receipts(),
            how=st.sampled_from(["flip", "truncate", "splice", "bad_utf8"]),
            at=st.floats(0, 1),
            xor=st.integers(1, 255),
            junk=st.binary(max_size=30),
        ),
        st.builds(
            DamagedPayload,
            base=st.just(ReceiptRecipe(())),
            how=st.just("random"),
            at=st.just(0.0),
            xor=st.just(1),
            junk=st.binary(max_size=200),
        ),
    )


def receipts_from_payloads(payloads: list[bytes]) -> list[Receipt]:
    """The receipts the feed adapter makes of these bytes (dlrfeed.feed.wire, never raises)."""
    now = time.time()
    return [receipt_from_wire(raw, now) for raw in payloads]
