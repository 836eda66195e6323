"""The composition root of `dlrfeed webhook`: opens the store, wires the intake (group commit)
to the HTTP server, serves metrics and health, talks to systemd, and stops in order.

The order on SIGTERM/SIGINT: stop listening and let the requests in progress finish within
`--shutdown-timeout` (each is answered after its commit, as always) → wait for the commits still
owed → stop the committers and the gate → close the metrics server → close the pool. A request
cut off by the timeout was not answered 2xx, so the gateway posts it again: at worst a repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import structlog
from aiohttp import web

from dlrfeed.daemon.http import MetricsServer
from dlrfeed.daemon.lifecycle import (
    ServiceStore,
    checked,
    handle_stop_signals,
    open_store,
    ping_watchdog,
    until_stopped,
)
from dlrfeed.daemon.sdnotify import SystemdNotifier
from dlrfeed.daemon.settings import redact_url
from dlrfeed.daemon.store_gate import StoreGate
from dlrfeed.webhook.connections import CappedSite, quiet_http_errors
from dlrfeed.webhook.intake import CallbackIntake, IntakeStore
from dlrfeed.webhook.metrics import WebhookMetrics
from dlrfeed.webhook.server import PATHS, CallbackServer
from dlrfeed.webhook.settings import WebhookSettings

log = structlog.get_logger("dlrfeed.webhook")

# Callbacks waiting for a commit before new ones are answered 503: four full commits per commit
# slot, and at least enough for a burst from many connections; past that the store is behind,
# and holding more would only lengthen every answer.
_BACKLOG_PER_COMMIT = 4
_MIN_BACKLOG = 1024


class WebhookStore(IntakeStore, ServiceStore, Protocol):
    """What the receiver needs of `dlrfeed.store.Store`."""


StoreOpener = Callable[[WebhookSettings], Awaitable[WebhookStore]]


class WebhookService:
    """One receiver process; `await run()` returns the exit status (raises fatal errors)."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        store_opener: StoreOpener = open_store,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        self.settings = settings
        self._store_opener = store_opener
        self._notifier = notifier or SystemdNotifier()
        self.metrics = WebhookMetrics()
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once callbacks are taken (tests wait on it)."""
        self.port = 0
        """The port callbacks are taken on (the one bound, for `--listen HOST:0`)."""
        self.metrics_port = 0
        self._intake: CallbackIntake | None = None

    def stop(self) -> None:
        """Ask for a clean stop; idempotent, safe from a signal handler."""
        self._stop.set()

    @property
    def callbacks_in_hand(self) -> int:
        """Callbacks taken and not yet answered: waiting for, or in, a commit."""
        return self._intake.in_hand if self._intake is not None else 0

    async def run(self) -> int:
        """Serve until `stop()` (0) or a fatal error (raised)."""
        s = self.settings
        log.info(
            "webhook_starting",
            login=s.login,
            database=redact_url(s.database_url),
            format=s.callback_format.value,
            secret_from=s.secret_source,
            batch_size=s.batch_size,
            commits=s.commits,
        )
        if s.secret_file_mode is not None:
            log.warning(
                "secret_file_exposed",
                mode=f"{s.secret_file_mode:04o}",
                fix="chmod 600 (or 400) the --secret-file; group and others can reach it",
            )
        async with contextlib.AsyncExitStack() as stack:  # unwound in reverse: the module doc
            stack.callback(log.info, "webhook_stopped")
            handle_stop_signals(stack, self.stop)
            store: WebhookStore | None = await until_stopped(self._stop, self._open_store)
            if store is None:
                return 0
            stack.push_async_callback(store.close)
            gate = StoreGate(store.ping, release_after=math.inf, on_release=lambda: None)
            self.metrics.store_up.set_function(lambda: 1.0 if gate.is_up else 0.0)
            intake = CallbackIntake(
                store,
                gate,
                login=s.login,
                batch_size=s.batch_size,
                commits=s.commits,
                on_commit=self.metrics.committed,
            )
            self._intake = intake
            tasks = _Tasks()
            stack.push_async_callback(tasks.cancel)
            tasks.spawn(intake.run(), "webhook-committers")
            tasks.spawn(gate.run(), "webhook-store-gate")
            if self._notifier.watchdog_interval:
                tasks.spawn(ping_watchdog(self._notifier, self._stop), "watchdog")
            await self._serve_metrics(stack, gate)
            server = CallbackServer(
                login=s.login,
                callback_format=s.callback_format,
                intake=intake,
                metrics=self.metrics,
                secrets=s.secrets,
                max_body_bytes=s.max_body_bytes,
                retry_after=s.retry_after,
                max_in_hand=max(s.batch_size * s.commits * _BACKLOG_PER_COMMIT, _MIN_BACKLOG),
                body_timeout=s.body_timeout,
                max_bodies_bytes=s.max_bodies_bytes,
                unreadable_per_minute=s.unreadable_per_minute,
            )
            stack.enter_context(quiet_http_errors(s.secrets))
            runner = web.AppRunner(
                server.app,
                access_log=None,  # an access log would write the path, and a secret may be in it
                shutdown_timeout=s.shutdown_timeout,
                # The idle and header deadline: aiohttp arms it when a connection opens and
                # after each answer, and closes a connection still short of a request then.
                keepalive_timeout=s.header_timeout,
                auto_decompress=False,  # the server decodes, keeping what it cannot (C8)
                handler_cancellation=False,
            )
            await runner.setup()
            stack.push_async_callback(self._stop_serving, runner, intake)
            site = CappedSite(
                runner,
                *s.listen,
                max_connections=s.max_connections,
                keep_broken=server.keep_broken_request,
                wants_body=server.wants_broken_body,
                max_body_bytes=s.max_body_bytes,
            )
            await site.start()
            self.port = _bound_port(runner)
            self._notifier.notify(
                READY="1", STATUS=f"taking callbacks of {s.login} on port {self.port}"
            )
            self.ready.set()
            log.info("webhook_ready", port=self.port, paths=list(PATHS), **self._metrics_field())
            failure = await tasks.wait_for_stop_or_failure(self._stop)
            self._notifier.notify(STOPPING="1", STATUS="stopping")
            if failure is not None:
                raise failure
        return 0

    async def _open_store(self) -> WebhookStore:
        return await checked(await self._store_opener(self.settings))

    async def _serve_metrics(self, stack: contextlib.AsyncExitStack, gate: StoreGate) -> None:
        if self.settings.metrics is None:
            return

        async def health() -> tuple[bool, str]:
            if not gate.is_up:
                return False, "PostgreSQL cannot take callbacks: answering 503"
            stalled = self._intake.stalled_seconds() if self._intake is not None else 0.0
            if stalled > self.settings.stalled_commit_seconds:
                return False, f"a commit has not finished in {stalled:.0f} s: callbacks wait"
            return True, "taking callbacks"

        server = MetricsServer(self.metrics.registry, health)
        await server.start(*self.settings.metrics)
        stack.push_async_callback(server.close)
        self.metrics_port = server.port

    def _metrics_field(self) -> dict[str, int]:
        return {"metrics_port": self.metrics_port} if self.settings.metrics else {}

    async def _stop_serving(self, runner: web.AppRunner, intake: CallbackIntake) -> None:
        """Stop listening, let the requests in progress be answered, then the commits owed."""
        await runner.cleanup()  # waits up to --shutdown-timeout for the handlers
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout):
                await intake.drain()
        except TimeoutError:
            log.warning("webhook_stop_timeout", receipts_in_hand=intake.in_hand)


class _Tasks:
    """The service's named tasks; a task that ends (only by failing) stops the service."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        self._tasks.append(asyncio.create_task(work, name=name))

    async def wait_for_stop_or_failure(self, stop: asyncio.Event) -> BaseException | None:
        """Wait for `stop` or for a task to end; the failure that ended it, if any."""
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            done, _ = await asyncio.wait(
                [stopping, *self._tasks], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        for task in done:
            if task is not stopping and not task.cancelled():
                error = task.exception()
                log.error("webhook_task_failed", task=task.get_name(), error=str(error))
                return error or RuntimeError(f"task {task.get_name()} ended")
        return None

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _bound_port(runner: web.AppRunner) -> int:
    address = runner.addresses[0]
    return int(address[1])
