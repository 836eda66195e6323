"""The callback formats `dlrfeed webhook` reads: one HTTP callback in, the Receipt's fields out.

Pure (no I/O): the server hands over a `Callback` as received; `evidence` names the bytes kept
as the reception's raw payload (P6, P9) and `read_callback` maps them onto the Receipt fields
1-13 (docs/spec/interfaces.md §1, F4). Nothing here parses a date or normalises a status: the
fields go to the same parse as the feed's, which keeps and flags what is odd (C4). A callback
that cannot be read as a receipt at all raises `MalformedCallback`, whose text is the reason
kept beside the evidence. The mapping of each format, with its sources, is
docs/webhook-formats.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, TypedDict, assert_never, cast
from urllib.parse import unquote_to_bytes

REFUSED_SUBMIT_STAT = "REJECTD"
"""The one outcome of a submit the SMSC refused, whichever gateway says it (Jasmin's level-1
`ESME_R*` error, Kannel's NACK, type 16): a result (level 2), `REJECTD`, its `err` the refusal
code as the gateway gave it (docs/webhook-formats.md, "A refused submit")."""
STAT_INFERRED = "stat_inferred"
"""The flag of a stat the gateway inferred from its class of report, none reported."""


class CallbackFormat(StrEnum):
    """Whose callback a `dlrfeed webhook` endpoint takes (`--format`)."""

    GATEWAY = "gateway"
    JASMIN = "jasmin"
    KANNEL = "kannel"


@dataclass(frozen=True, slots=True)
class Callback:
    """One HTTP callback as received: what the adapters read."""

    method: str
    """"GET" or "POST"."""
    query: str
    """The raw query string (after '?'), percent-encoded as received, "" if none: one character
    per byte of the request line (decoded as latin-1, as ASGI servers hand it over)."""
    content_type: str | None
    """The Content-Type header as sent (may carry "; charset=..."). No adapter needs it: the
    gateway's body is read as JSON whatever it says (gateways are sloppy, and JSON is UTF-8 by
    RFC 8259), and form encodings are ASCII on the wire, their bytes UTF-8."""
    body: bytes
    """The request body, b"" for a GET."""


class MalformedCallback(ValueError):  # noqa: N818  # the API the webhook server is built on
    """The callback cannot be read as a receipt; str(exc) is a one-line reason for the evidence.

    `message_id` is the id the callback names when one can be read all the same, so that the
    kept evidence is found by it (P24: a bad body whose id can be read is findable by that id).
    """

    def __init__(self, reason: str, message_id: str | None = None) -> None:
        super().__init__(reason)
        self.message_id = message_id


class Reading(NamedTuple):
    """A callback read: its Receipt fields, and flags naming what was odd in reading them
    (`latin1:<field>`: not UTF-8, read as Latin-1; `stat_inferred`: a stat the gateway
    inferred, not one the network reported). The flags join the parse's (C4)."""

    fields: ReceiptFields
    flags: tuple[str, ...]


class ReceiptFields(TypedDict, total=False):
    """The Receipt fields 1-13 a callback carries (docs/spec/interfaces.md §1). `read_callback`
    always sets `id`, `level` and `stat`; an optional field is left out when the callback has
    nothing to say (F4: absent, not empty)."""

    id: str
    level: int
    stat: str
    err: str
    sub: str
    dlvrd: str
    submit_date: str
    done_date: str
    text: str
    source_addr: str
    destination_addr: str
    smsc_message_id: str
    connector: str


TEXT_FIELDS: tuple[str, ...] = tuple(
    name for name in ReceiptFields.__annotations__ if name not in ("id", "level")
)
"""The Receipt's text fields: every field but `id` and `level` is a string (F4)."""


def evidence(callback: Callback) -> bytes:
    """The bytes kept, byte for byte, as the reception's raw payload (P6, P9).

    A GET carries its receipt in the query string, so that is kept; any other method carries it
    in the body. The method and path are how the callback reached us, not what the gateway
    said, so they are not evidence of the receipt. `read_callback` reads these same bytes.
    """
    if callback.method != "GET":
        return callback.body
    try:
        return callback.query.encode("latin-1")
    except UnicodeEncodeError:
        # A server that decoded the request line as UTF-8 hands over characters past U+00FF;
        # encoding back to UTF-8 then restores its bytes (surrogatepass: never raise here).
        return callback.query.encode("utf-8", "surrogatepass")


def read_callback(fmt: CallbackFormat, callback: Callback) -> ReceiptFields:
    """The Receipt fields of one callback in format `fmt`; MalformedCallback when it has none."""
    return read_flagged(fmt, callback).fields


def read_flagged(fmt: CallbackFormat, callback: Callback) -> Reading:
    """The Receipt fields of one callback in format `fmt` and what was odd in them;
    MalformedCallback when it has none.

    Only what cannot be a receipt is refused: no usable `id` (P10: nothing to correlate on),
    a body or query that cannot be decoded, an ambiguous repeat of a field, a value of the
    wrong type. Odd but readable content (a level 0, an unknown stat, a Kannel reply in
    Latin-1) is passed on, for the parse to keep and flag (C4, P17). A refused callback names
    the id it carries when one can be read (P24).
    """
    flags: list[str] = []
    try:
        match fmt:
            case CallbackFormat.GATEWAY:
                fields = _read_gateway(callback)
            case CallbackFormat.JASMIN:
                fields = _read_jasmin(callback)
            case CallbackFormat.KANNEL:
                fields = _read_kannel(callback, flags)
            case _:
                assert_never(fmt)
    except MalformedCallback as exc:
        if exc.message_id is None:
            exc.message_id = readable_id(fmt, callback)
        raise
    return Reading(fields, tuple(flags))


def readable_id(fmt: CallbackFormat, callback: Callback) -> str | None:
    """The id a callback names, read as leniently as its format allows, or None: for the
    evidence of a callback that cannot be read as a receipt (P24). Never raises."""
    if fmt is CallbackFormat.GATEWAY:
        text = callback.body.decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):
            return _id_of_json_prefix(text)
        found = body.get("id") if isinstance(body, dict) else None
        return found if isinstance(found, str) and found else None
    for pair in evidence(callback).split(b"&"):
        name, _, value = pair.partition(b"=")
        if unquote_to_bytes(name.replace(b"+", b" ")) == b"id":
            decoded = unquote_to_bytes(value.replace(b"+", b" "))
            try:
                return decoded.decode("utf-8") or None
            except UnicodeDecodeError:
                return decoded.decode("latin-1")
    return None


def _id_of_json_prefix(text: str) -> str | None:
    """The string value of the first `"id"` key of a JSON text that does not parse as a whole
    (cut at --max-body-bytes, or broken further on)."""
    start = text.find('"id"')
    while start >= 0:
        rest = text[start + 4 :].lstrip()
        if rest.startswith(":"):
            try:
                value, _ = json.JSONDecoder().raw_decode(rest[1:].lstrip())
            except (ValueError, RecursionError):
                return None
            return value if isinstance(value, str) and value else None
        start = text.find('"id"', start + 4)
    return None


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


def _shown(value: str) -> str:
    """A value quoted for a one-line reason: repr (newlines escaped), long ones cut."""
    return repr(_cut(value))


def _required_id(value: str | None) -> str:
    if value is None:
        raise MalformedCallback("no id: nothing to correlate the receipt on (P10)")
    if not value:
        raise MalformedCallback("the id is empty: nothing to correlate the receipt on (P10)")
    return value


# --- the gateway's own webhook: a JSON object, one key per Receipt field (F4) ----------------

_MAX_LEVEL = 2**32 - 1  # `level` is a uint32 in the Receipt (docs/spec/interfaces.md §1)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {_cut(repr(value))}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string"


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """`object_pairs_hook`: a key given twice is ambiguous evidence, never last-one-wins."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedCallback(f"the JSON key {_shown(key)} appears twice")
            seen.add(key)
    return found


def _text_field(name: str, value: object) -> str:
    if value is None:
        raise MalformedCallback(f"{name} is null: a field with no value is left out (F4)")
    if not isinstance(value, str):
        raise MalformedCallback(f"{name} must be a string, got {_json_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Only a \u escape of a lone surrogate gets here (the body itself was strict UTF-8);
        # the Receipt's strings are UTF-8, so no gateway receipt carries one.
        raise MalformedCallback(f"{name} escapes a lone surrogate, not a character") from None
    return value


def _read_gateway(callback: Callback) -> ReceiptFields:
    if callback.method != "POST":
        raise MalformedCallback(f"the gateway posts its JSON body; got a {callback.method}")
    try:
        body = json.loads(callback.body.decode("utf-8"), object_pairs_hook=_unique_keys)
    except MalformedCallback:
        raise
    except UnicodeDecodeError as exc:
        raise MalformedCallback(f"the body is not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise MalformedCallback("the body is JSON nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise MalformedCallback(f"the body is not JSON: {exc.msg} (char {exc.pos})") from None
    except ValueError:  # an integer past Python's limit on digits (sys.get_int_max_str_digits)
        raise MalformedCallback(
            "the body is not JSON dlrfeed can read: a number too long"
        ) from None
    if not isinstance(body, dict):
        raise MalformedCallback(f"the body is {_json_kind(body)}, not a JSON object")
    fields: dict[str, str | int] = {
        "id": _required_id(_text_field("id", body["id"]) if "id" in body else None)
    }
    # F4: level and stat are plain proto3 fields, so the feed carries 0 and "" for a missing
    # one; a callback without them reads the same, and the parse flags them (P17).
    level = body.get("level", 0)
    if level is None:
        raise MalformedCallback("level is null: a field with no value is left out (F4)")
    if type(level) is not int or not 0 <= level <= _MAX_LEVEL:
        raise MalformedCallback(
            f"level must be an integer in 0..{_MAX_LEVEL}, got {_json_kind(level)}"
        )
    fields["level"] = level
    fields["stat"] = ""
    for name in TEXT_FIELDS:
        if name in body:
            fields[name] = _text_field(name, body[name])
    # Unknown keys are not read; they stay in the evidence (P9).
    return cast("ReceiptFields", fields)


# --- form encodings: Jasmin's body or query, Kannel's dlr-url query -------------------------


def _form(
    data: bytes,
    names: dict[bytes, str],
    latin1: frozenset[str] = frozenset(),
    flags: list[str] | None = None,
) -> dict[str, str]:
    """The parameters of a form-encoded body or query that are in `names` (wire name → name).

    `+` is a space and `%XX` a byte, as urllib.parse reads a form; the bytes of a value are
    UTF-8, strictly, except for the parameters in `latin1`: one of those that is not UTF-8 is
    read as Latin-1 (every byte a character, nothing lost) and flagged `latin1:<name>` in
    `flags`. A parameter given twice is ambiguous and refused; others are ignored without
    being decoded (they stay in the evidence, P9).
    """
    found: dict[str, str] = {}
    for pair in data.split(b"&"):
        raw_name, _, raw_value = pair.partition(b"=")
        name = names.get(unquote_to_bytes(raw_name.replace(b"+", b" ")))
        if name is None:
            continue
        if name in found:
            raise MalformedCallback(f"the parameter {name!r} is given twice")
        value = unquote_to_bytes(raw_value.replace(b"+", b" "))
        try:
            found[name] = value.decode("utf-8")
        except UnicodeDecodeError:
            if name not in latin1 or flags is None:
                raise MalformedCallback(
                    f"the parameter {name!r} is not UTF-8 once percent-decoded"
                ) from None
            found[name] = value.decode("latin-1")
            flags.append(f"latin1:{name}")
    return found


def _wire_names(*names: str) -> dict[bytes, str]:
    return {name.encode("ascii"): name for name in names}


# --- Jasmin: its DLRThrower's callback (jasmin/routing/throwers.py, docs "Receiving DLR") ----

# Jasmin name → Receipt field, for the fields taken as they are. `level` and `message_status`
# are read apart, and `connector` only at level 1 (see _read_jasmin).
_JASMIN_RENAMED = (
    ("id_smsc", "smsc_message_id"),
    ("sub", "sub"),
    ("dlvrd", "dlvrd"),
    ("subdate", "submit_date"),
    ("donedate", "done_date"),
    ("err", "err"),
    ("text", "text"),
)
_JASMIN_NAMES = _wire_names(
    "id", "level", "message_status", "connector", *(name for name, _ in _JASMIN_RENAMED)
)


def _read_jasmin(callback: Callback) -> ReceiptFields:
    # `dlr-method` chooses: a POST sends the parameters as a form body, a GET in the query.
    if callback.method not in ("GET", "POST"):
        raise MalformedCallback(f"Jasmin calls back with GET or POST; got a {callback.method}")
    form = _form(evidence(callback), _JASMIN_NAMES)
    fields: dict[str, str | int] = {"id": _required_id(form.get("id"))}
    # Jasmin's level is the level of this receipt: 1 for the SMSC's answer to the submit
    # (submit_sm_resp), 2 for the handset receipt (deliver_sm), whatever dlr-level asked for
    # (jasmin/managers/dlr.py). That is dlrfeed's progress and result (F4).
    raw_level = form.get("level")
    if raw_level is None:
        level = 0  # as for the gateway: the parse flags it (P17)
    elif raw_level.isascii() and raw_level.isdigit() and len(raw_level) <= 10:
        level = int(raw_level)
        if level > _MAX_LEVEL:
            raise MalformedCallback(f"level {_shown(raw_level)} is beyond {_MAX_LEVEL}")
    else:
        raise MalformedCallback(f"level {_shown(raw_level)} is not an integer")
    fields["level"] = level
    # At level 1 `message_status` is the SMPP command status of submit_sm_resp, not a receipt
    # stat. ESME_ROK is the SMSC's acceptance, which Jasmin itself reports to its SMPP clients
    # as ACCEPTD (jasmin/protocols/smpp/operations.py, getReceipt). Any other ESME_R* status
    # is the SMSC refusing the submit: no receipt can follow, so it is the message's result,
    # the refused submit (REFUSED_SUBMIT_STAT at level 2, the status as `err`), as Kannel's
    # NACK is (type 16).
    status = form.get("message_status", "")
    refused = level == 1 and status.startswith("ESME_R") and status != "ESME_ROK"
    if refused:
        fields["level"] = 2
        fields["stat"] = REFUSED_SUBMIT_STAT
        fields["err"] = status
    else:
        fields["stat"] = "ACCEPTD" if level == 1 and status == "ESME_ROK" else status
    for name, field in _JASMIN_RENAMED:
        if name in form and field not in fields:
            fields[field] = form[name]
    # At level 2 Jasmin fills `connector` with the receipt's own message id, not the connector
    # (dlr.py passes dlr_connector=pdu_dlr_id): only level 1 (a refused submit included)
    # names the connector. The level-2 value stays in the evidence (P9).
    if level == 1 and "connector" in form:
        fields["connector"] = form["connector"]
    return cast("ReceiptFields", fields)


# --- Kannel: the dlr-url the sender configures, filled in by smsbox (docs/webhook-formats.md) --

# The delivery report type, Kannel's `%d` (gw/dlr.h) → (level, stat when the SMSC's reply
# carries none, whether the report is the SMSC's answer to the submit). The reply's own stat
# wins (_read_kannel). For a report of the network (1, 2, 4, 34, 66) a stat taken from the type
# alone is Kannel's inference from its class of report, not the network's word: it is flagged
# `stat_inferred`, never labelled as reported by the network (P2). The answers to the submit
# (8, 16) carry no receipt stat at all: theirs is this mapping's documented name for them.
_KANNEL_TYPES: dict[str, tuple[int, str, bool]] = {
    # DLR_SUCCESS, "delivered to phone": the network's result. Kannel's SMPP driver sends it
    # for a DELIVRD receipt (gw/smsc/smsc_smpp.c, handle_dlr).
    "1": (2, "DELIVRD", False),
    # DLR_FAIL, "non-delivered to phone": Kannel sends it for every failed receipt (UNDELIV,
    # REJECTD, DELETED, UNKNOWN, any unknown stat), so without the reply only the generic
    # failure, UNDELIV, is certain, and it is Kannel's class, not the network's stat.
    "2": (2, "UNDELIV", False),
    # DLR_BUFFERED, "queued on SMSC": sent for an ACCEPTD or ENROUTE receipt (or the SMPP
    # message states ENROUTE and ACCEPTED): the message waits in the network, progress.
    "4": (1, "ENROUTE", False),
    # DLR_SMSC_SUCCESS, "delivered to SMSC": the SMSC accepted the submit (its reply is
    # "ACK/..."): acceptance, not delivery (P3), progress. Its own stat, so that a buffered
    # report (4) after it is a new observation, never a repeat of the acceptance.
    "8": (1, "ACCEPTD", True),
    # DLR_SMSC_FAIL, "non-delivered to SMSC": the SMSC refused the submit ("NACK/..."), or
    # Kannel gave up sending it (gw/bb_smscconn.c): no receipt can follow, so a result, the
    # refused submit, as Jasmin's level-1 ESME_R* error is.
    "16": (2, REFUSED_SUBMIT_STAT, True),
    # DLR_EXPIRED = 0x20|DLR_FAIL (Kannel 1.4.5 on): the SMSC's validity period ran out.
    "34": (2, "EXPIRED", False),
    # DLR_UNKNOWN = 0x40|DLR_FAIL (Kannel 1.4.5 on: its Clickatell driver, for a status it
    # does not know): final by its failure bit, its outcome unknown, which UNKNOWN says.
    "66": (2, "UNKNOWN", False),
}
# In a report %p is the message's receiver and %P its sender: dlr.c builds the report with the
# submit's sender and receiver, and smsbox swaps them only for a mobile-originated message.
_KANNEL_RENAMED = (("to", "destination_addr"), ("from", "source_addr"), ("smsc", "connector"))
_KANNEL_NAMES = _wire_names("id", "type", "reply", "fid", *(name for name, _ in _KANNEL_RENAMED))
_KANNEL_LATIN1 = frozenset({"reply", "fid", "smsc", "to", "from"})  # all but what we correlate on
# The SMSC's reply (%A) in SMPP v3.4 Appendix B form: label → Receipt field. "submit date" and
# "done date" hold a space, so _appendix_b joins them first.
_APPENDIX_B = {
    "id": "smsc_message_id",
    "sub": "sub",
    "dlvrd": "dlvrd",
    "submit_date": "submit_date",
    "done_date": "done_date",
    "stat": "stat",
    "err": "err",
}


def _appendix_b(reply: str) -> dict[str, str]:
    """The fields of an SMPP receipt text `id:... sub:... dlvrd:... submit date:... done
    date:... stat:... err:... text:...`; none for another reply (Kannel's "ACK/", "NACK/...").

    `text:` runs to the end (it may hold spaces and colons); the labels before it are
    space-separated `label:value` tokens, in any order, unknown ones skipped. A label given
    twice is ambiguous and refused.
    """
    cut = reply.find("text:")
    if cut < 0:
        cut = reply.find("Text:")  # some SMSCs capitalise it; Jasmin's parser allows both
    head = reply if cut < 0 else reply[:cut]
    head = head.replace("submit date:", "submit_date:").replace("done date:", "done_date:")
    found: dict[str, str] = {}
    for token in head.split():
        label, colon, value = token.partition(":")
        field = _APPENDIX_B.get(label) if colon else None
        if field is None:
            continue
        if field in found:
            raise MalformedCallback(f"the SMSC's reply gives {label!r} twice")
        found[field] = value
    if cut >= 0:
        found["text"] = reply[cut + 5 :]
    return found


def _read_kannel(callback: Callback, flags: list[str]) -> ReceiptFields:
    # smsbox fetches every dlr-url with GET (gw/smsbox.c: a report is TRANSTYPE_GET_URL).
    if callback.method != "GET":
        raise MalformedCallback(f"Kannel fetches its dlr-url with GET; got a {callback.method}")
    # An escape with nothing to substitute expands to nothing (gw/urltrans.c), so an empty
    # parameter is an absent field (F4). Kannel passes the SMSC's reply (%A) and the
    # addresses on byte for byte, in whatever charset the SMSC used: such a value that is not
    # UTF-8 is read as Latin-1 and flagged, never refused (the receipt would be lost).
    form = {
        k: v
        for k, v in _form(evidence(callback), _KANNEL_NAMES, _KANNEL_LATIN1, flags).items()
        if v
    }
    message_id = _required_id(form.get("id"))
    kind = form.get("type")
    if kind is None:
        raise MalformedCallback("no type: the dlr-url lacks type=%d, the report's type")
    known = _KANNEL_TYPES.get(kind)
    if known is None:
        raise MalformedCallback(
            f"type {_shown(kind)} is none of Kannel's report types 1, 2, 4, 8, 16, 34, 66"
        )
    level, stat, answers_submit = known
    fields: dict[str, str | int] = {"id": message_id, "level": level, "stat": stat}
    reply = form.get("reply", "")
    if answers_submit:
        # "NACK/0x0000000b/Invalid Destination Address": the SMSC's refusal code is the err,
        # as reported (P17: never translated); the rest stays in the evidence.
        code = reply.removeprefix("NACK/").partition("/")[0] if reply.startswith("NACK/") else ""
        if code:
            fields["err"] = code
    else:
        receipt = _appendix_b(reply)
        if not receipt.get("stat"):
            receipt.pop("stat", None)  # an empty stat says nothing: the type's stands
            flags.append(STAT_INFERRED)
        fields.update(receipt)
    if not fields.get("smsc_message_id") and "fid" in form:
        fields["smsc_message_id"] = form["fid"]  # %F: the id Kannel matched the receipt by
    for name, field in _KANNEL_RENAMED:
        if name in form:
            fields[field] = form[name]
    return cast("ReceiptFields", fields)
