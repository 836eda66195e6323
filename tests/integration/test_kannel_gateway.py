"""A real Kannel calls `dlrfeed webhook --format kannel` back: bearerbox + smsbox (Debian's
`kannel`) with an SMPP link to a simulated SMSC, messages sent through smsbox's sendsms with
`dlr-mask=31` and the dlr-url of docs/webhook-formats.md. The SMSC accepts or refuses each
submit and returns its receipt; Kannel turns each into a dlr-url fetch; the test reads what the
store made of them (dlr.receptions, dlr.events, dlr.message_status).

Kannel fetches a dlr-url once (smsbox's `http-request-retry` is 0 by default): whatever the
receiver did not take is lost, so every report Kannel sent must be a stored reception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes

import asyncpg
import httpx
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed_tools.pgcluster import free_port
from support.kannel import SMSC_ID, Kannel, running_kannel
from support.smsc_simulator import (
    BIND_TRANSCEIVER,
    ESME_RINVDSTADR,
    Answer,
    Receipt,
    SmscSimulator,
)
from support.webhook_process import WebhookProcess, webhook_process

LOGIN = "acme"
SENDER = "12345"


def dlr_url(webhook: str, message_id: str) -> str:
    """The dlr-url docs/webhook-formats.md tells a Kannel sender to configure, for the
    receiver at `webhook`."""
    return (
        f"{webhook}/dlr?id={quote(message_id, safe='')}"
        "&type=%d&reply=%A&fid=%F&smsc=%i&to=%p&from=%P"
    )


@dataclass(frozen=True, slots=True)
class Case:
    message_id: str
    to: str
    answer: Answer
    reports: int
    """The dlr-url fetches Kannel makes for it with dlr-mask=31."""


@dataclass(frozen=True, slots=True)
class Rig:
    kannel: Kannel
    smsc: SmscSimulator
    webhook: WebhookProcess


DELIVERED = Case("k-delivered", "34600000001", Answer(receipt=Receipt("DELIVRD")), 2)
FAILED = Case("k-failed", "34600000002", Answer(receipt=Receipt("UNDELIV", err="001")), 2)
EXPIRED = Case("k-expired", "34600000003", Answer(receipt=Receipt("EXPIRED")), 2)
REFUSED = Case("k-refused", "34600000004", Answer(status=ESME_RINVDSTADR), 1)
LATIN_1 = Case(
    "k-latin-1", "34600000005", Answer(receipt=Receipt("DELIVRD", text=b"Caf\xe9 cr\xe8me")), 2
)
PLAN = {case.to: case.answer for case in (DELIVERED, FAILED, EXPIRED, REFUSED, LATIN_1)}
"""What the simulated SMSC does with a submit, by its destination."""


@pytest.fixture
async def rig(database_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    """The simulated SMSC, Kannel linked to it and `dlrfeed webhook --format kannel`."""
    smsc = SmscSimulator(lambda submit: PLAN[submit.destination_addr])
    async with (
        smsc.serving(),
        running_kannel(smsc.port, tmp_path) as kannel,
        webhook_process(database_url, tmp_path / "webhook.log", "--format", "kannel") as hook,
    ):
        yield Rig(kannel, smsc, hook)


async def _wait_until(
    predicate: Callable[[], Awaitable[bool]], what: str, within_s: float = 60
) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _send(rig: Rig, store: Store, db: asyncpg.Connection, cases: list[Case]) -> None:
    """Record each message, send it through Kannel, and wait until every report Kannel makes
    has been answered by the receiver (a reception or an exception in the store)."""
    await store.record_submissions([Submission(LOGIN, c.message_id, "+" + c.to) for c in cases])
    async with httpx.AsyncClient(timeout=30) as client:
        for case in cases:
            answer = await rig.kannel.send(
                client,
                sender=SENDER,
                to=case.to,
                text="hello",
                dlr_url=dlr_url(rig.webhook.url, case.message_id),
            )
            assert answer.status_code == 202, answer.text  # "0: Accepted for delivery"
    wanted = sum(c.reports for c in cases)

    async def all_answered() -> bool:
        taken = await db.fetchval(
            "SELECT (SELECT count(*) FROM dlr.receptions)"
            " + (SELECT count(*) FROM dlr.exceptions WHERE evidence IS NOT NULL)"
        )
        return bool(taken >= wanted)

    try:
        await _wait_until(all_answered, f"{wanted} reports from Kannel")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{rig.kannel.logs()}") from None


def _parameters(payload: bytes) -> dict[str, bytes]:
    """A dlr-url query as Kannel filled it in: each parameter's value, percent-decoded bytes."""
    pairs = (pair.partition(b"=") for pair in payload.split(b"&"))
    return {name.decode(): unquote_to_bytes(value.replace(b"+", b" ")) for name, _, value in pairs}


async def _receptions(db: asyncpg.Connection) -> dict[tuple[str, int], dict[str, bytes]]:
    """(message id, level) → the parameters of its one reception, each taken by the webhook
    and applied — or, for Kannel's type 8, recorded as late progress: smsbox fetches a
    message's dlr-urls concurrently, so its ACK may arrive after the result (F13)."""
    rows = await db.fetch(
        "SELECT message_id, level, channel::text, outcome, payload FROM dlr.receptions"
    )
    assert {r["channel"] for r in rows} == {"webhook"}
    for row in rows:
        taken = {"applied", "late_progress"} if row["level"] == 1 else {"applied"}
        assert row["outcome"] in taken, dict(row)
    found = {(r["message_id"], r["level"]): _parameters(bytes(r["payload"])) for r in rows}
    assert len(found) == len(rows), "a report stored twice"
    return found


async def test_kannel_reports_deliveries_failures_expiries_and_refused_submits(
    rig: Rig, store: Store, db: asyncpg.Connection
) -> None:
    """Every report of dlr-mask=31 Kannel sends is one stored reception, and each message ends
    with the status its network reported: delivered, undeliverable, expired, and a submit the
    SMSC refused (Kannel's NACK, type 16) rejected."""
    cases = [DELIVERED, FAILED, EXPIRED, REFUSED]
    await _send(rig, store, db, cases)

    assert rig.smsc.binds == [BIND_TRANSCEIVER]  # transceiver-mode: one link both ways

    async def receipts_answered() -> bool:
        return rig.smsc.receipts_answered == len(rig.smsc.receipts) == 3

    await _wait_until(receipts_answered, "Kannel to answer every deliver_sm")
    ids = dict(rig.smsc.submits)  # message id given → submit; "" for the refused one
    by_to = {submit.destination_addr: smsc_id for smsc_id, submit in rig.smsc.submits}
    assert ids[""].destination_addr == REFUSED.to
    assert all(submit.registered_delivery & 1 for submit in ids.values())  # a receipt asked for
    receptions = await _receptions(db)
    assert sorted(receptions) == sorted(
        [(c.message_id, 1) for c in cases if c is not REFUSED] + [(c.message_id, 2) for c in cases]
    )
    for case in cases:
        smsc_id = by_to[case.to]
        final = receptions[(case.message_id, 2)]
        assert final["smsc"] == SMSC_ID.encode()
        assert final["to"] == case.to.encode()
        assert final["from"] == SENDER.encode()
        if case is REFUSED:
            assert (final["type"], final["fid"]) == (b"16", b"")
            assert final["reply"] == b"NACK/0x0000000b/Invalid Destination Address"
            continue
        accepted = receptions[(case.message_id, 1)]
        assert (accepted["type"], accepted["reply"], accepted["fid"]) == (
            b"8",
            b"ACK/",
            smsc_id.encode(),
        )
        # The SMSC's receipt, byte for byte as it sent it, is the evidence kept (P6, P9).
        assert final["reply"] == rig.smsc.receipts[smsc_id]
        assert final["fid"] == smsc_id.encode()
    assert {r["type"] for (mid, level), r in receptions.items() if level == 2} == {
        b"1",
        b"2",
        b"34",
        b"16",
    }

    events = {
        (r["message_id"], r["level"]): (r["stat"], r["status"], r["err"])
        for r in await db.fetch("SELECT message_id, level, stat, status, err FROM dlr.events")
    }
    assert events == {
        (DELIVERED.message_id, 1): ("ACCEPTD", "ACCEPTED", None),
        (DELIVERED.message_id, 2): ("DELIVRD", "DELIVERED", "000"),
        (FAILED.message_id, 1): ("ACCEPTD", "ACCEPTED", None),
        (FAILED.message_id, 2): ("UNDELIV", "UNDELIVERABLE", "001"),
        (EXPIRED.message_id, 1): ("ACCEPTD", "ACCEPTED", None),
        (EXPIRED.message_id, 2): ("EXPIRED", "EXPIRED", "000"),
        (REFUSED.message_id, 2): ("REJECTD", "REJECTED", "0x0000000b"),
    }
    statuses = {
        r["message_id"]: (r["status"], r["is_final"])
        for r in await db.fetch("SELECT message_id, status, is_final FROM dlr.message_status")
    }
    assert statuses == {
        DELIVERED.message_id: ("DELIVERED", True),
        FAILED.message_id: ("UNDELIVERABLE", True),
        EXPIRED.message_id: ("EXPIRED", True),
        REFUSED.message_id: ("REJECTED", True),
    }
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0


async def test_a_latin_1_receipt_text_from_kannel_is_stored_and_flagged(
    rig: Rig, store: Store, db: asyncpg.Connection
) -> None:
    """A receipt whose `text:` holds Latin-1 bytes (an SMSC in its own charset; Kannel passes
    the reply on byte for byte): the result still counts, the bytes are kept as they came and
    the odd field is flagged, never a 400 that Kannel would not retry."""
    await _send(rig, store, db, [LATIN_1])
    ((smsc_id, _),) = rig.smsc.submits
    receptions = await _receptions(db)
    assert sorted(receptions) == [(LATIN_1.message_id, 1), (LATIN_1.message_id, 2)]
    final = receptions[(LATIN_1.message_id, 2)]
    assert final["reply"] == rig.smsc.receipts[smsc_id]
    assert final["reply"].endswith(b"text:Caf\xe9 cr\xe8me")
    status = await db.fetchrow(
        "SELECT status, is_final FROM dlr.message_status WHERE message_id = $1",
        LATIN_1.message_id,
    )
    assert status is not None
    assert (status["status"], status["is_final"]) == ("DELIVERED", True)
    flags = await db.fetchval(
        "SELECT array_cat(r.flags, e.flags) FROM dlr.receptions AS r"
        " JOIN dlr.events AS e ON (e.message_id, e.level) = (r.message_id, r.level)"
        " WHERE r.message_id = $1 AND r.level = 2",
        LATIN_1.message_id,
    )
    assert flags, "the Latin-1 text is not flagged"
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions WHERE message_id = ''") == 0


async def test_kannel_fetches_again_what_the_receiver_was_down_for_with_http_request_retry(
    database_url: str, store: Store, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """smsbox set as docs/webhook-formats.md advises (`http-request-retry`, `http-queue-delay`)
    fetches a dlr-url again after a failure: reports made while the receiver is down (a
    restart, a deploy) are stored once it is up, each once."""
    port = free_port()
    smsc = SmscSimulator(lambda submit: PLAN[submit.destination_addr])
    retry = {"http-request-retry": "120", "http-queue-delay": "1"}
    await store.record_submissions([Submission(LOGIN, DELIVERED.message_id, "+" + DELIVERED.to)])
    async with smsc.serving(), running_kannel(smsc.port, tmp_path, smsbox=retry) as kannel:
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await kannel.send(
                client,
                sender=SENDER,
                to=DELIVERED.to,
                text="hello",
                dlr_url=dlr_url(f"http://127.0.0.1:{port}", DELIVERED.message_id),
            )
        assert answer.status_code == 202, answer.text

        async def both_refused_and_retried() -> bool:
            return kannel.smsbox_log().count("HTTP: Retrying request") >= 2

        await _wait_until(both_refused_and_retried, "smsbox to retry both reports")
        assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
        log = tmp_path / "webhook.log"
        async with webhook_process(database_url, log, "--format", "kannel", port=port):

            async def both_stored() -> bool:
                return bool(await db.fetchval("SELECT count(*) FROM dlr.receptions") >= 2)

            await _wait_until(both_stored, "the retried reports to be stored")
    receptions = await _receptions(db)
    assert sorted(receptions) == [(DELIVERED.message_id, 1), (DELIVERED.message_id, 2)]
    status = await db.fetchval("SELECT status FROM dlr.message_status")
    assert status == "DELIVERED"
