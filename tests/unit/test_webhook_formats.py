"""The webhook's callback formats: every fixture reads to its fields, every malformed callback
is refused with its reason, and no input raises anything else (P9, P10, F4, C4).

The fixtures (tests/fixtures/webhook/, layout in its README) are real-shaped callbacks written
from the gateway's, Jasmin's and Kannel's documentation; docs/webhook-formats.md is the mapping.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrfeed.domain import rules
from dlrfeed.webhook import formats
from dlrfeed.webhook.formats import (
    STAT_INFERRED,
    TEXT_FIELDS,
    Callback,
    CallbackFormat,
    MalformedCallback,
    ReceiptFields,
    evidence,
    read_callback,
    read_flagged,
)
from gateway.receipts.v1 import feed_pb2
from support.receipt_strategies import examples
from support.webhook_fixtures import FIXTURE_NAMES, FIXTURES, expected, load_fixture

RECEIPT_NAMES = frozenset(ReceiptFields.__annotations__)
GATEWAY, JASMIN, KANNEL = CallbackFormat.GATEWAY, CallbackFormat.JASMIN, CallbackFormat.KANNEL
JSON = "application/json"


def post(body: bytes, content_type: str | None = JSON) -> Callback:
    return Callback("POST", "", content_type, body)


def get(query: str) -> Callback:
    return Callback("GET", query, None, b"")


def reason(fmt: CallbackFormat, callback: Callback) -> str:
    with pytest.raises(MalformedCallback) as caught:
        read_callback(fmt, callback)
    text = str(caught.value)
    assert text
    assert "\n" not in text, "a reason is one line"
    return text


def outcome(fmt: CallbackFormat, callback: Callback) -> ReceiptFields | str:
    """The fields read, or the reason the callback was refused."""
    try:
        return read_callback(fmt, callback)
    except MalformedCallback as exc:
        return str(exc)


def assert_fields_or_one_line_reason(result: ReceiptFields | str) -> None:
    if isinstance(result, str):
        assert result
        assert "\n" not in result
        return
    assert result["id"]
    assert isinstance(result["level"], int)
    assert isinstance(result["stat"], str)
    assert set(result) <= RECEIPT_NAMES
    assert all(isinstance(result.get(name, ""), str) for name in TEXT_FIELDS)


# --- the fixtures --------------------------------------------------------------------------


def test_fixtures_cover_each_format_with_two_callbacks_and_malformed_ones() -> None:
    for fmt in CallbackFormat:
        names = [n for n in FIXTURE_NAMES if n.startswith(f"{fmt}-")]
        readable = [n for n in names if "malformed" not in expected(n)]
        assert len(readable) >= 2, fmt
        assert len(names) > len(readable), f"{fmt}: no malformed fixture"
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(FIXTURE_NAMES)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_each_fixture_reads_to_its_expected_fields_or_reason(name: str) -> None:
    fmt, callback = load_fixture(name)
    wanted = expected(name)
    if "malformed" in wanted:
        assert wanted["malformed"] in reason(fmt, callback)
    else:
        assert read_callback(fmt, callback) == wanted


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_evidence_of_a_fixture_is_its_body_or_its_query(name: str) -> None:
    """P6, P9: what the gateway sent, byte for byte — a POST's body, a GET's query."""
    _, callback = load_fixture(name)
    if callback.method == "GET":
        assert evidence(callback) == callback.query.encode("ascii")
    else:
        assert evidence(callback) == callback.body


# --- the gateway's webhook -----------------------------------------------------------------


def test_gateway_missing_level_and_stat_read_as_the_feed_carries_them() -> None:
    """F4: proto3 gives 0 and "" for a missing level and stat; the parse flags them later."""
    assert read_callback(GATEWAY, post(b'{"id": "m1"}')) == {"id": "m1", "level": 0, "stat": ""}


@pytest.mark.parametrize(
    "content_type", [JSON, "application/json; charset=utf-8", "text/plain", None]
)
def test_gateway_body_is_json_whatever_its_content_type(content_type: str | None) -> None:
    body = b'{"id": "m1", "level": 2, "stat": "DELIVRD"}'
    assert read_callback(GATEWAY, post(body, content_type))["stat"] == "DELIVRD"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff{}", "not UTF-8"),
        (b"", "not JSON"),
        (b'{"id": "m1",}', "not JSON: Expecting property name enclosed in double quotes (char 12)"),
        (b"[1]", "an array, not a JSON object"),
        (b'"m1"', "a string, not a JSON object"),
        (b"{}", "no id"),
        (b'{"id": ""}', "id is empty"),
        (b'{"id": 42}', "id must be a string, got the number 42"),
        (b'{"id": null}', "id is null"),
        (b'{"id": "m1", "level": null}', "level is null"),
        (b'{"id": "m1", "level": true}', "got a boolean"),
        (b'{"id": "m1", "level": 1.0}', "got the number 1.0"),
        (b'{"id": "m1", "level": -1}', "0..4294967295"),
        (b'{"id": "m1", "level": 4294967296}', "0..4294967295"),
        (b'{"id": "m1", "level": "2"}', "got a string"),
        (b'{"id": "m1", "stat": ["DELIVRD"]}', "stat must be a string, got an array"),
        (b'{"id": "m1", "text": {}}', "text must be a string, got an object"),
        (b'{"id": "m1", "err": null}', "err is null"),
        (b'{"id": "m1", "id": "m2"}', "'id' appears twice"),
        (b'{"id": "m1", "x": {"a": 1, "a": 2}}', "'a' appears twice"),
        (b'{"id": "\\ud800"}', "lone surrogate"),
        (b'{"id": "m1", "level": 1' + b"0" * 5000 + b"}", "a number too long"),
        (b'{"id": "m1", "level": 1' + b"0" * 4000 + b"}", "got the number 1000000000"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_gateway_malformed_bodies_say_what_is_wrong(body: bytes, words: str) -> None:
    assert words in reason(GATEWAY, post(body))


def test_gateway_refuses_a_get() -> None:
    assert "got a GET" in reason(GATEWAY, get("id=m1"))


# --- Jasmin ---------------------------------------------------------------------------------


def test_jasmin_reads_a_get_query_and_a_post_body_alike() -> None:
    query = "id=u1&level=2&message_status=EXPIRED&id_smsc=77&donedate=2612031200"
    by_get = read_callback(JASMIN, get(query))
    by_post = read_callback(JASMIN, post(query.encode(), "application/x-www-form-urlencoded"))
    assert (
        by_get
        == by_post
        == {
            "id": "u1",
            "level": 2,
            "stat": "EXPIRED",
            "smsc_message_id": "77",
            "done_date": "2612031200",
        }
    )


def test_jasmin_connector_is_read_at_level_1_only() -> None:
    """At level 2 Jasmin puts the receipt's own id in `connector` (jasmin/managers/dlr.py)."""
    one = read_callback(JASMIN, get("id=u1&level=1&message_status=ESME_ROK&connector=c1"))
    two = read_callback(JASMIN, get("id=u1&level=2&message_status=DELIVRD&connector=0A1B"))
    assert (one.get("connector"), two.get("connector")) == ("c1", None)


def test_jasmin_esme_rok_is_acceptance_and_an_esme_error_a_refused_submit() -> None:
    """A level-1 ESME_R* error is the SMSC refusing the submit: the one documented outcome of
    a refused submit (REJECTD at level 2, the code as err), as Kannel's NACK."""

    def read(status: str) -> ReceiptFields:
        return read_callback(JASMIN, get(f"id=u1&level=1&message_status={status}"))

    assert read("ESME_ROK") == {"id": "u1", "level": 1, "stat": "ACCEPTD"}
    refused = read("ESME_RINVDSTADR")
    assert refused == {"id": "u1", "level": 2, "stat": "REJECTD", "err": "ESME_RINVDSTADR"}
    kannel = read_callback(KANNEL, get("id=u1&type=16&reply=NACK%2F0x0000000b%2FInvalid+Dest"))
    assert (kannel["level"], kannel["stat"]) == (refused["level"], refused["stat"])
    assert kannel.get("err") == "0x0000000b"
    assert read_callback(JASMIN, get("id=u1&level=2&message_status=DELIVRD"))["stat"] == "DELIVRD"


def test_jasmin_decodes_form_encoding_and_utf8() -> None:
    fields = read_callback(JASMIN, get("id=u%201&level=2&text=Gr%C3%BC%C3%9Fe+aus+K%C3%B6ln%26"))
    assert (fields["id"], fields.get("text")) == ("u 1", "Grüße aus Köln&")


def test_jasmin_raw_non_ascii_bytes_in_the_query_are_read_as_utf8() -> None:
    """A query decoded as latin-1 (one character per byte) gives back the UTF-8 it carried."""
    raw = "id=u1&level=2&text=Köln".encode().decode("latin-1")
    assert read_callback(JASMIN, get(raw)).get("text") == "Köln"


def test_jasmin_missing_level_and_status_read_as_the_feed_carries_them() -> None:
    assert read_callback(JASMIN, get("id=u1")) == {"id": "u1", "level": 0, "stat": ""}


@pytest.mark.parametrize(
    ("callback", "words"),
    [
        (get("level=2&message_status=DELIVRD"), "no id"),
        (get("id=&level=2"), "id is empty"),
        (get("id=u1&level=two"), "level 'two' is not an integer"),
        (get("id=u1&level=-1"), "level '-1' is not an integer"),
        (get("id=u1&level=%EF%BC%91"), "level '\uff11' is not an integer"),
        (get("id=u1&level=4294967296"), "beyond 4294967295"),
        (get("id=u1&level=" + "9" * 50), "is not an integer"),
        (get("id=u1&id=u2&level=2"), "'id' is given twice"),
        (get("id=u1&level=1&level=2"), "'level' is given twice"),
        (get("id=u1&text=%FF"), "'text' is not UTF-8"),
        (Callback("PUT", "", None, b"id=u1"), "got a PUT"),
    ],
)
def test_jasmin_malformed_callbacks_say_what_is_wrong(callback: Callback, words: str) -> None:
    assert words in reason(JASMIN, callback)


def test_jasmin_ignores_parameters_it_does_not_read_even_repeated_or_undecodable() -> None:
    """The dlr-url may carry the sender's own parameters; they stay in the evidence (P9)."""
    fields = read_callback(JASMIN, get("t=1&t=2&x=%FF&id=u1&level=1&message_status=ESME_ROK"))
    assert fields == {"id": "u1", "level": 1, "stat": "ACCEPTD"}


# --- Kannel ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "level", "stat"),
    [
        ("1", 2, "DELIVRD"),
        ("2", 2, "UNDELIV"),
        ("4", 1, "ENROUTE"),
        ("8", 1, "ACCEPTD"),
        ("16", 2, "REJECTD"),
        ("34", 2, "EXPIRED"),
        ("66", 2, "UNKNOWN"),
    ],
)
def test_kannel_type_gives_level_and_stat_without_a_reply(kind: str, level: int, stat: str) -> None:
    assert read_callback(KANNEL, get(f"id=m1&type={kind}&reply=")) == {
        "id": "m1",
        "level": level,
        "stat": stat,
    }


def test_kannel_reply_stat_wins_over_the_type_and_fid_fills_a_missing_smsc_id() -> None:
    fields = read_callback(KANNEL, get("id=m1&type=2&reply=stat%3AEXPIRED+err%3A027&fid=F9"))
    assert fields == {
        "id": "m1",
        "level": 2,
        "stat": "EXPIRED",
        "err": "027",
        "smsc_message_id": "F9",
    }


def test_kannel_reply_id_wins_over_fid() -> None:
    fields = read_callback(KANNEL, get("id=m1&type=1&reply=id%3AR1+stat%3ADELIVRD&fid=F1"))
    assert fields.get("smsc_message_id") == "R1"


def test_kannel_reply_text_keeps_spaces_and_colons_and_labels_in_it() -> None:
    reply = "id:R1 submit date:2612030815 stat:DELIVRD err:000 Text:pin: 12 stat:FAKE"
    query = "id=m1&type=1&reply=" + reply.replace(":", "%3A").replace(" ", "+")
    fields = read_callback(KANNEL, get(query))
    assert (fields.get("text"), fields["stat"], fields.get("submit_date")) == (
        "pin: 12 stat:FAKE",
        "DELIVRD",
        "2612030815",
    )


def test_kannel_empty_escapes_are_absent_fields() -> None:
    """F4: an escape with nothing to say expands to nothing (gw/urltrans.c): absent."""
    fields = read_callback(KANNEL, get("id=m1&type=16&reply=&fid=&smsc=&to=&from="))
    assert fields == {"id": "m1", "level": 2, "stat": "REJECTD"}


def test_kannel_latin1_reply_is_read_and_flagged_not_refused() -> None:
    """One Latin-1 byte in the SMSC's reply (Kannel passes it on as it came) costs nothing:
    the receipt is read, the byte is a character, the field flagged (C4)."""
    reading = read_flagged(KANNEL, get("id=m1&type=1&reply=stat%3ADELIVRD+text%3ACaf%E9"))
    assert reading.fields == {"id": "m1", "level": 2, "stat": "DELIVRD", "text": "Café"}
    assert reading.flags == ("latin1:reply",)


def test_kannel_stat_from_the_type_alone_is_flagged_inferred() -> None:
    """Type 2 with an empty reply: Kannel's class of report, not the network's stat (P2)."""
    assert read_flagged(KANNEL, get("id=m1&type=2&reply=")).flags == (STAT_INFERRED,)
    assert read_flagged(KANNEL, get("id=m1&type=2&reply=stat%3AUNDELIV")).flags == ()
    assert read_flagged(KANNEL, get("id=m1&type=8&reply=ACK%2F")).flags == ()
    assert STAT_INFERRED == rules.STAT_INFERRED


def test_kannel_buffered_after_the_smsc_ack_is_another_observation() -> None:
    """Types 8 then 4: the acceptance and the buffered report differ in what they say, so the
    second is never a repeat of the first (its state stays visible)."""
    ack = read_callback(KANNEL, get("id=m1&type=8&reply=ACK%2F"))
    buffered = read_callback(KANNEL, get("id=m1&type=4&reply="))
    assert (ack["level"], ack["stat"]) == (1, "ACCEPTD")
    assert (buffered["level"], buffered["stat"]) == (1, "ENROUTE")


@pytest.mark.parametrize(
    ("fmt", "callback", "message_id"),
    [
        (GATEWAY, post(b'{"id":"E4","level":"2","stat":"DELIVRD"}'), "E4"),
        (GATEWAY, post(b'{"id":"E5","level":2,"stat":"DELI'), "E5"),
        (GATEWAY, post(b'{"level":2, "id": "E6", "text": "\xff"}'), "E6"),
        (GATEWAY, post(b"not json"), None),
        (JASMIN, get("id=u7&level=two"), "u7"),
        (KANNEL, get("id=m8&type=3"), "m8"),
        (KANNEL, get("id=m%E9&type=1"), "m\u00e9"),
    ],
)
def test_a_refused_callback_names_the_id_it_carries(
    fmt: CallbackFormat, callback: Callback, message_id: str | None
) -> None:
    """P24: a bad body whose id can be read is findable by that id."""
    with pytest.raises(MalformedCallback) as caught:
        read_callback(fmt, callback)
    assert caught.value.message_id == message_id


def test_kannel_reply_without_a_stat_leaves_the_types() -> None:
    fields = read_callback(KANNEL, get("id=m1&type=4&reply=id%3AR1+stat%3A+err%3A000"))
    assert (fields["stat"], fields.get("err")) == ("ENROUTE", "000")


@pytest.mark.parametrize(
    ("callback", "words"),
    [
        (get("type=1"), "no id"),
        (get("id=m1"), "no type"),
        (get("id=m1&type=3"), "type '3' is none of Kannel's report types"),
        (get("id=m1&type=01"), "type '01'"),
        (get("id=m1&type=1&type=2"), "'type' is given twice"),
        (get("id=m1&type=1&reply=stat%3ADELIVRD+stat%3AUNDELIV"), "gives 'stat' twice"),
        (get("id=m%E9&type=1"), "'id' is not UTF-8"),
        (Callback("POST", "id=m1&type=1", None, b""), "got a POST"),
    ],
)
def test_kannel_malformed_callbacks_say_what_is_wrong(callback: Callback, words: str) -> None:
    assert words in reason(KANNEL, callback)


# --- evidence ------------------------------------------------------------------------------


def test_evidence_of_a_query_beyond_latin1_is_its_utf8() -> None:
    """A server that decoded the request line as UTF-8: its bytes, recovered, never an error."""
    assert evidence(get("id=€")) == "id=€".encode()
    assert evidence(get("id=\ud800")) == b"id=\xed\xa0\x80"


def test_formats_module_is_pure() -> None:
    """No I/O, no asyncio, no HTTP framework: only these standard modules."""
    tree = ast.parse(Path(formats.__file__).read_text("utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "json", "dataclasses", "enum", "typing", "urllib.parse"}


def test_receipt_fields_are_the_receipts_fields_1_to_13() -> None:
    proto = [f.name for f in feed_pb2.Receipt.DESCRIPTOR.fields if f.number <= 13]
    assert list(ReceiptFields.__annotations__) == proto
    assert tuple(proto[2:]) == TEXT_FIELDS


# --- properties ----------------------------------------------------------------------------


@st.composite
def receipt_fields(draw: st.DrawFn) -> dict[str, str | int]:
    """Valid ReceiptFields: a non-empty id, any subset of the rest, any Unicode text."""
    fields: dict[str, str | int] = {"id": draw(st.text(min_size=1))}
    if draw(st.booleans()):
        fields["level"] = draw(st.integers(0, 2**32 - 1))
    for name in TEXT_FIELDS:
        if draw(st.booleans()):
            fields[name] = draw(st.text())
    return fields


@pytest.mark.fuzz
@examples(300)
@given(receipt_fields(), st.booleans(), st.dictionaries(st.text(), st.text(), max_size=3))
def test_gateway_reads_back_any_valid_body(
    fields: dict[str, str | int], ascii_only: bool, unknown: dict[str, str]
) -> None:
    """Any JSON body of valid fields (plus keys the Receipt lacks) reads back to its fields."""
    body: dict[str, object] = {k: v for k, v in unknown.items() if k not in RECEIPT_NAMES}
    body.update(fields)
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8")
    assert read_callback(GATEWAY, post(raw)) == {"level": 0, "stat": "", **fields}


_METHODS = st.sampled_from(["GET", "POST", "PUT"])
_QUERIES = st.text(st.characters(max_codepoint=0xFF))  # one character per byte, as received


@st.composite
def form_like(draw: st.DrawFn) -> bytes:
    """Form-ish bytes built from the names the adapters read, to get past their first checks."""
    names = ["level", "message_status", "connector", "text", "reply", "fid", "to"]
    values = st.one_of(
        st.sampled_from(["1", "2", "ESME_ROK", "", "%FF", "%3A"]),
        st.text().map(lambda t: t.replace("&", "%26")),
        st.just("id%3Ax+stat%3ADELIVRD+text%3Ay"),
    )
    pairs = draw(
        st.lists(st.tuples(st.sampled_from(names), values), max_size=8, unique_by=lambda p: p[0])
    )
    if draw(st.booleans()):  # Kannel's type, mostly one of its own
        kinds = st.sampled_from(["1", "2", "4", "8", "16", "34", "66"])
        pairs.append(("type", draw(st.one_of(kinds, values))))
    if draw(st.integers(0, 4)):  # mostly with an id, to get past the first check
        pairs.insert(draw(st.integers(0, len(pairs))), ("id", draw(st.text(min_size=1))))
    if pairs and draw(st.integers(0, 9)) == 0:
        pairs.append(pairs[0])  # now and then a repeat, which must be refused
    return "&".join(f"{n}={v}" for n, v in pairs).encode("utf-8")


@pytest.mark.fuzz
@examples(500)
@given(st.sampled_from(list(CallbackFormat)), _METHODS, _QUERIES, st.binary())
@example(GATEWAY, "POST", "", b"[" * 5000)
def test_arbitrary_callbacks_raise_nothing_but_malformed(
    fmt: CallbackFormat, method: str, query: str, body: bytes
) -> None:
    callback = Callback(method, query, None, body)
    assert isinstance(evidence(callback), bytes)
    assert_fields_or_one_line_reason(outcome(fmt, callback))


@pytest.mark.fuzz
@examples(500)
@given(st.sampled_from([JASMIN, KANNEL]), form_like(), st.booleans())
def test_form_like_callbacks_raise_nothing_but_malformed(
    fmt: CallbackFormat, data: bytes, by_get: bool
) -> None:
    # Kannel only ever GETs its dlr-url; Jasmin does either (`dlr-method`).
    callback = get(data.decode("latin-1")) if by_get or fmt is KANNEL else post(data, None)
    assert_fields_or_one_line_reason(outcome(fmt, callback))
