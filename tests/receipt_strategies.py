"""Hypothesis strategies for hostile receipts: any unicode, any length, any level, any bytes.

Shared by the parse fuzz (tests/unit/test_fuzz_parse.py) and the ingest fuzz against the real
database (tests/integration/test_fuzz_ingest.py). Proto strings are UTF-8, so surrogates cannot
occur in a well-formed receipt (hypothesis' text never draws them); NUL, control characters,
the highest code points and multi-megabyte values can, and so can bytes no decoder accepts.
"""

from __future__ import annotations

import os
import time

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


OPTIONAL_FIELDS = (
    "err",
    "sub",
    "dlvrd",
    "submit_date",
    "done_date",
    "text",
    "source_addr",
    "destination_addr",
    "smsc_message_id",
    "connector",
)

# Characters that break naive code: NUL, controls, a BOM, the last code points of the BMP and
# of Unicode, combining marks, right-to-left text, 4-byte UTF-8.
_NASTY = st.sampled_from(
    ["\x00", "\x1f", "\x7f", "\ufeff", "\uffff", "\U0010ffff", "\u0301", "\u202e", "😀", "\\"]
)
_CHARACTERS = st.one_of(st.characters(codec="utf-8"), _NASTY)  # proto strings are UTF-8


def _repeated(character: str, times: int) -> str:
    return character * times


# Any length: mostly short, sometimes beyond the storable limits (512 characters for ids, 4096
# otherwise); megabyte fields (C8) are drawn separately and rarely (they cost the database time).
any_text = st.one_of(
    st.text(_CHARACTERS, max_size=40),
    st.text(_CHARACTERS, max_size=40),
    st.text(_CHARACTERS, max_size=40),
    # Long values are drawn as a short piece repeated: as hostile to the store, far cheaper
    # for hypothesis to generate than thousands of independent characters.
    st.builds(str.__mul__, st.text(_CHARACTERS, min_size=1, max_size=8), st.integers(60, 700)),
    st.builds(_repeated, _CHARACTERS, st.integers(4090, 4200)),  # around the 4096 limit
)
huge_text = st.builds(_repeated, _CHARACTERS, st.integers(1_000_000, 1_200_000))

levels = st.one_of(st.sampled_from([0, 1, 2, 3, UINT32_MAX]), st.integers(0, UINT32_MAX))
delivery_counts = st.one_of(st.sampled_from([0, 1, 2, UINT32_MAX]), st.integers(0, UINT32_MAX))
stats = st.one_of(st.sampled_from(sorted(STAT_TO_STATUS)), any_text)
dates = st.one_of(
    st.builds("{:010d}".format, st.integers(0, 9_999_999_999)),
    st.builds("{:012d}".format, st.integers(0, 999_999_999_999)),
    st.sampled_from(["ND", "", "2613321299", "2611291200"]),
    any_text,
)
message_ids = st.one_of(st.sampled_from(["m1", "m2", "m3"]), any_text)


@st.composite
def wire_receipts(draw: st.DrawFn, *, allow_huge: bool = False) -> feed_pb2.Receipt:
    """A proto Receipt with arbitrary content in every field; optional fields absent or set."""
    message = feed_pb2.Receipt(
        id=draw(message_ids),
        level=draw(levels),
        stat=draw(stats),
        ack_token=draw(any_text),
        delivery_count=draw(delivery_counts),
    )
    for name in OPTIONAL_FIELDS:
        value = draw(st.none() | (dates if name.endswith("_date") else any_text))
        if value is not None:
            setattr(message, name, value)
    if allow_huge and draw(st.integers(0, 199)) == 0:
        setattr(message, draw(st.sampled_from(["text", "err", "connector"])), draw(huge_text))
    return message


@st.composite
def hostile_payloads(draw: st.DrawFn) -> bytes:
    """Bytes as a gateway might send them: a real serialization, or one damaged (bytes flipped,
    cut short, spliced with junk, a field made invalid UTF-8), or plain random bytes."""
    raw = draw(wire_receipts()).SerializeToString()
    how = draw(st.sampled_from(["intact", "flip", "truncate", "splice", "bad_utf8", "random"]))
    if how == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "splice":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=16)) + raw[at:]
    elif how == "bad_utf8":
        # A length-delimited field (id = 1, stat = 3, text = 9, ack_token = 100) whose bytes
        # are not UTF-8: what a gateway that does not validate its strings would send.
        tag = draw(st.sampled_from([b"\x0a", b"\x1a", b"\x4a", b"\xa2\x06"]))
        junk = draw(st.binary(min_size=1, max_size=30)) + b"\xff"
        raw += tag + bytes([len(junk)]) + junk
    elif how == "random":
        raw = draw(st.binary(max_size=200))
    return raw


def receipts_from_payloads(payloads: list[bytes]) -> list[Receipt]:
    """The receipts the feed adapter makes of these bytes (dlrfeed.feed.wire, never raises)."""
    now = time.time()
    return [receipt_from_wire(raw, now) for raw in payloads]
