"""`dlrfeed webhook` against callers that are not the project's own: gateways that cannot send
headers (the secret in the path), replies in Latin-1, bodies compressed or framed wrongly,
floods of garbage, a locked exceptions table. Real PostgreSQL, real HTTP on loopback."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import structlog

from dlrfeed.store import Store, Submission
from dlrfeed.store.reports import message_reports
from support.webhook_harness import LOGIN, SECRET, running_webhook, url, webhook_settings

NEXT_SECRET = "rotated-n3xt-Secret"


async def _until(predicate: Callable[[], Awaitable[bool]], within_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_the_secret_in_the_path_lets_headerless_gateways_in_and_is_never_logged(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """Kannel and Jasmin cannot send a header: /dlr/SECRET (GET or POST) is accepted, with
    either of two secrets during a rotation; a wrong one is 401; the secret is in no log."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"{SECRET}\n{NEXT_SECRET}\n")
    secret_file.chmod(0o600)
    settings = webhook_settings(
        database_url, "--format", "jasmin", "--secret-file", str(secret_file)
    )
    with structlog.testing.capture_logs() as logs:
        async with running_webhook(settings) as service, httpx.AsyncClient() as client:
            query = "id=u1&level=1&message_status=ESME_ROK"
            by_get = await client.get(url(service, f"/dlr/{SECRET}?{query}"))
            by_post = await client.post(
                url(service, f"/dlr/{NEXT_SECRET}"),
                content=b"id=u2&level=1&message_status=ESME_ROK",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            wrong = await client.get(url(service, f"/dlr/not-{SECRET}?{query}"))
            bare = await client.get(url(service, f"/dlr?{query}"))
            bearer = await client.get(
                url(service, f"/?{query}"), headers={"Authorization": f"Bearer {NEXT_SECRET}"}
            )
    assert (by_get.status_code, by_get.text) == (200, "ACK/Jasmin")
    assert (by_post.status_code, by_post.text) == (200, "ACK/Jasmin")
    assert (wrong.status_code, bare.status_code, bearer.status_code) == (401, 401, 200)
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 3
    payloads = [bytes(r["payload"]) for r in await db.fetch("SELECT payload FROM dlr.receptions")]
    assert not any(SECRET.encode() in p or NEXT_SECRET.encode() in p for p in payloads)
    logged = repr(logs)
    assert SECRET not in logged
    assert NEXT_SECRET not in logged


async def test_a_latin1_kannel_reply_is_stored_applied_and_flagged(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """One non-UTF-8 byte costs nothing: reception, event and status, the field flagged."""
    await store.record_submissions([Submission(LOGIN, "m-cafe", "+34600000001")])
    query = "id=m-cafe&type=1&reply=id%3AR1+stat%3ADELIVRD+err%3A000+text%3ACaf%E9"
    async with (
        running_webhook(webhook_settings(database_url, "--format", "kannel")) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.get(url(service, f"/dlr?{query}"))
    assert (answer.status_code, answer.text) == (200, "OK")
    event = await db.fetchrow("SELECT stat, flags FROM dlr.events")
    assert event is not None
    assert event["stat"] == "DELIVRD"
    assert "latin1:reply" in event["flags"]
    reception = await db.fetchrow("SELECT flags, payload_json FROM dlr.receptions_readable")
    assert reception is not None
    assert "latin1:reply" in reception["flags"]
    assert await db.fetchval("SELECT status FROM dlr.message_status") == "DELIVERED"
    assert bytes(await db.fetchval("SELECT payload FROM dlr.receptions")) == query.encode()


async def test_kannel_type_2_without_a_reply_is_not_called_the_networks_word(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """P2: Kannel's class of report is not a stat the network reported."""
    await store.record_submissions([Submission(LOGIN, "m-fail", "+34600000001")])
    async with (
        running_webhook(webhook_settings(database_url, "--format", "kannel")) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.get(url(service, "/dlr?id=m-fail&type=2&reply="))
    assert answer.status_code == 200
    row = await db.fetchrow("SELECT status, reason FROM dlr.message_status")
    assert row is not None
    assert row["status"] == "UNDELIVERABLE"
    assert "inferred by the gateway" in row["reason"]
    assert "reported by the network" not in row["reason"].replace("no stat reported by", "")


async def test_a_bad_body_whose_id_is_readable_is_findable_by_it(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P24: the evidence of an unreadable callback is kept under the id it names, so
    `dlrfeed show E4` finds it."""
    sent = json.dumps({"id": "E4", "level": "2", "stat": "DELIVRD"}).encode()
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.post(url(service), content=sent)
    assert answer.status_code == 400
    (report,) = await message_reports(db, "E4", None)
    (exception,) = report["exceptions"]
    assert (exception["kind"], exception["message_id"]) == ("unstorable", "E4")


async def test_bodies_compressed_or_framed_wrongly_are_refused_4xx_and_kept(
    database_url: str, db: asyncpg.Connection, capfd: pytest.CaptureFixture[str]
) -> None:
    """A gzip body is read; a broken gzip, an encoding the receiver does not decode, and a
    broken chunked framing are each a 4xx whose bytes are committed as evidence."""
    good = json.dumps({"id": "g1", "level": 2, "stat": "DELIVRD"}).encode()
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        gzipped = await client.post(
            url(service), content=gzip.compress(good), headers={"Content-Encoding": "gzip"}
        )
        broken = await client.post(
            url(service), content=b"\x1f\x8bnot gzip", headers={"Content-Encoding": "gzip"}
        )
        brotli = await client.post(
            url(service), content=b"\x0b\x02\x80br", headers={"Content-Encoding": "br"}
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        writer.write(
            b"POST /dlr HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'5\r\n{"id"\r\nZZ\r\n'
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 20)
        writer.close()

        async def partial_kept() -> bool:
            query = "SELECT count(*) FROM dlr.exceptions WHERE evidence = $1"
            return bool(await db.fetchval(query, b'5\r\n{"id"\r\nZZ\r\n'))

        await _until(partial_kept)
    assert gzipped.status_code == 200
    assert (broken.status_code, brotli.status_code) == (400, 415)
    assert status_line.split(b" ")[1].startswith(b"4"), status_line
    kept = {
        bytes(r["evidence"])
        for r in await db.fetch("SELECT evidence FROM dlr.exceptions WHERE kind = 'unstorable'")
    }
    assert {b"\x1f\x8bnot gzip", b"\x0b\x02\x80br"} <= kept
    assert b'5\r\n{"id"\r\nZZ\r\n' in kept, "the body as it arrived, framing and all"
    assert bytes(await db.fetchval("SELECT payload FROM dlr.receptions")) == good
    assert "Traceback" not in capfd.readouterr().err


async def test_a_broken_body_is_kept_only_for_a_caller_with_the_secret_and_never_the_secret(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """A broken chunked framing keeps its body as evidence for a caller that presents the
    secret (here in the path), and its reason quotes no line of the request; a caller without
    it has nothing stored (401's rule), and its connection holds no body while it sends."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"{SECRET}\n")
    secret_file.chmod(0o600)
    settings = webhook_settings(database_url, "--secret-file", str(secret_file))
    broken = b'5\r\n{"id"\r\nZZ\r\n'
    with structlog.testing.capture_logs() as logs:
        async with running_webhook(settings) as service:
            for target in (f"/dlr/{SECRET}?x=\x01", "/anything"):
                reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
                writer.write(
                    f"POST {target} HTTP/1.1\r\nHost: x\r\n".encode()
                    + b"Transfer-Encoding: chunked\r\n\r\n"
                    + broken
                )
                await writer.drain()
                status_line = await asyncio.wait_for(reader.readline(), 20)
                writer.close()
                assert status_line.split(b" ")[1].startswith(b"4"), status_line

            async def kept() -> bool:
                return bool(await db.fetchval("SELECT count(*) FROM dlr.exceptions"))

            await _until(kept)
    rows = await db.fetch("SELECT evidence, details::text AS details FROM dlr.exceptions")
    assert [bytes(r["evidence"]) for r in rows] == [broken], "the authenticated caller's only"
    assert not any(SECRET in r["details"] for r in rows)
    assert not any(SECRET in repr(event) for event in logs)


async def test_a_flood_of_distinct_garbage_opens_few_investigations_keeps_every_body(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Beyond --unreadable-per-minute a caller's garbage is coalesced into one open item."""
    settings = webhook_settings(database_url, "--unreadable-per-minute", "5")
    async with running_webhook(settings) as service, httpx.AsyncClient() as client:
        answers = [
            await client.post(url(service), content=f"garbage {n}".encode()) for n in range(40)
        ]
    assert {a.status_code for a in answers} == {400}
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 40
    opened = await db.fetchval("SELECT count(*) FROM dlr.exceptions WHERE resolved_at IS NULL")
    assert opened <= 7  # the burst of 5, perhaps one more refilled, and the flood's one


async def test_bad_bodies_share_the_commits_and_healthz_tells_a_stalled_store(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """While keeping garbage is blocked, it waits in one committer (it holds no connections
    of its own); a good callback still commits through another, and /healthz says a commit
    is stalled."""
    await store.record_submissions([Submission(LOGIN, "ok-1", "+34600000001")])
    settings = webhook_settings(
        database_url, "--commits", "2", "--metrics", "127.0.0.1:0",
        "--stalled-commit-seconds", "1",
    )  # fmt: skip
    locker = await asyncpg.connect(database_url)
    try:
        async with running_webhook(settings) as service, httpx.AsyncClient(timeout=60) as client:
            health = f"http://127.0.0.1:{service.metrics_port}/healthz"
            tx = locker.transaction()
            await tx.start()
            # An investigation of the same bytes being opened, not committed: keeping the
            # garbage waits on its key, as on any lock of the exceptions' rows.
            await locker.execute(
                "INSERT INTO dlr.exceptions (kind, login, message_id, details, evidence,"
                " evidence_key) VALUES ('unstorable', $1, '', '{}', $2, $3)",
                LOGIN, b"junk", hashlib.sha256(b"junk").hexdigest(),
            )  # fmt: skip
            garbage = [
                asyncio.create_task(client.post(url(service), content=b"junk")) for _ in range(5)
            ]

            async def held() -> bool:
                return service.callbacks_in_hand == 5

            await _until(held)
            good = await asyncio.wait_for(
                client.post(
                    url(service),
                    content=json.dumps({"id": "ok-1", "level": 2, "stat": "DELIVRD"}).encode(),
                ),
                20,
            )
            assert good.status_code == 200

            async def unhealthy() -> bool:
                return (await client.get(health)).status_code == 503

            await _until(unhealthy)
            assert not any(g.done() for g in garbage)
            await tx.rollback()
            assert {(await g).status_code for g in garbage} == {400}
            assert (await client.get(health)).status_code == 200
    finally:
        await locker.close()
    kept = await db.fetchval("SELECT count(*) FROM dlr.exceptions WHERE evidence = 'junk'")
    assert kept == 5  # the locker's was rolled back: every post of the garbage is kept


async def test_kannel_buffered_after_the_smsc_ack_stays_visible(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """Types 8 then 4 then 1: the SMSC's acceptance and the network's buffered report (an
    ACCEPTD receipt, with its date and err) are two observations, neither a repeat of the
    other, each delivery kept with what it said; the delivery is the result."""
    await store.record_submissions([Submission(LOGIN, "m-buf", "+34600000001")])
    async with (
        running_webhook(webhook_settings(database_url, "--format", "kannel")) as service,
        httpx.AsyncClient() as client,
    ):
        buffered = (
            "id:R1 sub:001 dlvrd:000 submit date:2612031012 done date:2612031013"
            " stat:ACCEPTD err:000"
        )
        delivered = buffered.replace("ACCEPTD", "DELIVRD").replace("2612031013", "2612031015")
        for kind in ("8&reply=ACK%2F", f"4&reply={quote(buffered)}", f"1&reply={quote(delivered)}"):
            answer = await client.get(url(service, f"/dlr?id=m-buf&type={kind}"))
            assert answer.status_code == 200
        outcomes = [
            r["outcome"]
            for r in await db.fetch("SELECT outcome::text FROM dlr.receptions ORDER BY id")
        ]
    assert "repeat" not in outcomes, outcomes
    (report,) = await message_reports(db, "m-buf", None)
    stats = [r["stat"] for r in report["receptions"]]
    assert stats == ["ACCEPTD", "ACCEPTD", "DELIVRD"], report["receptions"]
    assert [r["done_date_raw"] for r in report["receptions"]] == [None, "2612031013", "2612031015"]
    assert report["status"]["status"] == "DELIVERED"


async def test_a_body_that_never_arrives_is_answered_with_nothing_kept(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Headers whose body never comes (a caller that stalls, or one told `100 Continue` that
    then goes away) are a 408 or a 400 with nothing stored: no byte of a body arrived, so
    there is no evidence to keep, and no investigation to open."""
    settings = webhook_settings(database_url, "--body-timeout", "1")
    async with running_webhook(settings) as service:
        stalled = await asyncio.open_connection("127.0.0.1", service.port)
        stalled[1].write(b"POST /dlr HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n")
        answer = await asyncio.wait_for(stalled[0].readuntil(b"send it again\n"), 20)
        stalled[1].close()
        assert answer.split(b" ")[1] == b"408", answer
        assert b"nothing stored" in answer, answer

        gone = await asyncio.open_connection("127.0.0.1", service.port)
        gone[1].write(
            b"POST /dlr HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nExpect: 100-continue\r\n\r\n"
        )
        assert (await asyncio.wait_for(gone[0].readline(), 20)).startswith(b"HTTP/1.1 100")
        gone[1].transport.abort()  # the caller goes away instead of sending its body

        async def answered_400() -> bool:
            sample = service.metrics.registry.get_sample_value(
                "dlrfeed_webhook_requests_total", {"code": "400"}
            )
            return bool(sample)

        await _until(answered_400)
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0
