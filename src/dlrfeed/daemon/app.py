"""The composition root of `dlrfeed run`: opens the store and the channel, wires the pipeline
(`pipeline.py`) to its telemetry (`telemetry.py`), serves metrics and health, talks to systemd,
and unwinds everything in order on one `AsyncExitStack`.

Data path per process: FeedReader x N → Batcher x N → Store.ingest (one transaction per batch) →
Acker (one) → Ack. The stack, as it unwinds on SIGTERM/SIGINT (`stop()`): the pipeline's ordered
stop within `--shutdown-timeout` (stop reading → commit the batch in hand → flush acks → only
then close the streams: closing first would release receipts already stored, F7) → cancel what
still runs → close the metrics server → close the channel → close the pool → remove the signal
handlers. After a failure the same stack unwinds without the ordered stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import structlog

from dlrfeed.domain.receipt import Receipt
from dlrfeed.feed.channel import open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient
from dlrfeed.feed.modes import Mode
from dlrfeed.store.quality import GroupBy, JsonDict, Window, route_name

from .http import MetricsServer
from .lifecycle import ServiceStore, checked, handle_stop_signals, open_store, until_stopped
from .metrics import DaemonMetrics, RouteFigures
from .pipeline import Pipeline
from .sdnotify import SystemdNotifier
from .settings import DaemonSettings, redact_url
from .telemetry import Telemetry

if TYPE_CHECKING:
    from types import TracebackType

    from dlrfeed.store.store import IngestResult

log = structlog.get_logger("dlrfeed.daemon")


class DaemonStore(ServiceStore, Protocol):
    """What the daemon needs of `dlrfeed.store.Store`."""

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult: ...

    async def quality(self, by: GroupBy, window: Window) -> list[JsonDict]: ...


QUALITY_WINDOW = timedelta(hours=24)
"""The route gauges cover the messages sent in the last day."""


async def route_figures(store: DaemonStore) -> list[RouteFigures]:
    """`dlrfeed quality --by route` over QUALITY_WINDOW, the busiest route first, as the
    gauges take it (default thresholds, docs/quality.md)."""
    now = datetime.now(UTC)
    groups = await store.quality("route", Window(since=now - QUALITY_WINDOW, until=now, now=now))
    return [
        RouteFigures(route_name(g["route"]), tuple(g["signals"]), g["verification_gap"])
        for g in groups
    ]


StoreOpener = Callable[[DaemonSettings], Awaitable[DaemonStore]]


class Daemon:
    """One worker process: see the module docstring. `await run()` returns the exit status."""

    def __init__(
        self,
        settings: DaemonSettings,
        *,
        store_opener: StoreOpener = open_store,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        self.settings = settings
        self._store_opener = store_opener
        self._notifier = notifier or SystemdNotifier()
        self.metrics = DaemonMetrics(quality_routes=settings.quality_routes)
        self._telemetry = Telemetry(self.metrics, lease_seconds=settings.lease_seconds)
        self._stop = asyncio.Event()
        self._metrics_server: MetricsServer | None = None
        self._stopped_in_order = False
        self._store: DaemonStore | None = None
        self.ready = asyncio.Event()
        """Set once readers run (tests and the supervisor wait on it)."""

    def stop(self) -> None:
        """Ask for a clean stop; idempotent, safe from a signal handler."""
        self._stop.set()

    @property
    def metrics_port(self) -> int:
        """The port /metrics and /healthz listen on (0 without `--metrics`)."""
        return self._metrics_server.port if self._metrics_server else 0

    async def run(self) -> int:
        """Run until `stop()` or a fatal error; 0 after a clean stop (raises fatal errors)."""
        self._log_start()
        async with contextlib.AsyncExitStack() as stack:  # unwound in reverse: the module doc
            stack.callback(log.info, "daemon_stopped")
            handle_stop_signals(stack, self.stop)
            pipeline = await self._open(stack)
            if pipeline is None:
                return 0  # stopped while waiting for the store or the gateway
            self._start(pipeline, stack)
            await self._serve(pipeline)
        return 0 if self._stopped_in_order else 1

    async def _open(self, stack: contextlib.AsyncExitStack) -> Pipeline | None:
        """Store, channel, gateway login, then the pipeline, each closed on `stack`; None if
        stopped while waiting for the store or the gateway."""
        s = self.settings
        store: DaemonStore | None = await until_stopped(self._stop, self._open_store)
        if store is None:
            return None
        stack.push_async_callback(store.close)  # unwound last: the pool
        self._store = store
        channel = open_channel(s.gateway, s.tls, max_message_bytes=s.max_message_bytes)
        stack.push_async_callback(channel.close, None)  # grace=None
        stream_channel = None
        if s.mode is not Mode.PULL:
            # Closed after the streams (the ordered stop closes them) and before the pool.
            stream_channel = open_stream_channel(s.gateway, s.tls)
            stack.callback(stream_channel.close)
        client = FeedClient(channel, s.login, s.password, stream_channel=stream_channel)
        if not await until_stopped(self._stop, client.check_access, hint=_feed_start_hint(s)):
            return None
        pipeline = Pipeline(s, client, store, self._telemetry)
        self._telemetry.watch(pipeline)
        if s.metrics is not None:
            server = MetricsServer(self.metrics.registry, lambda: self._telemetry.health(store))
            self._metrics_server = server
            stack.push_async_callback(server.close)
        stack.push_async_callback(pipeline.cancel)  # whatever still runs after the stop
        return pipeline

    def _start(self, pipeline: Pipeline, stack: contextlib.AsyncExitStack) -> None:
        """Start the pipeline's tasks and the telemetry's; its ordered stop goes on the stack."""
        s = self.settings
        pipeline.start()
        if s.summary_interval > 0:
            pipeline.spawn(self._telemetry.summaries(s.summary_interval), "summary")
        store = self._store
        if store is not None and s.metrics is not None and s.quality_interval > 0:
            gauges = self._telemetry.route_gauges(lambda: route_figures(store), s.quality_interval)
            pipeline.spawn(gauges, "route-quality")
        if self._notifier.watchdog_interval:
            watchdog = self._telemetry.watchdog(self._notifier, self._notifier.watchdog_interval)
            pipeline.spawn(watchdog, "watchdog")

        async def stop_in_order(
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> bool:
            # Only after a stop request: after a failure there is nothing to finish in order,
            # and `pipeline.cancel`, next on the stack, ends what still runs.
            if exc_type is None:
                self._stopped_in_order = await pipeline.stop_in_order(s.shutdown_timeout)
            return False

        stack.push_async_exit(stop_in_order)  # unwound first

    async def _serve(self, pipeline: Pipeline) -> None:
        """Serve metrics, report ready, and wait for a stop (returns) or a failure (raises)."""
        s = self.settings
        if self._metrics_server is not None and s.metrics is not None:
            await self._metrics_server.start(*s.metrics)
        self._notifier.notify(READY="1", STATUS=f"draining {s.login} with {s.streams} readers")
        self.ready.set()
        # The port bound, not the one asked for: `--metrics HOST:0` lets the kernel choose one,
        # so whoever started the daemon learns from this line where to scrape.
        listening = {"metrics_port": self.metrics_port} if self._metrics_server else {}
        log.info("daemon_ready", readers=len(pipeline.readers), **listening)
        failure = await pipeline.wait_for_stop_or_failure(self._stop)
        self._notifier.notify(STOPPING="1", STATUS="stopping")
        if failure is not None:
            raise failure

    def _log_start(self) -> None:
        s = self.settings
        log.info(
            "daemon_starting",
            gateway=s.gateway,
            login=s.login,
            database=redact_url(s.database_url),
            password_from=s.password_source,
            mode=s.mode.value,
            streams=s.streams,
            batch_size=s.batch_size,
            ack_batch=s.ack_batch,
            window=s.window,
            tls=s.tls is not None,
        )
        if s.password_file_mode is not None:
            # docs/security.md: the gateway password must be readable by the service user only.
            log.warning(
                "password_file_exposed",
                mode=f"{s.password_file_mode:04o}",
                fix="chmod 600 (or 400) the --password-file; group and others can reach it",
            )

    async def _open_store(self) -> DaemonStore:
        return await checked(await self._store_opener(self.settings))


def _feed_start_hint(settings: DaemonSettings) -> str | None:
    """A gateway that demands a client certificate refuses one without it by closing the
    socket, which the client cannot tell from a network drop (docs/daemon.md): while the feed
    cannot be reached over TLS with no client certificate, say so with each retry."""
    if settings.tls is None or settings.tls.client_cert is not None:
        return None
    return (
        "if the gateway requires a client certificate (mTLS), pass --client-cert and --client-key"
    )
