"""The status-change log (docs/changes.md): read it (`read_changes`), follow it
(`follow_changes`), keep a place (`load_cursor`, `save_cursor`, `consume_changes`).

Readers see only positions below the horizon of the oldest transaction still running, which
makes "changes after P" gap-free (the proof is in the schema, on dlr.status_change_rows): a
reader that keeps the last position it handled never misses a change nor sees one twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from dlrfeed.backoff import Backoff
from dlrfeed.errors import ConfigError, FatalError, SchemaOutOfDateError, StoreUnavailableError
from dlrfeed.store.sql import query

log = structlog.get_logger("dlrfeed.changes")

RECONNECT_BACKOFF = Backoff(0.2, 10.0)
"""Between a follower's attempts to reach PostgreSQL again."""

CHANNEL = "dlr_status_changes"
"""The NOTIFY channel the log's trigger signals at every commit that wrote changes."""

READ_CHANGES = query("read_changes")
CHANGES_HELD_BACK = query("changes_held_back")
BACKLOG = query("backlog")
LOAD_CURSOR = query("load_cursor")
SAVE_CURSOR = query("save_cursor")
CREATE_CURSOR = query("create_cursor")
LOCK_CURSOR = query("lock_cursor")
_NOTIFY_PROBE = query("notify_probe")

BACKLOG_COUNT_CAP = 1_000_000
"""The most changes `backlog` counts: a relay refreshing its gauges every second never scans
a huge backlog."""


@dataclass(frozen=True)
class StatusChange:
    """One change of a message's computed status, as the log recorded it."""

    position: int
    login: str
    message_id: str
    status: str | None
    """None: the message has no computed status any more (withdrawn by a recompute; the
    withdrawn one is `previous_status`)."""
    is_final: bool
    reason: str
    previous_status: str | None
    previous_is_final: bool | None
    previous_reason: str | None
    supporting_event_id: int
    rules_version: str
    changed_at: datetime

    @property
    def reason_only(self) -> bool:
        """P23: a correction of the reason alone - the status and whether it is final are the
        previous ones (a recompute under new wording): never a message newly final."""
        return (
            self.previous_status is not None
            and self.status == self.previous_status
            and self.is_final == self.previous_is_final
        )

    def to_json(self) -> dict[str, Any]:
        """The change as a JSON-ready dict (the `dlrfeed changes --json` line, the relay's
        items): every field, `reason_only`, `changed_at` in ISO 8601."""
        fields = dataclasses.asdict(self)
        del fields["changed_at"]  # last, after reason_only
        return {
            **fields,
            "reason_only": self.reason_only,
            "changed_at": self.changed_at.isoformat(),
        }


def _change(record: asyncpg.Record) -> StatusChange:
    values = dict(record.items())
    values["position"] = int(values["position"])
    return StatusChange(**values)


# The driver's errors that mean "this connection or the server failed": reconnect (or, where
# _translated says so, stop with a configuration error). InternalClientError belongs here: a
# backend terminated under the connection (an administrator, a failover) can leave asyncpg's
# protocol waiting for a reply that never comes ("cannot switch to state ...; another operation
# is in progress") for every later statement; the connection is as good as lost.
DRIVER_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


def _translated(exc: BaseException) -> BaseException:
    """asyncpg/OS errors as the project's own (STYLE: translate errors at the boundary)."""
    if isinstance(
        exc, asyncpg.InsufficientPrivilegeError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return ConfigError(f"PostgreSQL refused: {exc} (docs/changes.md, Roles)")
    if isinstance(exc, asyncpg.UndefinedTableError):
        return SchemaOutOfDateError("the change log is missing: run `dlrfeed migrate`")
    return StoreUnavailableError(f"PostgreSQL: {exc}")


@contextmanager
def _translating() -> Iterator[None]:
    """The driver's errors raised in the block, as the project's own (`_translated`)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise _translated(exc) from exc


async def read_changes(
    conn: asyncpg.Connection, after: int = 0, limit: int = 1000
) -> list[StatusChange]:
    """The first `limit` changes with a position above `after`, in position order.

    Only changes that can no longer be preceded by another are returned (the horizon of the
    oldest running transaction), so calling again with the last position returned never skips
    a change and never repeats one, however many writers run at once.
    """
    with _translating():
        return [_change(r) for r in await READ_CHANGES.fetch(conn, after=after, limit=limit)]


async def changes_held_back(conn: asyncpg.Connection, after: int) -> bool:
    """True when changes after `after` have committed but wait for an older transaction."""
    with _translating():
        return bool(await CHANGES_HELD_BACK.fetchval(conn, after=after))


async def backlog(conn: asyncpg.Connection, after: int) -> tuple[int, datetime | None]:
    """(how many changes are committed after `after`, at most BACKLOG_COUNT_CAP; when the
    first of them was made)."""
    with _translating():
        row = await BACKLOG.fetchrow(conn, after=after, count_cap=BACKLOG_COUNT_CAP)
    assert row is not None
    return int(row["pending"]), row["oldest"]


async def load_cursor(conn: asyncpg.Connection, consumer: str) -> int:
    """The last position `consumer` handled (0, the beginning, for a new consumer)."""
    with _translating():
        position = await LOAD_CURSOR.fetchval(conn, consumer=consumer)
    return 0 if position is None else int(position)


async def save_cursor(conn: asyncpg.Connection, consumer: str, position: int) -> None:
    """Record that `consumer` has handled everything up to `position` (never moves back)."""
    with _translating():
        await SAVE_CURSOR.execute(conn, consumer=consumer, position=position)


ChangeHandler = Callable[[asyncpg.Connection, Sequence[StatusChange]], Awaitable[None]]


async def consume_changes(
    conn: asyncpg.Connection, consumer: str, handler: ChangeHandler, limit: int = 1000
) -> int:
    """Hand the next changes of `consumer` to `handler`, effect and cursor in one transaction.

    Opens a transaction on `conn`, locks the consumer's cursor row, reads up to `limit` changes
    after it, awaits `handler(conn, changes)` — which writes its effect through `conn` — and
    moves the cursor to the last change, then commits. Either the effect and the new cursor
    both commit or neither does, so each change takes effect exactly once, even across
    crashes and with several instances of the same consumer. Returns how many were handled
    (0: nothing new; the handler is not called).
    """
    with _translating():
        async with conn.transaction():
            await CREATE_CURSOR.execute(conn, consumer=consumer)
            after = int(await LOCK_CURSOR.fetchval(conn, consumer=consumer))
            changes = await read_changes(conn, after, limit)
            if changes:
                await handler(conn, changes)
                await save_cursor(conn, consumer, changes[-1].position)
    return len(changes)


class _Wakeups:
    """LISTEN on the change channel when notifications reach this client; otherwise nothing
    to wait on and the follower polls. The probe is sent from a second connection, as a
    writer's would be: through a transaction pooler LISTEN succeeds, but a notification sent
    from another client never reaches this one (the listening server session is back in the
    pool), and a probe sent from our own session could be answered on that same session."""

    PROBE_TIMEOUT = 2.0

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.listening = False

    def _on_notification(self, *_: object) -> None:
        self.event.set()

    async def start(self, conn: asyncpg.Connection, dsn: str) -> None:
        probe = f"{CHANNEL}_probe_{os.getpid()}_{id(self)}"
        arrived = asyncio.Event()

        def on_probe(*_: object) -> None:
            arrived.set()

        try:
            await conn.add_listener(CHANNEL, self._on_notification)
            await conn.add_listener(probe, on_probe)
            sender = await asyncpg.connect(dsn, statement_cache_size=0)
            try:
                await _NOTIFY_PROBE.execute(sender, channel=probe)
            finally:
                await _close_quietly(sender)
            async with asyncio.timeout(self.PROBE_TIMEOUT):
                await arrived.wait()
            await conn.remove_listener(probe, on_probe)
        except (TimeoutError, asyncpg.PostgresError) as exc:
            reason = "no notification arrived" if isinstance(exc, TimeoutError) else str(exc)
            log.warning("changes_listen_unavailable", reason=reason, mode="polling")
            return
        self.listening = True

    async def wait(self, seconds: float, stop: asyncio.Event | None) -> None:
        """Until a notification, `stop`, or `seconds`."""
        waits = [asyncio.ensure_future(self.event.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        self.event.clear()


@dataclass(frozen=True)
class FollowTiming:
    """How a follower waits. With LISTEN a commit wakes it at once and `listen_poll` is only
    a safety net; without, it polls every `fallback_poll` seconds. `held_back_retry` is the
    quick second look when committed changes wait behind an older transaction."""

    listen_poll: float = 5.0
    fallback_poll: float = 0.1
    held_back_retry: float = 0.02


async def follow_changes(
    dsn: str,
    after: int = 0,
    *,
    limit: int = 1000,
    stop: asyncio.Event | None = None,
    timing: FollowTiming | None = None,
) -> AsyncGenerator[list[StatusChange], None]:
    """Every change after `after`, as batches of up to `limit`, in position order, forever.

    Keeps one connection of its own: LISTENs on the change channel when it can (a commit
    wakes it within milliseconds), polls when it cannot (`changes_listen_unavailable` is
    logged once per connection). Reconnects with backoff when the server goes away, resuming
    after the last position yielded. Ends when `stop` is set. A caller that must survive its
    own restarts stores the last position it handled (`save_cursor`) and passes it back.
    """
    timing = timing or FollowTiming()
    position = after
    attempt = 0
    while stop is None or not stop.is_set():
        conn: asyncpg.Connection | None = None
        try:
            # No statement cache: the follower may go through a transaction pooler.
            conn = await asyncpg.connect(dsn, statement_cache_size=0)
            wakeups = _Wakeups()
            await wakeups.start(conn, dsn)
            attempt = 0
            idle = timing.listen_poll if wakeups.listening else timing.fallback_poll
            while stop is None or not stop.is_set():
                batch = await read_changes(conn, position, limit)
                if batch:
                    position = batch[-1].position
                    yield batch
                    continue
                held = await changes_held_back(conn, position)
                await wakeups.wait(timing.held_back_retry if held else idle, stop)
        except (StoreUnavailableError, *DRIVER_ERRORS) as exc:
            translated = exc if isinstance(exc, StoreUnavailableError) else _translated(exc)
            if isinstance(translated, FatalError):
                raise translated from exc
            attempt += 1
            log.warning("changes_reconnect", attempt=attempt, error=str(exc))
            await _sleep(RECONNECT_BACKOFF.delay(attempt), stop)
        finally:
            if conn is not None:
                await _close_quietly(conn)


async def _sleep(seconds: float, stop: asyncio.Event | None) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def _close_quietly(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2)
    except (*DRIVER_ERRORS, TimeoutError):
        conn.terminate()
