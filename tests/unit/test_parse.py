"""Parsing: raw kept beside normalised, garbage flagged, every field storable (P9, P17, C4, C8)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import (
    ID_MARK,
    MAX_ID_CHARS,
    fingerprint,
    normalise_destination,
    parse,
    parse_reported_date,
    zone,
)
from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.domain.status import Status

OPTIONS = IntegrationOptions()


def receipt(**fields: object) -> Receipt:
    values: dict[str, object] = {
        "message_id": MessageId("42"),
        "level": 2,
        "stat": "DELIVRD",
        "err": "000",
        "sub": None,
        "dlvrd": None,
        "submit_date": "2611291200",
        "done_date": "261129120130",
        "text": None,
        "source_addr": None,
        "destination_addr": None,
        "smsc_message_id": None,
        "connector": None,
        "delivery_count": 1,
        "ack_token": AckToken("t"),
        "raw": b"\x00raw",
        "received_at": 0.0,
    }
    values.update(fields)
    return Receipt(**values)  # type: ignore[arg-type]  # test factory over heterogeneous fields


def test_smpp_dates_in_the_configured_zone_p19() -> None:
    """P19: YYMMDDhhmm and YYMMDDhhmmss are read in the configured time zone, raw kept."""
    madrid = parse(receipt(), IntegrationOptions(receipt_timezone="Europe/Madrid"))
    assert madrid.submit_date_raw == "2611291200"
    assert madrid.submit_at == datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
    assert madrid.done_at == datetime(2026, 11, 29, 11, 1, 30, tzinfo=UTC)
    assert madrid.flags == ()


def test_other_documented_date_forms() -> None:
    """YYYYMMDDhhmmss and ISO 8601 (with or without an offset) are documented forms."""
    utc = zone("UTC")
    noon = datetime(2026, 11, 29, 12, 1, tzinfo=UTC)
    assert parse_reported_date("20261129120130", utc) == noon.replace(second=30)
    assert parse_reported_date("2026-11-29 12:01", utc) == noon
    offset = parse_reported_date("2026-11-29T12:01:00+02:00", utc)
    assert offset == datetime(2026, 11, 29, 12, 1, tzinfo=timezone(timedelta(hours=2)))
    assert parse_reported_date("2026-11-29T12:01:00Z", utc) == noon
    assert parse_reported_date("261129", utc) is None


@pytest.mark.parametrize(
    ("raw", "instant"),
    [
        # 02:30 does not exist (02:00 CET -> 03:00 CEST): read with the offset before the jump.
        ("2603290230", datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        ("2603290305", datetime(2026, 3, 29, 1, 5, tzinfo=UTC)),
        # 02:30 exists twice (03:00 CEST -> 02:00 CET): its first occurrence.
        ("2610250230", datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
    ],
)
def test_a_local_time_in_a_dst_gap_or_repeat_is_one_utc_instant_p24(
    raw: str, instant: datetime
) -> None:
    """P24: one documented rule for local times that do not exist or exist twice, and every
    reported time a UTC instant (so no comparison of two times depends on their zones)."""
    parsed = parse_reported_date(raw, zone("Europe/Berlin"))
    assert parsed == instant
    assert parsed is not None
    assert parsed.tzinfo is UTC


def test_an_id_with_the_mark_is_altered_and_never_equals_an_altered_one_p24() -> None:
    """P24: an id that contains the mark altered ids carry is altered too, so the altered form
    of one id is never the id as received of another."""
    nul = parse(receipt(message_id="N\x00L"), OPTIONS).message_id
    assert ID_MARK in nul
    crafted = parse(receipt(message_id=nul), OPTIONS)
    assert crafted.message_id != nul
    assert "id_digest" in crafted.flags
    assert parse(receipt(message_id="plain-1"), OPTIONS).message_id == "plain-1"


def test_nd_empty_and_garbage_dates_are_kept_raw_and_flagged_c4() -> None:
    """C4: ND, empty and garbage dates stay raw, parse to None, and are flagged."""
    event = parse(receipt(submit_date="ND", done_date="2613991200"), OPTIONS)
    assert (event.submit_date_raw, event.submit_at) == ("ND", None)
    assert (event.done_date_raw, event.done_at) == ("2613991200", None)
    assert event.flags == ("submit_date_nd", "done_date_unparsed")
    empty = parse(receipt(submit_date="", done_date="yesterday"), OPTIONS)
    assert empty.flags == ("submit_date_empty", "done_date_unparsed")
    assert empty.done_date_raw == "yesterday"


def test_unknown_stat_is_kept_raw_normalised_unrecognized_and_flagged_p17() -> None:
    """P17: a stat outside the documented mapping keeps its raw value and is flagged."""
    event = parse(receipt(stat="DELIVERED_OK"), OPTIONS)
    assert event.stat == "DELIVERED_OK"
    assert event.status is Status.UNRECOGNIZED
    assert "stat_unrecognized" in event.flags


def test_nul_and_oversized_fields_are_made_storable_raw_kept_c8() -> None:
    """C8: NUL becomes the visible escape \\u0000; long fields are cut; raw bytes untouched."""
    event = parse(receipt(text="a\x00b", err="x" * 10_000, message_id="i" * 1000), OPTIONS)
    assert event.text == "a\\u0000b"
    assert event.err == "x" * OPTIONS.max_field_chars
    assert len(event.message_id) == MAX_ID_CHARS
    assert event.message_id.startswith("i" * (MAX_ID_CHARS - 33) + ID_MARK)
    assert {"nul_escaped:text", "truncated:err", "truncated:id", "id_digest"} <= set(event.flags)
    assert event.raw == b"\x00raw"


def test_fingerprint_distinguishes_stat_err_done_date_and_absence_p14() -> None:
    """P14: the fingerprint covers stat, err and done_date; absent differs from empty."""
    base = fingerprint("DELIVRD", "000", "2611291200")
    assert base == fingerprint("DELIVRD", "000", "2611291200")
    others = {
        fingerprint("UNDELIV", "000", "2611291200"),
        fingerprint("DELIVRD", "001", "2611291200"),
        fingerprint("DELIVRD", "000", "2611291201"),
        fingerprint("DELIVRD", None, "2611291200"),
        fingerprint("DELIVRD", "", "2611291200"),
    }
    assert base not in others
    assert len(others) == 5


def test_hex_receipt_ids_option_p10() -> None:
    """P10 option receipt_ids_hex: the receipt id is correlated by its decimal value."""
    hexed = IntegrationOptions(receipt_ids_hex=True)
    assert parse(receipt(message_id="1a"), hexed).correlation_id == "26"
    assert parse(receipt(message_id="1a"), OPTIONS).correlation_id == "1a"
    bad = parse(receipt(message_id="zz"), hexed)
    assert bad.correlation_id == "zz"
    assert "id_not_hex" in bad.flags


def test_destination_normalised_to_e164_only_when_certain_p5() -> None:
    """P5: E.164 when the international form is certain; otherwise the raw value, flagged."""
    assert normalise_destination("+34 600-11.22.33", OPTIONS) == ("+34600112233", True)
    assert normalise_destination("0034600112233", OPTIONS) == ("+34600112233", True)
    assert normalise_destination("34600112233", OPTIONS) == ("34600112233", False)
    bare = IntegrationOptions(bare_digits_are_international=True)
    assert normalise_destination("34600112233", bare) == ("+34600112233", True)
    assert normalise_destination("600 11", OPTIONS) == ("600 11", False)


text_fields = st.one_of(st.none(), st.text(max_size=50), st.text(min_size=5000, max_size=5001))


@given(
    stat=st.text(max_size=20),
    message_id=st.text(max_size=600),
    err=text_fields,
    date=text_fields,
    text=text_fields,
    level=st.integers(0, 2**32 - 1),
)
def test_parse_never_raises_and_every_column_is_storable_c4_c8(
    stat: str, message_id: str, err: str | None, date: str | None, text: str | None, level: int
) -> None:
    """C4/C8: any field content parses; no NUL reaches a column; lengths stay within limits."""
    delivered = receipt(
        stat=stat,
        message_id=message_id,
        err=err,
        done_date=date,
        submit_date=date,
        text=text,
        level=level,
    )
    event = parse(delivered, OPTIONS)
    for value in (event.message_id, event.stat, event.err, event.done_date_raw, event.text):
        assert value is None or ("\x00" not in value and len(value) <= OPTIONS.max_field_chars)
    assert len(event.message_id) <= MAX_ID_CHARS
    assert (event.status is Status.UNRECOGNIZED) == ("stat_unrecognized" in event.flags)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("7" * 600 + "a", "7" * 600 + "b"),  # differ only past the 512-character cut
        ("m\x00", "m\\u0000"),  # a NUL against the literal text it is escaped to
    ],
)
def test_altered_ids_never_share_a_logical_key_p14(first: str, second: str) -> None:
    one = parse(receipt(message_id=first), OPTIONS)
    two = parse(receipt(message_id=second), OPTIONS)
    assert one.message_id != two.message_id
    assert "id_digest" in one.flags
    assert len(one.message_id) <= MAX_ID_CHARS


def test_hex_option_takes_plain_hex_digits_only_p11() -> None:
    """P11: "0x1F", " 1f" or "1_f" are not the hex id "1f"; they stay uncorrelatable, flagged."""
    options = IntegrationOptions(receipt_ids_hex=True)
    assert parse(receipt(message_id="1f"), options).correlation_id == "31"
    for odd in ("0x1F", " 1f", "1_f", "-1f", ""):
        event = parse(receipt(message_id=odd), options)
        assert event.correlation_id == event.message_id
        assert "id_not_hex" in event.flags
