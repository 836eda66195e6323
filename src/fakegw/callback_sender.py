"""POSTs callbacks to their `dlr_url`s on the gateway's event loop (F2: the webhook wins).

Pending callbacks wait in a heap by due time; one dispatcher task hands the due ones to a
fixed set of worker tasks, so at most `concurrency` POSTs are in flight, over one shared
httpx connection pool. Order is best effort, as on the feed (F13). A callback is journaled
when it is made and deleted when it is done (fakegw.persistence), so with a store file a
restarted gateway resumes what was pending: delivery is at least once, and a POST whose answer
was not yet recorded when the process died is made again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import itertools
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import httpx
import structlog

from fakegw.activity import LoginActivity
from fakegw.callbacks import (
    Callback,
    CallbackSettings,
    Outcome,
    outcome_of,
    retry_after_seconds,
    retry_delay,
    webhook_body,
)
from fakegw.faults import Faults
from fakegw.persistence import Journal
from fakegw.wire import ReceiptFields

log = structlog.get_logger("fakegw.callbacks")


class _Answer(NamedTuple):
    """One POST's answer: its status (None when none came), or what went wrong instead."""

    status: int | None
    retry_after: float | None
    problem: str


def _redacted(url: httpx.URL) -> str:
    """The URL without its credentials, for logs."""
    return str(url.copy_with(username=None, password=None))


CallbackLedger = Callable[[str, str, Sequence[tuple[str, ReceiptFields]], float], None]
"""Where the sender records (kind, login, [(key, fields)], at) for the invariant checker: each
callback made (`callback`) and each answered 2xx (`callback_answered`)."""


class CallbackSender:
    """The gateway's callbacks in flight: retries, concurrency, counters, durability."""

    def __init__(
        self,
        settings: CallbackSettings,
        journal: Journal,
        faults: Faults,
        activities: Mapping[str, LoginActivity],
        ledger: CallbackLedger,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._journal = journal
        self._faults = faults
        self._activities = activities
        self._pending: dict[str, Callback] = {}
        self._pending_by_login: Counter[str] = Counter()
        self._due: list[tuple[float, int, str]] = []  # a heap of (due_at, order, key)
        self._order = itertools.count()
        self._ready: asyncio.Queue[Callback] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._jitter = random.Random()
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def restore(self, rows: Iterable[tuple[str, str, str, str, int, float]]) -> None:
        """Take back the journal's pending callbacks; each keeps its attempts and due time."""
        for key, login, url, fields_json, attempts, due_at in rows:
            if login not in self._activities:
                continue  # a login no longer configured keeps its rows, unsent
            fields: ReceiptFields = json.loads(fields_json)
            self._add(Callback(key, login, url, fields, attempts, due_at))

    def submit(self, login: str, items: Iterable[tuple[str, ReceiptFields]], now: float) -> int:
        """Make one callback per `(dlr_url, fields)`, due now; how many. The caller commits
        the journal before it answers, so an answered Inject or Report survives a crash."""
        made = [Callback(uuid.uuid4().hex, login, url, fields, 0, now) for url, fields in items]
        for callback in made:
            self._add(callback)
        self._journal.record_callbacks(made)
        if made:
            self._ledger("callback", login, [(c.key, c.fields) for c in made], now)
        return len(made)

    def pending(self, login: str) -> int:
        """Callbacks of `login` not yet delivered, refused or given up."""
        return self._pending_by_login[login]

    def _add(self, callback: Callback) -> None:
        self._pending[callback.key] = callback
        self._pending_by_login[callback.login] += 1
        self._schedule(callback)

    def _schedule(self, callback: Callback) -> None:
        heapq.heappush(self._due, (callback.due_at, next(self._order), callback.key))
        self._wake.set()

    def _finish(self, callback: Callback) -> None:
        del self._pending[callback.key]
        self._pending_by_login[callback.login] -= 1
        self._journal.record_callback_done(callback.key)
        self._journal.mark_dirty()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the connection pool and start the dispatcher and the workers."""
        settings = self._settings
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_seconds),
            limits=httpx.Limits(
                max_connections=settings.concurrency,
                max_keepalive_connections=settings.concurrency,
            ),
            # A test fake calls the URLs it is given, never through a proxy from the environment.
            trust_env=False,
        )
        self._tasks = [asyncio.create_task(self._dispatch(), name="fakegw-callback-dispatcher")]
        self._tasks += [
            asyncio.create_task(self._work(), name=f"fakegw-callback-worker-{number}")
            for number in range(settings.concurrency)
        ]
        for task in self._tasks:
            task.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Stop the workers (a POST in flight is abandoned: it stays pending in the journal)
        and close the connection pool."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the work -------------------------------------------------------------------------
    async def _dispatch(self) -> None:
        """Move callbacks whose time has come to the workers; sleep until the next one."""
        while True:
            self._wake.clear()
            now = time.time()
            while self._due and self._due[0][0] <= now:
                _, _, key = heapq.heappop(self._due)
                self._ready.put_nowait(self._pending[key])
            timeout = self._due[0][0] - now if self._due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _work(self) -> None:
        while True:
            callback = await self._ready.get()
            await self._attempt(callback)

    async def _attempt(self, callback: Callback) -> None:
        """One POST of `callback`, then: done (delivered, refused, given up) or rescheduled."""
        settings = self._settings
        counters = self._activities[callback.login].counters
        callback.attempts += 1
        answer = await self._post(callback)
        outcome = outcome_of(answer.status)
        if outcome is Outcome.DELIVERED:
            if self._faults.chance(self._faults.callback_duplicate_rate):
                # The gateway "lost" the 2xx and POSTs the same body again; the receiver must
                # take it once. The repeat's own answer changes nothing.
                await self._post(callback)
                counters.callbacks_duplicated += 1
            counters.callbacks_delivered += 1
            self._ledger(
                "callback_answered", callback.login, [(callback.key, callback.fields)], time.time()
            )
            self._finish(callback)
        elif outcome is Outcome.REFUSED:
            counters.callbacks_refused += 1
            self._finish(callback)
            log.warning("callback_refused", **self._log_fields(callback), problem=answer.problem)
        elif callback.attempts >= settings.attempts:
            counters.callbacks_failed += 1
            self._finish(callback)
            log.warning("callback_given_up", **self._log_fields(callback), problem=answer.problem)
        else:
            counters.callbacks_retried += 1
            delay = retry_delay(callback.attempts, settings, self._jitter, answer.retry_after)
            callback.due_at = time.time() + delay
            self._journal.record_callback_retry(callback)
            self._journal.mark_dirty()
            self._schedule(callback)

    async def _post(self, callback: Callback) -> _Answer:
        client = self._client
        assert client is not None, "the sender has not started"
        url = httpx.URL(callback.url)
        headers = {"content-type": "application/json", "user-agent": "fakegw"}
        if url.username or url.password:
            # Credentials in the URL are the message's own: HTTP Basic, and they win.
            pair = f"{url.username}:{url.password}".encode()
            headers["authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
            url = url.copy_with(username=None, password=None)
        else:
            bearer = self._settings.bearer_for(callback.login)
            if bearer is not None:
                headers["authorization"] = f"Bearer {bearer}"
        try:
            response = await client.post(
                url, content=webhook_body(callback.fields), headers=headers
            )
        except httpx.TimeoutException:
            return _Answer(None, None, "timeout")
        except httpx.HTTPError as exc:
            # Connection refused or reset, a broken answer: no answer, like a timeout.
            return _Answer(None, None, f"{type(exc).__name__}: {exc}")
        status = response.status_code
        retry_after = retry_after_seconds(status, response.headers.get("retry-after"), time.time())
        return _Answer(status, retry_after, f"HTTP {status}")

    def _log_fields(self, callback: Callback) -> dict[str, object]:
        return {
            "login": callback.login,
            "id": callback.fields.get("id"),
            "receipt_level": callback.fields.get("level"),
            "url": _redacted(httpx.URL(callback.url)),
            "attempts": callback.attempts,
        }


def _log_failure(task: asyncio.Task[None]) -> None:
    """A dispatcher or worker that stops by itself is a bug: say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("callback_task_failed", task=task.get_name(), exc_info=task.exception())
