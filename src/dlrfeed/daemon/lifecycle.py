"""What every long-running dlrfeed service does at start and stop, whatever it serves: open its
store and check the schema, retry its start-up through outages, stop cleanly on SIGTERM/SIGINT,
and ping systemd's watchdog while its event loop turns (`dlrfeed run`, `dlrfeed relay`,
`dlrfeed webhook`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from dlrfeed.backoff import Backoff
from dlrfeed.errors import FeedUnavailableError, StoreUnavailableError

from .sdnotify import SystemdNotifier

if TYPE_CHECKING:
    from dlrfeed.config import Pooler
    from dlrfeed.domain.options import IntegrationOptions
    from dlrfeed.store import Store

log = structlog.get_logger("dlrfeed.daemon")

STARTUP_DELAY = Backoff(initial=0.2, maximum=10.0)
"""Between start-up attempts while the store or the gateway cannot be reached."""


class StoreSettings(Protocol):
    """What a service's settings say of its store."""

    @property
    def database_url(self) -> str: ...

    @property
    def db_pool_size(self) -> int: ...

    @property
    def integration(self) -> IntegrationOptions: ...

    @property
    def database_pooler(self) -> Pooler: ...

    @property
    def require_synchronous_commit(self) -> bool: ...


class ServiceStore(Protocol):
    """What every service needs of its store, besides its own work: a schema check at start,
    a ping for its store gate, and a close."""

    async def ping(self) -> None: ...

    async def check_schema(self) -> None: ...

    async def close(self) -> None: ...


_S = TypeVar("_S", bound=ServiceStore)


async def open_store(settings: StoreSettings) -> Store:
    """Open the real PostgreSQL store with the service's pool size and rules."""
    from dlrfeed.store import Store  # the adapter is imported only by the composition roots

    return await Store.open(
        settings.database_url,
        pool_size=settings.db_pool_size,
        options=settings.integration,
        pooler=settings.database_pooler,
        require_synchronous_commit=settings.require_synchronous_commit,
    )


async def checked(store: _S) -> _S:
    """`store`, once its schema is current; closed when it is not (the error is raised)."""
    try:
        await store.check_schema()
    except BaseException:
        await store.close()
        raise
    return store


def handle_stop_signals(stack: contextlib.AsyncExitStack, stop: Callable[[], None]) -> None:
    """SIGTERM/SIGINT call `stop` until `stack` unwinds."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def remove() -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for signum in signals:
                loop.remove_signal_handler(signum)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        for signum in signals:
            loop.add_signal_handler(signum, stop)
    stack.callback(remove)


async def until_stopped(
    stop: asyncio.Event, attempt: Callable[[], Awaitable[Any]], hint: str | None = None
) -> Any:
    """Retry a start-up step through transient outages (no crash loop); None if stopped.
    `hint`, when given, is logged with each retry: what else the failure may mean."""
    tries = 0
    while not stop.is_set():
        try:
            result = await attempt()
        except (StoreUnavailableError, FeedUnavailableError) as exc:
            tries += 1
            delay = STARTUP_DELAY.delay(tries)
            log.warning(
                "startup_waiting",
                error=str(exc),
                retry_in_s=round(delay, 2),
                **({"hint": hint} if hint else {}),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
            continue
        return True if result is None else result
    return None


async def ping_watchdog(notifier: SystemdNotifier, stop: asyncio.Event) -> None:
    """WATCHDOG=1 at half the unit's WatchdogSec while the event loop turns: a hung loop stops
    the pings and systemd restarts the unit. A PostgreSQL outage does not (the service waits
    it out and says so in its metrics): a restart would not bring the server back."""
    if notifier.watchdog_interval is None:
        return
    while not stop.is_set():
        notifier.notify(WATCHDOG="1")
        try:
            async with asyncio.timeout(notifier.watchdog_interval):
                await stop.wait()
        except TimeoutError:
            pass
