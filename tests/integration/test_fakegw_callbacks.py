"""fakegw calls back (F2: the webhook wins): receipts with a `dlr_url` are POSTed to a real HTTP
receiver on loopback, with retries, credentials, faults and durability across a crash.

Deterministic by construction: retries follow each other within milliseconds (FAST_CALLBACKS),
the receiver's scripted answers decide every outcome, and tests wait on conditions with a
bound, never on a sleep long enough.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from fakegw.admin_client import AdminClient
from fakegw.callbacks import CallbackSettings
from fakegw.faults import Faults
from fakegw.server import FakeGateway
from fakegw.wire import RECEIPT_FIELDS
from support.callback_receiver import CallbackReceiver, Reply, replies
from support.fakegw_support import (
    FAST_CALLBACKS,
    LOGIN,
    LOGINS,
    OTHER_LOGIN,
    PASSWORD,
    callback_args,
    feed_client,
    receipt_body,
    start_fakegw_process,
    stop_fakegw_process,
    wait_until,
)

FULL_RECEIPT = {
    "id": "m1",
    "level": 2,
    "stat": "DELIVRD",
    "err": "000",
    "sub": "001",
    "dlvrd": "001",
    "submit_date": "2612011200",
    "done_date": "2612011201",
    "text": "hello",
    "source_addr": "ACME",
    "destination_addr": "4915112345678",
    "smsc_message_id": "smsc-1",
    "connector": "route-7",
}


@contextlib.asynccontextmanager
async def gateway(
    settings: CallbackSettings = FAST_CALLBACKS, **options: Any
) -> AsyncIterator[FakeGateway]:
    """An in-process fakegw with these callback settings."""
    async with FakeGateway(LOGINS, callbacks=settings, **options).running() as gw:
        yield gw


def counter(gw: FakeGateway, name: str, login: str = LOGIN) -> Callable[[], int]:
    """Reads one stats counter of `login`, for wait_until."""
    return lambda: gw.stats(login)[name]


async def test_f2_injected_lines_with_a_dlr_url_are_posted_not_queued() -> None:
    async with CallbackReceiver() as receiver, gateway() as gw:
        async with AdminClient(gw.target, LOGIN, PASSWORD) as admin:
            result = await admin.inject(
                [
                    {**FULL_RECEIPT, "dlr_url": receiver.url("/full")},
                    {"id": "m2", "level": 1, "stat": "ENROUTE", "dlr_url": receiver.url("/few")},
                    receipt_body(3),
                ]
            )
        assert result == {"enqueued": 1, "dropped_at_cap": 0, "callbacks": 2}
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 2)
        (request,) = receiver.requests("/full")
        assert request.method == "POST"
        assert request.headers["content-type"] == "application/json"
        # F4: fields 1-13, one key each, in field order; no dlr_url; absent ones absent.
        assert list(request.json()) == list(RECEIPT_FIELDS)
        assert request.json() == FULL_RECEIPT
        assert receiver.bodies("/few") == [{"id": "m2", "level": 1, "stat": "ENROUTE"}]
        stats = gw.stats(LOGIN)
        assert (stats["queued"], stats["enqueued"], stats["callbacks_pending"]) == (1, 1, 0)
        client = feed_client(gw.target)
        assert [r.id for r in await client.pull()] == ["m3"]
        await client.close()


async def test_the_ledger_records_each_callback_made_and_each_answered_2xx() -> None:
    """What the invariant checker reads: `callback` when one is made, `callback_answered` once
    the receiver answered it 2xx (not for a refusal), each naming the callback by its key."""
    script = {"/refuse": replies(400)}
    async with CallbackReceiver(script) as receiver, gateway() as gw:
        await gw.inject(
            LOGIN,
            [
                {**receipt_body(1), "dlr_url": receiver.url("/take")},
                {**receipt_body(2), "dlr_url": receiver.url("/refuse")},
            ],
        )
        await wait_until(lambda: counter(gw, "callbacks_pending")() == 0)
        records = gw.ledger(LOGIN)["records"]
    made = {r["receipt"]["id"]: r["token"] for r in records if r["kind"] == "callback"}
    answered = [
        (r["receipt"]["id"], r["token"]) for r in records if r["kind"] == "callback_answered"
    ]
    assert set(made) == {"m1", "m2"}
    assert answered == [("m1", made["m1"])]


async def test_a_dlr_url_that_is_not_an_http_url_is_invalid_argument() -> None:
    async with gateway() as gw, AdminClient(gw.target, LOGIN, PASSWORD) as admin:
        for url in ("ftp://127.0.0.1/dlr", "/relative", "http://:80/", 7):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await admin.inject([receipt_body(1), {**receipt_body(2), "dlr_url": url}])
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stats = gw.stats(LOGIN)
        assert (stats["total"], stats["callbacks_pending"]) == (0, 0)


async def test_503_is_retried_until_a_2xx() -> None:
    async with CallbackReceiver({"/dlr": replies(503, 503)}) as receiver, gateway() as gw:
        await gw.inject(LOGIN, [{**receipt_body(1), "dlr_url": receiver.url()}])
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 1)
        assert receiver.bodies() == [receipt_body(1)] * 3
        stats = gw.stats(LOGIN)
        assert (stats["callbacks_retried"], stats["callbacks_pending"]) == (2, 0)


async def test_429_and_503_honour_retry_after_over_the_backoff() -> None:
    # A backoff of minutes: only the receiver's Retry-After: 0 lets the retries come at once.
    slow = replace(FAST_CALLBACKS, backoff_seconds=600.0, max_backoff_seconds=600.0)
    script = {
        "/dlr": [
            Reply(429, headers=(("Retry-After", "0"),)),
            Reply(503, headers=(("Retry-After", "Thu, 01 Jan 1970 00:00:00 GMT"),)),
        ]
    }
    async with CallbackReceiver(script) as receiver, gateway(slow) as gw:
        await gw.inject(LOGIN, [{**receipt_body(1), "dlr_url": receiver.url()}])
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 1)
        assert len(receiver.received) == 3


async def test_a_timeout_is_retried() -> None:
    settings = replace(FAST_CALLBACKS, timeout_seconds=0.5, attempts=10)
    script = {"/dlr": [Reply(200, delay_seconds=600)]}  # answered only when the test ends
    async with CallbackReceiver(script) as receiver, gateway(settings) as gw:
        await gw.inject(LOGIN, [{**receipt_body(1), "dlr_url": receiver.url()}])
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 1)
        retried = gw.stats(LOGIN)["callbacks_retried"]
        assert retried >= 1
        assert len(receiver.received) == retried + 1


async def test_a_4xx_refusal_is_counted_and_never_retried() -> None:
    async with CallbackReceiver({"/dlr": replies(400)}) as receiver, gateway() as gw:
        with capture_logs() as logs:
            await gw.inject(LOGIN, [{**receipt_body(1), "dlr_url": receiver.url()}])
            await wait_until(lambda: counter(gw, "callbacks_refused")() == 1)
        stats = gw.stats(LOGIN)
        assert (stats["callbacks_pending"], stats["callbacks_retried"]) == (0, 0)
        assert stats["callbacks_delivered"] == 0
        # Done: nothing is scheduled any more, so this one POST is all there will be.
        assert len(receiver.received) == 1
        assert [e["problem"] for e in logs if e["event"] == "callback_refused"] == ["HTTP 400"]


async def test_the_callback_is_given_up_after_the_last_attempt() -> None:
    gone = CallbackReceiver()
    await gone.start()
    refused_url = gone.url("/gone")  # nothing listens there any more: connection refused
    await gone.stop()
    async with CallbackReceiver({"/dlr": replies(500, 500, 500)}) as receiver, gateway() as gw:
        with capture_logs() as logs:
            await gw.inject(
                LOGIN,
                [
                    {**receipt_body(1), "dlr_url": receiver.url()},
                    {**receipt_body(2), "dlr_url": refused_url},
                ],
            )
            await wait_until(lambda: counter(gw, "callbacks_failed")() == 2)
        assert len(receiver.received) == FAST_CALLBACKS.attempts
        stats = gw.stats(LOGIN)
        assert stats["callbacks_retried"] == 2 * (FAST_CALLBACKS.attempts - 1)
        assert (stats["callbacks_pending"], stats["callbacks_delivered"]) == (0, 0)
        given_up = {e["id"]: e for e in logs if e["event"] == "callback_given_up"}
        assert given_up["m1"]["problem"] == "HTTP 500"
        assert given_up["m2"]["problem"].startswith("ConnectError")
        assert given_up["m2"]["attempts"] == FAST_CALLBACKS.attempts
        assert given_up["m2"]["url"] == refused_url


async def test_credentials_basic_from_the_url_else_the_bearer_of_the_login() -> None:
    settings = replace(
        FAST_CALLBACKS, bearer_token="every-login", login_bearer_tokens={OTHER_LOGIN: "globex"}
    )
    async with CallbackReceiver() as receiver, gateway(settings) as gw:
        basic_url = receiver.url("/basic", userinfo="hook:p%40ss")
        await gw.inject(LOGIN, [{**receipt_body(1), "dlr_url": basic_url}])
        await gw.inject(LOGIN, [{**receipt_body(2), "dlr_url": receiver.url("/acme")}])
        await gw.inject(OTHER_LOGIN, [{**receipt_body(3), "dlr_url": receiver.url("/globex")}])
        await wait_until(lambda: len(receiver.received) == 3)
        pair = base64.b64encode(b"hook:p@ss").decode()
        assert receiver.requests("/basic")[0].headers["authorization"] == f"Basic {pair}"
        assert receiver.requests("/acme")[0].headers["authorization"] == "Bearer every-login"
        assert receiver.requests("/globex")[0].headers["authorization"] == "Bearer globex"


async def test_f2_sent_messages_with_a_dlr_url_get_their_reported_receipts_posted() -> None:
    async with CallbackReceiver() as receiver, gateway() as gw:
        messages = [
            {"id": "both", "dlr": True, "dlr_level": 3, "dlr_url": receiver.url("/both")},
            {"id": "result", "dlr": "yes", "dlr_level": 2, "channel": "rest"},
            {"id": "off", "dlr": False, "dlr_level": 3, "dlr_url": receiver.url("/off")},
            {"id": "smpp", "dlr": True, "channel": "smpp", "dlr_url": receiver.url("/smpp")},
        ]
        messages[1]["dlr_url"] = receiver.url("/result")
        async with AdminClient(gw.target, LOGIN, PASSWORD) as admin:
            await admin.send(messages)
            progress = [{"id": m["id"], "level": 1, "stat": "ENROUTE"} for m in messages]
            results = [{"id": m["id"], "level": 2, "stat": "DELIVRD"} for m in messages]
            counts = await admin.report(progress + results)
        assert counts == {
            "enqueued": 0,
            "callbacks": 3,
            "filtered": 5,
            "unknown_message": 0,
            "dropped_at_cap": 0,
        }
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 3)
        assert sorted(b["level"] for b in receiver.bodies("/both")) == [1, 2]
        assert receiver.bodies("/result") == [{"id": "result", "level": 2, "stat": "DELIVRD"}]
        assert gw.stats(LOGIN)["total"] == 0  # F2: the webhook wins, nothing in the feed


async def test_f3_the_deadline_unknown_goes_to_the_dlr_url() -> None:
    sent_at = time.time() - 100
    # Housekeeping never runs by itself here: the test sweeps when it wants the deadline.
    async with (
        CallbackReceiver() as receiver,
        gateway(dlr_deadline_seconds=10, housekeeping_seconds=3600) as gw,
    ):
        url = receiver.url()
        await gw.send(
            LOGIN,
            [
                {"id": "silent", "dlr": True, "dlr_level": 3, "dlr_url": url, "sent_at": sent_at},
                {"id": "answered", "dlr": True, "dlr_url": url, "sent_at": sent_at},
                {"id": "progress-only", "dlr": True, "dlr_level": 1, "dlr_url": url},
            ],
        )
        await gw.report(LOGIN, [{"id": "answered", "level": 2, "stat": "DELIVRD"}])
        await gw.sweep()
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 2)
        unknown = next(b for b in receiver.bodies() if b["id"] == "silent")
        assert set(unknown) == {"id", "level", "stat", "submit_date", "done_date"}
        assert (unknown["level"], unknown["stat"]) == (2, "UNKNOWN")
        assert sorted(b["id"] for b in receiver.bodies()) == ["answered", "silent"]
        stats = gw.stats(LOGIN)
        assert (stats["total"], stats["deadline_unknown"]) == (0, 0)  # the feed's count


async def test_duplicate_fault_posts_a_delivered_body_twice() -> None:
    async with (
        CallbackReceiver() as receiver,
        gateway(faults=Faults(callback_duplicate_rate=1.0)) as gw,
    ):
        bodies = [receipt_body(i) for i in range(3)]
        await gw.inject(LOGIN, [{**b, "dlr_url": receiver.url()} for b in bodies])
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 3)
        received = [json.dumps(b, sort_keys=True) for b in receiver.bodies()]
        assert sorted(received) == sorted(json.dumps(b, sort_keys=True) for b in bodies * 2)
        assert gw.stats(LOGIN)["callbacks_duplicated"] == 3


async def test_concurrent_posts_are_bounded_by_the_setting() -> None:
    settings = replace(FAST_CALLBACKS, concurrency=2)
    script = {"/dlr": [Reply(held=True), Reply(held=True)]}
    async with CallbackReceiver(script) as receiver, gateway(settings) as gw:
        await gw.inject(LOGIN, [{**receipt_body(i), "dlr_url": receiver.url()} for i in range(8)])
        await wait_until(lambda: receiver.in_flight == 2)
        receiver.release_held()
        await wait_until(lambda: counter(gw, "callbacks_delivered")() == 8)
        assert receiver.in_flight_peak == 2


async def _stats_until(admin: AdminClient, key: str, value: int) -> dict[str, Any]:
    """Poll the admin Stats until `key` has `value` (bounded, like wait_until)."""
    give_up = time.monotonic() + 30
    while (stats := await admin.stats())[key] != value:
        assert time.monotonic() < give_up, f"{key} stayed {stats[key]}, not {value}"
        await asyncio.sleep(0.02)
    return stats


async def test_pending_callbacks_survive_kill_9_with_a_store(tmp_path: Path) -> None:
    store = str(tmp_path / "feed.db")
    patient = replace(FAST_CALLBACKS, attempts=100_000)
    token = tmp_path / "bearer"
    token.write_text("from-a-file\n")
    flags = ("--store", store, *callback_args(patient), "--callback-bearer-file", str(token))
    async with CallbackReceiver({"/dlr": replies(*[503] * 100_000)}) as receiver:
        lines = tmp_path / "receipts.jsonl"
        lines.write_text(json.dumps({**receipt_body(1), "dlr_url": receiver.url()}) + "\n")
        first, target = start_fakegw_process(*flags)
        try:
            cli = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "fakegw", "inject", "--target", target),
                *("--login", LOGIN, "--password", PASSWORD, str(lines)),
                stdout=asyncio.subprocess.PIPE,
            )
            output, _ = await cli.communicate()
            assert json.loads(output)["callbacks"] == 1
            await wait_until(lambda: len(receiver.received) >= 2)  # refused, and retried
        finally:
            stop_fakegw_process(first, signal.SIGKILL)

        receiver.script.clear()  # from now on the receiver takes it
        second, target = start_fakegw_process(*flags)
        try:
            async with AdminClient(target, LOGIN, PASSWORD) as admin:
                stats = await _stats_until(admin, "callbacks_delivered", 1)
            assert stats["callbacks_pending"] == 0
            assert receiver.bodies()[-1] == receipt_body(1)
            assert {r.headers["authorization"] for r in receiver.received} == {"Bearer from-a-file"}
        finally:
            assert stop_fakegw_process(second, signal.SIGTERM) == 0

        # Delivered is done: a third start has nothing pending and POSTs nothing.
        third, target = start_fakegw_process(*flags)
        try:
            async with AdminClient(target, LOGIN, PASSWORD) as admin:
                assert (await admin.stats())["callbacks_pending"] == 0
        finally:
            stop_fakegw_process(third, signal.SIGTERM)
