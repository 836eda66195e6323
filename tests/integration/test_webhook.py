"""`dlrfeed webhook` against a real PostgreSQL over real HTTP on loopback: a callback is answered
2xx only after the commit that stored it, concurrent callbacks share commits, a bad callback is
kept raw and answered so that a retry is safe, and an outage answers 503 until it ends."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
import httpx
import pytest

from dlrfeed.daemon.store_gate import StoreGate
from dlrfeed.domain.receipt import AckToken, MessageId, Receipt, UnreadableCallback
from dlrfeed.domain.status import Outcome
from dlrfeed.store import Store, Submission
from dlrfeed.store.store import IngestResult
from dlrfeed.webhook.app import WebhookService, WebhookStore
from dlrfeed.webhook.formats import CallbackFormat, evidence
from dlrfeed.webhook.intake import CallbackIntake
from dlrfeed.webhook.settings import WebhookSettings
from dlrfeed_tools.pgcluster import PgCluster
from support.webhook_fixtures import FIXTURE_NAMES, expected, load_fixture
from support.webhook_harness import (
    LOGIN,
    SECRET,
    running_webhook,
    url,
    webhook_settings,
)

DELIVERED: dict[str, Any] = {
    "id": "5f1c2a9e-0001",
    "level": 2,
    "stat": "DELIVRD",
    "err": "000",
    "submit_date": "2612031012",
    "done_date": "2612031013",
}


def body(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields).encode()


async def test_a_callback_is_stored_as_a_webhook_reception_and_applied(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """P6, P10: the body kept byte for byte with its channel and peer; correlated by id."""
    await store.record_submissions([Submission(LOGIN, DELIVERED["id"], "+34600000001")])
    sent = body(DELIVERED)
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.post(url(service), content=sent)
        assert answer.status_code == 200
        assert answer.json() == {"outcome": "applied"}
        (row,) = await db.fetch(
            "SELECT channel::text, peer, payload, delivery_count, outcome, payload_json"
            " FROM dlr.receptions_readable"
        )
        assert row["channel"] == "webhook"
        assert row["peer"].startswith("127.0.0.1:")
        assert bytes(row["payload"]) == sent
        assert row["delivery_count"] == 0
        assert json.loads(row["payload_json"]) == DELIVERED
        status = await db.fetchval("SELECT status FROM dlr.message_status")
        assert status == "DELIVERED"
        assert (await client.post(url(service, "/"), content=sent)).json() == {"outcome": "repeat"}


async def test_the_same_receipt_by_feed_and_by_webhook_is_one_event(
    database_url: str, store: Store, db: asyncpg.Connection
) -> None:
    """P14: the channel is evidence, not part of the event key: the second path's delivery is
    a repeat, and both deliveries are kept."""
    feed_receipt = _receipt(DELIVERED["id"])._replace(
        submit_date=DELIVERED["submit_date"],
        done_date=DELIVERED["done_date"],
        delivery_count=1,
        ack_token=AckToken("t"),
        raw=b"\x0a\x01x",
        channel="feed",
    )
    await store.ingest(LOGIN, [feed_receipt])
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        answer = await client.post(url(service), content=body(DELIVERED))
    assert answer.json() == {"outcome": "repeat"}
    rows = await db.fetch("SELECT channel::text AS channel FROM dlr.receptions ORDER BY id")
    assert [r["channel"] for r in rows] == ["feed", "webhook"]
    assert await db.fetchval("SELECT times_received FROM dlr.events") == 2


class HeldStore:
    """The real store, whose commits wait until the test lets them go: what a request sees
    while its commit is in progress, and how many callbacks one commit takes."""

    def __init__(self, store: WebhookStore) -> None:
        self._store = store
        self.release = asyncio.Event()
        self.commits: list[int] = []

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult:
        await self.release.wait()
        self.commits.append(len(receipts))
        return await self._store.ingest(login, receipts)

    async def keep_unreadable_callbacks(
        self, login: str, callbacks: Sequence[UnreadableCallback]
    ) -> None:
        await self._store.keep_unreadable_callbacks(login, callbacks)

    async def ping(self) -> None:
        await self._store.ping()

    async def check_schema(self) -> None:
        await self._store.check_schema()

    async def close(self) -> None:
        await self._store.close()


async def test_the_answer_waits_for_the_commit_and_concurrent_callbacks_share_one(
    database_url: str, db: asyncpg.Connection
) -> None:
    """2xx only after the commit; callbacks that arrive while a commit runs go together in
    the next one (group commit), each answered with its own outcome."""
    held: list[HeldStore] = []

    async def opener(settings: WebhookSettings) -> WebhookStore:
        from dlrfeed.daemon.lifecycle import open_store

        held.append(HeldStore(await open_store(settings)))
        return held[0]

    settings = webhook_settings(database_url, "--commits", "1")
    async with running_webhook(settings, opener) as service, httpx.AsyncClient() as client:
        first = asyncio.create_task(
            client.post(url(service), content=body({**DELIVERED, "id": "first"}))
        )
        await _until(lambda: service.callbacks_in_hand == 1)
        others = [
            asyncio.create_task(
                client.post(url(service), content=body({**DELIVERED, "id": f"m{n}"}))
            )
            for n in range(20)
        ]
        await _until(lambda: service.callbacks_in_hand == 21)
        assert not first.done(), "answered before its commit"
        assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
        held[0].release.set()
        answers = await asyncio.gather(first, *others)
    assert [a.status_code for a in answers] == [200] * 21
    assert {a.json()["outcome"] for a in answers} == {"uncorrelated"}
    assert held[0].commits == [1, 20]
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 21


async def _until(predicate: Any, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "object"),
        (body({"level": 2, "stat": "DELIVRD"}), "id"),
        (body({"id": "x", "level": "2"}), "level"),
        (b'{"id": "\xff\xfe"}', "UTF-8"),
    ],
)
async def test_a_bad_callback_is_kept_raw_and_answered_400_once_investigated(
    database_url: str, db: asyncpg.Connection, sent: bytes, reason: str
) -> None:
    """C8: never lost, never a 5xx (a retry cannot help it); the same bytes posted twice are
    one open investigation, each post's bytes kept."""
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        for _ in range(2):
            answer = await client.post(url(service), content=sent)
            assert answer.status_code == 400
            assert "do not retry" in answer.text
    rows = await db.fetch(
        "SELECT evidence, details, resolved_at FROM dlr.exceptions"
        " WHERE kind = 'unstorable' ORDER BY id"
    )
    assert [bytes(r["evidence"]) for r in rows] == [sent, sent]
    assert [r["resolved_at"] is None for r in rows] == [True, False]
    details = json.loads(rows[0]["details"])
    assert details["channel"] == "webhook"
    assert reason.lower() in details["error"].lower()
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0


async def test_a_body_over_the_limit_is_refused_413_and_its_first_bytes_kept(
    database_url: str, db: asyncpg.Connection
) -> None:
    sent = body({**DELIVERED, "text": "x" * 5000})
    settings = webhook_settings(database_url, "--max-body-bytes", "1000")
    async with running_webhook(settings) as service, httpx.AsyncClient() as client:
        answer = await client.post(url(service), content=sent)
    assert answer.status_code == 413
    evidence = await db.fetchval("SELECT evidence FROM dlr.exceptions WHERE kind = 'unstorable'")
    assert bytes(evidence) == sent[:1000]


async def test_only_callers_with_the_secret_are_heard(
    database_url: str, db: asyncpg.Connection, tmp_path: Any
) -> None:
    """Bearer token or Basic password, compared in constant time; a refused caller's bytes are
    not stored (anybody could fill the investigation queue)."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    settings = webhook_settings(database_url, "--secret-file", str(secret_file))
    basic = base64.b64encode(f"gateway:{SECRET}".encode()).decode()
    async with running_webhook(settings) as service, httpx.AsyncClient() as client:
        refused = [
            await client.post(url(service), content=body(DELIVERED), headers=headers)
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Bearer {SECRET}x"},
                {"Authorization": "Basic !!!"},
                {"Authorization": f"Token {SECRET}"},
            )
        ]
        assert [a.status_code for a in refused] == [401] * 5
        assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
        assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0
        bearer = await client.post(
            url(service), content=body(DELIVERED), headers={"Authorization": f"Bearer {SECRET}"}
        )
        by_basic = await client.post(
            url(service), content=body(DELIVERED), headers={"Authorization": f"Basic {basic}"}
        )
    assert (bearer.status_code, by_basic.status_code) == (200, 200)


async def test_other_paths_and_methods_are_not_callbacks(database_url: str) -> None:
    async with (
        running_webhook(webhook_settings(database_url)) as service,
        httpx.AsyncClient() as client,
    ):
        assert (await client.get(url(service))).status_code == 405
        assert (await client.post(url(service, "/other"), content=b"{}")).status_code == 404


async def test_an_outage_is_answered_503_with_retry_after_until_it_ends(
    pg_cluster: PgCluster, database_url: str
) -> None:
    """Never a 2xx without a commit; the process stays up, says so in /healthz and its
    metrics, and takes callbacks again by itself once PostgreSQL is back."""
    settings = webhook_settings(database_url, "--metrics", "127.0.0.1:0", "--retry-after", "7")
    async with running_webhook(settings) as service:
        health = f"http://127.0.0.1:{service.metrics_port}/healthz"
        async with httpx.AsyncClient() as client:
            assert (await client.post(url(service), content=body(DELIVERED))).status_code == 200
            await asyncio.to_thread(pg_cluster.stop, "fast")
            try:
                answers = [
                    await client.post(url(service), content=body({**DELIVERED, "id": f"o{n}"}))
                    for n in range(3)
                ]
                assert [a.status_code for a in answers] == [503] * 3
                assert {a.headers["Retry-After"] for a in answers} == {"7"}
                assert (await client.get(health)).status_code == 503
                registry = service.metrics.registry
                assert registry.get_sample_value("dlrfeed_webhook_store_up") == 0
            finally:
                await asyncio.to_thread(pg_cluster.start)

            async def taken() -> bool:
                answer = await client.post(url(service), content=body({**DELIVERED, "id": "o0"}))
                return answer.status_code == 200

            deadline = time.monotonic() + 30
            while not await taken():
                assert time.monotonic() < deadline, "not taking callbacks after the outage"
                await asyncio.sleep(0.2)
            assert (await client.get(health)).status_code == 200
    db = await asyncpg.connect(database_url)  # the server restarted: a new connection
    try:
        ids = await db.fetch("SELECT message_id FROM dlr.receptions ORDER BY id")
    finally:
        await db.close()
    assert [r["message_id"] for r in ids] == [DELIVERED["id"], "o0"]


@pytest.mark.parametrize("callback_format", list(CallbackFormat))
async def test_each_peers_fixtures_through_the_receiver(
    database_url: str, db: asyncpg.Connection, callback_format: CallbackFormat
) -> None:
    """Every fixture of a format, sent as its peer sends it: a readable one is stored with its
    evidence and answered as that peer expects (Jasmin retries without `ACK/Jasmin`); a
    malformed one is kept raw and answered 400."""
    names = [n for n in FIXTURE_NAMES if n.startswith(f"{callback_format.value}-")]
    settings = webhook_settings(database_url, "--format", callback_format.value)
    async with running_webhook(settings) as service, httpx.AsyncClient() as client:
        for name in names:
            _, callback = load_fixture(name)
            headers = {"Content-Type": callback.content_type} if callback.content_type else {}
            target = url(service) + (f"?{callback.query}" if callback.query else "")
            answer = await client.request(
                callback.method, target, content=callback.body or None, headers=headers
            )
            wanted = expected(name)
            if "malformed" in wanted:
                assert answer.status_code == 400, name
                kept = await db.fetchval(
                    "SELECT evidence FROM dlr.exceptions ORDER BY id DESC LIMIT 1"
                )
                assert bytes(kept) == evidence(callback), name
                continue
            assert answer.status_code == 200, (name, answer.text)
            if callback_format is CallbackFormat.JASMIN:
                assert answer.text == "ACK/Jasmin"
            stored = await db.fetchrow(
                "SELECT message_id, level, stat, payload FROM dlr.receptions_readable"
                " ORDER BY id DESC LIMIT 1"
            )
            assert stored is not None
            assert bytes(stored["payload"]) == evidence(callback), name
            assert (stored["message_id"], stored["level"], stored["stat"]) == (
                wanted["id"],
                wanted["level"],
                wanted["stat"],
            ), name


async def test_a_stop_answers_the_callbacks_in_their_commit_first(
    database_url: str, db: asyncpg.Connection
) -> None:
    """SIGTERM while a callback waits for its commit: the receiver stops listening, lets the
    commit finish, answers 200, then exits 0 (a callback is never cut off between its commit
    and its answer while there is time)."""
    held: list[HeldStore] = []

    async def opener(settings: WebhookSettings) -> WebhookStore:
        from dlrfeed.daemon.lifecycle import open_store

        held.append(HeldStore(await open_store(settings)))
        return held[0]

    settings = webhook_settings(database_url)
    service = WebhookService(settings, store_opener=opener)
    running = asyncio.create_task(service.run())
    await asyncio.wait_for(service.ready.wait(), 30)
    async with httpx.AsyncClient() as client:
        answer = asyncio.create_task(client.post(url(service), content=body(DELIVERED)))
        await _until(lambda: service.callbacks_in_hand == 1)
        service.stop()
        await asyncio.sleep(0.2)
        assert not answer.done()
        assert not running.done()
        held[0].release.set()
        assert (await answer).status_code == 200
    assert await asyncio.wait_for(running, 30) == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 1


async def test_a_committer_stopped_mid_commit_finishes_its_batch_and_takes_no_more(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Cancelled while a commit runs (the service stops, or another committer failed), a
    committer lets that commit finish and answer, and starts none of the batches waiting
    behind it: a stop is bounded by one commit, not by the backlog."""
    held = HeldStore(await Store.open(database_url, pool_size=1))
    gate = StoreGate(held.ping, release_after=math.inf, on_release=lambda: None)
    intake = CallbackIntake(held, gate, login=LOGIN, batch_size=1, commits=1)
    running = asyncio.create_task(intake.run())
    try:
        taken = [asyncio.create_task(intake.take(_receipt(f"stop-{n}"))) for n in range(3)]
        await _until(lambda: intake.stalled_seconds() > 0)  # the first batch is committing
        running.cancel()
        await asyncio.sleep(0.05)
        assert not running.done(), "the commit under way was abandoned"
        held.release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, 30)
        assert await taken[0] == Outcome.UNCORRELATED
        assert held.commits == [1]
        assert [t.done() for t in taken[1:]] == [False, False]
        assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 1
    finally:
        for task in taken:
            task.cancel()
        await held.close()


def _receipt(message_id: str) -> Receipt:
    """A level-2 DELIVRD callback of `message_id` as the receiver hands it to the intake."""
    return Receipt(
        message_id=MessageId(message_id),
        level=2,
        stat="DELIVRD",
        err="000",
        sub=None,
        dlvrd=None,
        submit_date=None,
        done_date=None,
        text=None,
        source_addr=None,
        destination_addr=None,
        smsc_message_id=None,
        connector=None,
        delivery_count=0,
        ack_token=AckToken(""),
        raw=body({"id": message_id}),
        received_at=time.time(),
        channel="webhook",
    )
