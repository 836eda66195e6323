"""Jasmin's DLR callbacks, thrown exactly as Jasmin throws them (treq on Twisted, the versions
Jasmin pins: tests/support/jasmin_thrower.py), at `dlrfeed webhook --format jasmin`
running as its own process. The arguments are those a real Jasmin 0.11.0 sent for the same
outcomes (docs/webhook-formats.md, "Proven against the gateways").

Jasmin keeps a callback until the answer is `ACK/Jasmin` and throws it again otherwise, so the
receiver must never say `ACK/Jasmin` for a receipt it has not committed, and must say it for
each one it has.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed_tools.paths import REPO
from support.webhook_process import WebhookProcess, webhook_process

# Run as a script in its own process: treq and Twisted stay out of the test process.
JASMIN_THROWER = Path(__file__).resolve().parents[1] / "support" / "jasmin_thrower.py"
LOGIN = "acme"
CONNECTOR = "smsc-sim"
# Jasmin's message ids are UUIDs (its /send answers `Success "<uuid>"`).
DELIVERED_ID = "3f1c2a9e-5b7d-4e61-9a0f-1c2d3e4f5a60"
FAILED_ID = "3f1c2a9e-5b7d-4e61-9a0f-1c2d3e4f5a61"
EXPIRED_ID = "3f1c2a9e-5b7d-4e61-9a0f-1c2d3e4f5a62"
REFUSED_ID = "3f1c2a9e-5b7d-4e61-9a0f-1c2d3e4f5a63"


def level_1(message_id: str, status: str = "ESME_ROK") -> dict[str, Any]:
    """The SMSC's answer to the submit (jasmin/managers/dlr.py, submit_sm_resp_event): the
    connector's id; `level` an int, as Jasmin holds it."""
    return {"id": message_id, "level": 1, "message_status": status, "connector": CONNECTOR}


def level_2(message_id: str, receipt_id: str, stat: str, err: str, text: str) -> dict[str, Any]:
    """The handset receipt (dlr.py, deliver_sm_dlr_callback): `connector` holds the receipt's
    own id as the SMSC wrote it, `id_smsc` Jasmin's coding of it (upper case, no leading
    zeros), the dates as the receipt wrote them."""
    return {
        "id": message_id,
        "level": 2,
        "message_status": stat,
        "connector": receipt_id,
        "id_smsc": receipt_id.upper().lstrip("0"),
        "sub": "001",
        "dlvrd": "001" if stat == "DELIVRD" else "000",
        "subdate": "2612050810",
        "donedate": "2612050811",
        "err": err,
        "text": text,
    }


CALLBACKS = [
    level_1(DELIVERED_ID),
    level_2(DELIVERED_ID, "5e000000", "DELIVRD", "000", "Café crème"),
    level_1(FAILED_ID),
    level_2(FAILED_ID, "5e000001", "UNDELIV", "001", "hello"),
    level_1(EXPIRED_ID),
    level_2(EXPIRED_ID, "5e000002", "EXPIRED", "000", "hello"),
]


async def _wait_until(
    predicate: Callable[[], Awaitable[bool]], what: str, within_s: float = 60
) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _start_thrower(
    webhook: WebhookProcess, method: str, callbacks: list[dict[str, Any]], out: Path
) -> asyncio.subprocess.Process:
    with out.open("wb") as log:
        thrower = await asyncio.create_subprocess_exec(
            sys.executable, str(JASMIN_THROWER), f"{webhook.url}/dlr", method,
            "--retry-delay", "0.2", "--max-retries", "300", "--http-timeout", "30",
            stdin=asyncio.subprocess.PIPE, stdout=log, stderr=log, cwd=REPO,
        )  # fmt: skip
    assert thrower.stdin is not None
    thrower.stdin.write(b"".join(json.dumps(c).encode() + b"\n" for c in callbacks))
    thrower.stdin.close()
    return thrower


def _tail(out: Path) -> str:
    return out.read_text(errors="replace")[-3000:]


def _attempts(out: Path) -> list[dict[str, Any]]:
    """The thrower's attempts so far, one JSON line each (a line still being written is not)."""
    lines = out.read_bytes().split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line.startswith(b"{")]


async def _throw(
    webhook: WebhookProcess, method: str, callbacks: list[dict[str, Any]], out: Path
) -> list[dict[str, Any]]:
    thrower = await _start_thrower(webhook, method, callbacks, out)
    assert await asyncio.wait_for(thrower.wait(), 120) == 0, _tail(out)
    return _attempts(out)


def _form(payload: bytes, method: str) -> dict[str, str]:
    pairs = parse_qsl(payload.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    assert len(pairs) == len(dict(pairs)), f"a parameter given twice by {method}"
    return dict(pairs)


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_jasmin_callbacks_are_acked_once_each_and_stored(
    database_url: str, store: Store, db: asyncpg.Connection, tmp_path: Path, method: str
) -> None:
    """Each callback, by `dlr-method` POST (a form body) or GET (the query), is answered
    `ACK/Jasmin` at its first throw and is one stored reception whose evidence is what Jasmin
    sent; each message ends with the status its network reported."""
    ids = [DELIVERED_ID, FAILED_ID, EXPIRED_ID]
    await store.record_submissions([Submission(LOGIN, i, "+34600000001") for i in ids])
    async with webhook_process(
        database_url, tmp_path / "webhook.log", "--format", "jasmin"
    ) as webhook:
        attempts = await _throw(webhook, method, CALLBACKS, tmp_path / "thrower.out")
    assert [(a["id"], a["attempt"], a["code"], a["body"]) for a in attempts] == [
        (c["id"], 1, 200, "ACK/Jasmin") for c in CALLBACKS
    ]

    rows = await db.fetch(
        "SELECT message_id, level, channel::text, outcome, payload FROM dlr.receptions ORDER BY id"
    )
    assert [(r["message_id"], r["level"], r["channel"]) for r in rows] == [
        (c["id"], c["level"], "webhook") for c in CALLBACKS
    ]
    assert {r["outcome"] for r in rows} == {"applied"}
    for row, sent in zip(rows, CALLBACKS, strict=True):
        # The evidence is the form Jasmin sent, every parameter with its value (P6, P9).
        assert _form(bytes(row["payload"]), method) == {k: str(v) for k, v in sent.items()}
    events = {
        (r["message_id"], r["level"]): (r["stat"], r["status"], r["err"])
        for r in await db.fetch("SELECT message_id, level, stat, status, err FROM dlr.events")
    }
    assert events == {
        (DELIVERED_ID, 1): ("ACCEPTD", "ACCEPTED", None),
        (DELIVERED_ID, 2): ("DELIVRD", "DELIVERED", "000"),
        (FAILED_ID, 1): ("ACCEPTD", "ACCEPTED", None),
        (FAILED_ID, 2): ("UNDELIV", "UNDELIVERABLE", "001"),
        (EXPIRED_ID, 1): ("ACCEPTD", "ACCEPTED", None),
        (EXPIRED_ID, 2): ("EXPIRED", "EXPIRED", "000"),
    }
    statuses = {
        r["message_id"]: (r["status"], r["is_final"])
        for r in await db.fetch("SELECT message_id, status, is_final FROM dlr.message_status")
    }
    assert statuses == {
        DELIVERED_ID: ("DELIVERED", True),
        FAILED_ID: ("UNDELIVERABLE", True),
        EXPIRED_ID: ("EXPIRED", True),
    }
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0


async def test_jasmin_is_acked_only_once_its_callback_is_committed(
    database_url: str, store: Store, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """While the receptions table is locked the callback cannot commit: Jasmin hears no
    `ACK/Jasmin` (it waits, or is told to retry, and throws again); once the lock goes, the
    ACK comes, and by then the reception is in the store, once."""
    await store.record_submissions([Submission(LOGIN, DELIVERED_ID, "+34600000001")])
    out = tmp_path / "thrower.out"
    async with webhook_process(
        database_url, tmp_path / "webhook.log", "--format", "jasmin"
    ) as webhook:
        locked = db.transaction()
        await locked.start()
        await db.execute("LOCK TABLE dlr.reception_rows IN ACCESS EXCLUSIVE MODE")
        try:
            thrower = await _start_thrower(webhook, "POST", CALLBACKS[1:2], out)

            async def commit_blocked() -> bool:
                waiting = await db.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted"
                    " AND relation = 'dlr.reception_rows'::regclass"
                )
                return bool(waiting)

            await _wait_until(commit_blocked, "the webhook's commit to wait on the lock")
            assert not any(a["acked"] for a in _attempts(out)), _attempts(out)
        finally:
            await locked.rollback()
        assert await asyncio.wait_for(thrower.wait(), 120) == 0, _tail(out)
    attempts = _attempts(out)
    assert [a["acked"] for a in attempts] == [False] * (len(attempts) - 1) + [True]
    assert all(a["body"] != "ACK/Jasmin" for a in attempts[:-1])
    rows = await db.fetch("SELECT message_id, level, outcome FROM dlr.receptions")
    assert [tuple(r) for r in rows] == [(DELIVERED_ID, 2, "applied")]
    assert await db.fetchval("SELECT status FROM dlr.message_status") == "DELIVERED"


async def test_a_submit_jasmin_reports_refused_is_rejected_like_kannels(
    database_url: str, store: Store, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """Jasmin's level-1 callback with an SMPP error status (the SMSC refused the submit) is
    the same outcome as Kannel's NACK: the message is rejected, finally; it is acked."""
    await store.record_submissions([Submission(LOGIN, REFUSED_ID, "+34600000004")])
    async with webhook_process(
        database_url, tmp_path / "webhook.log", "--format", "jasmin"
    ) as webhook:
        attempts = await _throw(
            webhook, "POST", [level_1(REFUSED_ID, "ESME_RINVDSTADR")], tmp_path / "thrower.out"
        )
    assert [(a["attempt"], a["body"]) for a in attempts] == [(1, "ACK/Jasmin")]
    status = await db.fetchrow(
        "SELECT status, is_final FROM dlr.message_status WHERE message_id = $1", REFUSED_ID
    )
    assert status is not None
    assert (status["status"], status["is_final"]) == ("REJECTED", True)
