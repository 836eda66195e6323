"""`dlrfeed relay`: pushes the status-change log to an HTTP endpoint (docs/changes.md).

Batched: one POST carries up to `batch_size` consecutive changes as `{"changes": [...]}`, in
position order, one request in flight at a time (so the changes of each message arrive in
order; a status withdrawn by a recompute is a change with `"status": null`). The body is
signed, `X-Dlrfeed-Signature: sha256=<hex HMAC-SHA256 of the raw body>`;
each change carries its `position`, the idempotency key a receiver dedupes on (a batch can be
delivered again after a crash, and may then hold more changes than the first time). A 2xx
moves the consumer's durable cursor past the batch; anything else — a 5xx, a 4xx, a timeout,
a refused connection — is retried with backoff, without end: the relay never skips a change.
It only reads the log, so a dead endpoint never slows ingestion; `dlrfeed_relay_lag_seconds`
says how far behind it is, `dlrfeed_relay_up` whether it reaches PostgreSQL at all. It refuses
a schema of another version than this code's (exit 78), as every command does.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import httpx
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from dlrfeed.backoff import Backoff
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.changes import (
    DRIVER_ERRORS,
    FollowTiming,
    StatusChange,
    backlog,
    follow_changes,
    load_cursor,
    save_cursor,
)
from dlrfeed.store.migrate import ensure_current

log = structlog.get_logger("dlrfeed.relay")

RECONNECT_BACKOFF = Backoff(0.2, 10.0)
"""Between attempts to reach PostgreSQL, as the daemon's start-up waits."""

SIGNATURE_HEADER = "X-Dlrfeed-Signature"


def sign(secret: bytes, body: bytes) -> str:
    """The signature header's value for `body`: `sha256=` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def encode_batch(changes: Sequence[StatusChange]) -> bytes:
    """The request body: `{"changes": [...]}`, compact JSON, keys sorted, UTF-8."""
    document = {"changes": [change.to_json() for change in changes]}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class RelayMetrics:
    """The relay's Prometheus metrics (names fixed: the alert rules use them)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.lag = Gauge(
            "dlrfeed_relay_lag_seconds",
            "Age of the oldest change not yet delivered (0 when caught up)",
            registry=self.registry,
        )
        self.pending = Gauge(
            "dlrfeed_relay_pending_changes",
            "Changes committed after the relay's cursor (counted up to 1,000,000)",
            registry=self.registry,
        )
        self.delivered = Counter(
            "dlrfeed_relay_delivered",
            "Changes delivered to the endpoint (2xx)",
            registry=self.registry,
        )
        self.attempt_failures = Counter(
            "dlrfeed_relay_attempt_failures",
            "POST attempts that did not get a 2xx (non-2xx, timeout, connection error)",
            registry=self.registry,
        )
        self.up = Gauge(
            "dlrfeed_relay_up",
            "1 while the relay follows the change log (PostgreSQL answers its backlog probe),"
            " 0 while it runs but cannot reach PostgreSQL",
            registry=self.registry,
        )


@dataclass(frozen=True)
class RelaySettings:
    """What `dlrfeed relay` needs, validated; `secret` never reaches a log or repr."""

    database_url: str
    url: str
    secret: bytes = field(repr=False)
    consumer: str = "relay"
    batch_size: int = 100
    timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 30.0
    metrics_interval: float = 1.0


class Relay:
    """Follows the change log from the consumer's cursor and POSTs it, batch by batch."""

    def __init__(self, settings: RelaySettings, metrics: RelayMetrics | None = None) -> None:
        self._settings = settings
        self.metrics = metrics or RelayMetrics()
        self._delivered_position: int | None = None
        self._retry = Backoff(settings.retry_initial, settings.retry_max)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop` is set; returns after the batch in hand is delivered or given
        back (its cursor untouched). A missing schema or a refused privilege is fatal."""
        settings = self._settings
        self.metrics.up.set(0)
        cursor_conn = await self._connect(stop)
        try:
            if cursor_conn is None:
                return
            try:
                await ensure_current(cursor_conn)
            except DRIVER_ERRORS as exc:
                raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc
            self._delivered_position = await load_cursor(cursor_conn, settings.consumer)
            self.metrics.up.set(1)
            log.info(
                "relay_started",
                consumer=settings.consumer,
                after=self._delivered_position,
                url=settings.url,
            )
            watching = asyncio.create_task(self._watch_backlog(stop), name="relay-backlog")
            try:
                async with httpx.AsyncClient(timeout=settings.timeout) as client:
                    changes = follow_changes(
                        settings.database_url,
                        self._delivered_position,
                        limit=settings.batch_size,
                        stop=stop,
                        timing=FollowTiming(),
                    )
                    async for batch in changes:
                        if not await self._deliver(client, batch, stop):
                            break  # stopped while retrying: the cursor stays before the batch
                        cursor_conn = await self._save(cursor_conn, batch[-1].position, stop)
                        if cursor_conn is None:
                            break
                    await changes.aclose()
            finally:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
        finally:
            self.metrics.up.set(0)
            if cursor_conn is not None:
                await cursor_conn.close()
            log.info("relay_stopped", consumer=settings.consumer, at=self._delivered_position)

    async def _deliver(
        self, client: httpx.AsyncClient, batch: Sequence[StatusChange], stop: asyncio.Event
    ) -> bool:
        """POST `batch` until a 2xx (True) or until `stop` (False)."""
        body = encode_batch(batch)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._settings.secret, body),
        }
        attempt = 0
        while not stop.is_set():
            attempt += 1
            try:
                response = await client.post(self._settings.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if 200 <= response.status_code < 300:
                    self.metrics.delivered.inc(len(batch))
                    log.debug(
                        "relay_delivered",
                        changes=len(batch),
                        first=batch[0].position,
                        last=batch[-1].position,
                    )
                    return True
                failure = f"HTTP {response.status_code}"
            self.metrics.attempt_failures.inc()
            delay = self._retry.delay(attempt)
            log.warning(
                "relay_retry",
                attempt=attempt,
                error=failure,
                first=batch[0].position,
                retry_in_s=round(delay, 2),
            )
            await _wait(stop, delay)
        return False

    async def _connect(self, stop: asyncio.Event) -> asyncpg.Connection | None:
        attempt = 0
        while not stop.is_set():
            try:
                return await asyncpg.connect(self._settings.database_url, statement_cache_size=0)
            except DRIVER_ERRORS as exc:
                if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
                    raise FatalError(f"PostgreSQL refused the relay's login: {exc}") from exc
                attempt += 1
                log.warning("relay_store_unavailable", attempt=attempt, error=str(exc))
                await _wait(stop, RECONNECT_BACKOFF.delay(attempt))
        return None

    async def _save(
        self, conn: asyncpg.Connection, position: int, stop: asyncio.Event
    ) -> asyncpg.Connection | None:
        """Move the cursor to `position`, reconnecting until it is recorded (or `stop`)."""
        while True:
            try:
                await save_cursor(conn, self._settings.consumer, position)
            except StoreUnavailableError as exc:
                log.warning("relay_store_unavailable", error=str(exc))
                conn.terminate()
                reconnected = await self._connect(stop)
                if reconnected is None:
                    return None
                conn = reconnected
                continue
            self._delivered_position = position
            return conn

    async def _watch_backlog(self, stop: asyncio.Event) -> None:
        """Refresh the lag and pending gauges every `metrics_interval` seconds."""
        conn: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                try:
                    if conn is None:
                        conn = await asyncpg.connect(
                            self._settings.database_url, statement_cache_size=0
                        )
                    assert self._delivered_position is not None
                    pending, oldest = await backlog(conn, self._delivered_position)
                except (*DRIVER_ERRORS, StoreUnavailableError):
                    self.metrics.up.set(0)
                    if conn is not None:
                        conn.terminate()
                    conn = None
                else:
                    self.metrics.up.set(1)
                    self.metrics.pending.set(pending)
                    age = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
                    self.metrics.lag.set(max(age, 0.0))
                await _wait(stop, self._settings.metrics_interval)
        finally:
            if conn is not None:
                conn.terminate()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass
