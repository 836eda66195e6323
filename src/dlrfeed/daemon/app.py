"""The composition root of `dlrfeed run`: wires store, feed, readers, batchers and the Acker,
supervises their tasks, serves metrics and health, talks to systemd, and stops in order.

Data path per process: FeedReader x N → Batcher x N → Store.ingest (one transaction per batch) →
Acker (one) → Ack. Shutdown, on SIGTERM/SIGINT (`stop()`): stop reading → commit the batch in
hand → flush acks → only then close the streams (closing first would release receipts already
stored, F7) → close channel and store; all within `--shutdown-timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc.aio
import structlog

from dlrfeed.backoff import backoff_delay
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import DlrfeedError, FeedUnavailableError, StoreUnavailableError
from dlrfeed.feed.acker import Acker
from dlrfeed.feed.channel import open_channel
from dlrfeed.feed.client import FeedClient
from dlrfeed.feed.reader import FeedReader, Mode

from .batcher import Batcher
from .http import MetricsServer
from .metrics import DaemonMetrics
from .sdnotify import SystemdNotifier
from .settings import DaemonSettings, redact_url
from .store_gate import StoreGate

if TYPE_CHECKING:
    from dlrfeed.store.store import IngestResult

log = structlog.get_logger("dlrfeed.daemon")

# Outcomes that open an item in the investigation queue (CONTRACT §4 `dlr.exceptions` kinds).
EXCEPTION_OUTCOMES = (
    Outcome.CONFLICT,
    Outcome.UNCORRELATED,
    Outcome.UNRECOGNIZED,
    Outcome.UNEXPECTED_LEVEL,  # a `malformed` exception (F4)
    Outcome.UNSTORABLE,
)

LEASE_WARNING_FRACTION = 0.5
"""Warn when a receipt's receive→ack latency passes this fraction of the lease (F6)."""


class DaemonStore(Protocol):
    """What the daemon needs of `dlrfeed.store.Store`."""

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult: ...

    async def ping(self) -> None: ...

    async def check_schema(self) -> None: ...

    async def close(self) -> None: ...


StoreOpener = Callable[[DaemonSettings], Awaitable[DaemonStore]]


async def open_store(settings: DaemonSettings) -> DaemonStore:
    """Open the real PostgreSQL store with a pool sized for the readers."""
    from dlrfeed.store import Store  # the adapter is imported only by the composition root

    return await Store.open(
        settings.database_url, pool_size=settings.db_pool_size, options=settings.integration
    )


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
        self.metrics = DaemonMetrics()
        # Resolved once: `labels()` costs microseconds, and Subscribe counts every receipt.
        self._received_by_mode = {
            mode: self.metrics.received.labels(mode=mode.value)
            for mode in (Mode.SUBSCRIBE, Mode.PULL)
        }
        self._stop = asyncio.Event()
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._readers: list[FeedReader] = []
        self._batchers: list[Batcher] = []
        self._acker: Acker | None = None
        self._store: DaemonStore | None = None
        self._gate: StoreGate | None = None
        self._metrics_server: MetricsServer | None = None
        self._last_lease_warning = 0.0
        self.ready = asyncio.Event()
        """Set once readers run (tests and the supervisor wait on it)."""

    def stop(self) -> None:
        """Ask for a clean stop; idempotent, safe from a signal handler."""
        self._stop.set()

    @property
    def metrics_port(self) -> int:
        return self._metrics_server.port if self._metrics_server else 0

    # -- start ------------------------------------------------------------------------------
    async def run(self) -> int:
        """Run until `stop()` or a fatal error; 0 after a clean stop (raises fatal errors)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
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
        channel: grpc.aio.Channel | None = None
        try:
            self._store = await self._until_stopped(self._open_store)
            if self._store is None:
                return 0
            channel = open_channel(s.gateway, s.tls, max_message_bytes=s.max_message_bytes)
            client = FeedClient(channel, s.login, s.password)
            if not await self._until_stopped(client.check_access, hint=_feed_start_hint(s)):
                return 0
            return await self._serve(client, self._store)
        finally:
            if self._metrics_server is not None:
                await self._metrics_server.close()
            if channel is not None:
                await channel.close(grace=None)
            if self._store is not None:
                await self._store.close()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            log.info("daemon_stopped")

    async def _open_store(self) -> DaemonStore:
        store = await self._store_opener(self.settings)
        try:
            await store.check_schema()
        except BaseException:
            await store.close()
            raise
        return store

    async def _until_stopped(
        self, attempt: Callable[[], Awaitable[Any]], hint: str | None = None
    ) -> Any:
        """Retry a start-up step through transient outages (no crash loop); None if stopped.
        `hint`, when given, is logged with each retry: what else the failure may mean."""
        tries = 0
        while not self._stop.is_set():
            try:
                result = await attempt()
            except (StoreUnavailableError, FeedUnavailableError) as exc:
                tries += 1
                delay = backoff_delay(tries, 0.2, 10.0)
                log.warning(
                    "startup_waiting",
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                    **({"hint": hint} if hint else {}),
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                continue
            return True if result is None else result
        return None

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = name
        return task

    async def _serve(self, client: FeedClient, store: DaemonStore) -> int:
        s = self.settings
        m = self.metrics
        acker = Acker(
            client,
            ack_batch=s.ack_batch,
            ack_linger=s.ack_linger,
            lease_seconds=s.lease_seconds,
            max_pending=max(4 * s.ack_batch, s.streams * s.batch_size * 2),
            observe=self._observe_acks,
        )
        self._acker = acker
        gate = StoreGate(store.ping, release_after=s.release_after, on_release=self._release)
        self._gate = gate
        for index in range(s.streams):
            name = f"r{index}"
            batcher = Batcher(
                name,
                login=s.login,
                store=store,
                acker=acker,
                gate=gate,
                batch_size=s.batch_size,
                linger=s.linger,
                on_commit=self._observe_commit,
            )
            reader = FeedReader(
                name,
                client,
                batcher,
                s.reader,
                on_state=self._reader_state,
                on_received=self._observe_received,
            )
            self._batchers.append(batcher)
            self._readers.append(reader)
        m.track(
            in_flight=self._in_flight,
            store_up=lambda: 1.0 if gate.is_up else 0.0,
            counters=self._counter_values,
        )
        acker_task = self._spawn(acker.run(), "acker")
        self._spawn(gate.run(), "store-gate")
        for batcher in self._batchers:
            self._spawn(batcher.run(), f"batcher-{batcher.name}")
        reader_tasks = [self._spawn(r.run(), f"reader-{r.name}") for r in self._readers]
        if s.summary_interval > 0:
            self._spawn(self._summaries(), "summary")
        if self._notifier.watchdog_interval:
            self._spawn(self._watchdog(self._notifier.watchdog_interval), "watchdog")
        if s.metrics is not None:
            self._metrics_server = MetricsServer(m.registry, self._health)
            await self._metrics_server.start(*s.metrics)
        self._notifier.notify(READY="1", STATUS=f"draining {s.login} with {s.streams} readers")
        self.ready.set()
        log.info("daemon_ready", readers=len(self._readers))

        failure = await self._wait_for_stop_or_failure()
        self._notifier.notify(STOPPING="1", STATUS="stopping")
        clean = False
        if failure is None:
            try:
                clean = await self._clean_shutdown(acker, acker_task, reader_tasks)
            except DlrfeedError as exc:  # the Acker died while flushing: its exit status wins
                failure = exc
        await self._teardown()
        if failure is not None:
            raise failure
        return 0 if clean else 1

    async def _wait_for_stop_or_failure(self) -> BaseException | None:
        stop_task = asyncio.create_task(self._stop.wait(), name="stop-signal")
        try:
            waited: list[asyncio.Task[Any]] = [stop_task, *self._tasks]
            done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_task.cancel()
        for task in done:
            if task is stop_task:
                continue
            name = self._tasks[task]
            exc = task.exception() if not task.cancelled() else None
            if exc is None:
                exc = RuntimeError(f"task {name} ended unexpectedly")
            log.error("task_failed", task=name, error=str(exc), error_type=type(exc).__name__)
            return exc
        log.info("stop_requested")
        return None

    async def _clean_shutdown(
        self,
        acker: Acker,
        acker_task: asyncio.Task[None],
        reader_tasks: list[asyncio.Task[None]],
    ) -> bool:
        """Stop reading → commit in hand → flush acks → close streams; False on timeout."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout):
                for reader in self._readers:
                    reader.stop_reading()
                await asyncio.gather(*(r.settle(1.0) for r in self._readers))
                drains = asyncio.gather(*(b.drain() for b in self._batchers))
                # If the Acker dies (e.g. credentials revoked) the drain cannot finish.
                either: list[asyncio.Future[Any]] = [drains, acker_task]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if acker_task.done():
                    drains.cancel()
                    error = None if acker_task.cancelled() else acker_task.exception()
                    log.error("task_failed", task="acker", error=str(error))
                    if isinstance(error, DlrfeedError):
                        raise error  # e.g. credentials revoked: its own exit status (77)
                    return False
                await drains
                acker.close()
                await acker_task
                for reader in self._readers:
                    reader.close()  # F7: now closing releases nothing that is stored
                await asyncio.gather(*reader_tasks, return_exceptions=True)
        except TimeoutError:
            log.error(  # noqa: TRY400 - a timeout has no useful traceback
                "shutdown_timeout",
                timeout_s=self.settings.shutdown_timeout,
                in_flight=self._in_flight(),
            )
            return False
        log.info("shutdown_clean", seconds=round(time.monotonic() - started, 3))
        return True

    async def _teardown(self) -> None:
        """Cancel whatever still runs; a commit in progress is finished first (shielded)."""
        for batcher in self._batchers:
            batcher.abandon()
        for reader in self._readers:
            reader.close()
        if self._acker is not None:
            self._acker.close()
        for task in self._tasks:
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, result in zip(self._tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | DlrfeedError
            ):
                log.error("task_error_on_stop", task=self._tasks[task], error=repr(result))

    # -- callbacks ------------------------------------------------------------------------
    def _release(self) -> None:
        """F7: the store is down past --release-after; give the receipts back to the gateway."""
        for batcher in self._batchers:
            batcher.release()
        for reader in self._readers:
            reader.release()

    def _reader_state(self, reader: str, mode: Mode | None) -> None:
        self._refresh_readers_up()
        if mode is None:
            log.debug("reader_down", reader=reader)
        else:
            log.info("reader_up", reader=reader, mode=mode.value)

    def _refresh_readers_up(self) -> None:
        counts = {Mode.SUBSCRIBE: 0, Mode.PULL: 0}
        for reader in self._readers:
            if reader.mode is not None:
                counts[reader.mode] += 1
        for mode, count in counts.items():
            self.metrics.readers_up.labels(mode=mode.value).set(count)

    def _observe_received(self, mode: Mode, count: int) -> None:
        self._received_by_mode[mode].inc(count)

    def _observe_commit(
        self, batch: Sequence[Receipt], result: IngestResult, seconds: float
    ) -> None:
        m = self.metrics
        m.batches.inc()
        m.commit_seconds.observe(seconds)
        counts: Mapping[Outcome, int] = result.counts
        for outcome, count in counts.items():
            m.outcomes.labels(outcome=outcome.value).inc(count)
        repeats = counts.get(Outcome.REPEAT, 0)
        conflicts = counts.get(Outcome.CONFLICT, 0)
        exceptions = sum(counts.get(outcome, 0) for outcome in EXCEPTION_OUTCOMES)
        # Receptions written: an unstorable receipt is kept as exception evidence instead (C8).
        stored = len(batch) - counts.get(Outcome.UNSTORABLE, 0)
        m.stored.inc(stored)
        m.repeats.inc(repeats)
        m.conflicts.inc(conflicts)
        m.exceptions.inc(exceptions)
        m.delivery_count.observe_many(r.delivery_count for r in batch)
        t = m.totals
        t.stored += stored
        t.repeats += repeats
        t.conflicts += conflicts
        t.exceptions += exceptions

    def _observe_acks(self, received_at: Sequence[float], acked_at: float) -> None:
        latencies = [acked_at - t for t in received_at]
        self.metrics.receive_to_ack.observe_many(latencies)
        worst = max(latencies)
        lease = self.settings.lease_seconds
        if lease and worst >= LEASE_WARNING_FRACTION * lease:
            now = time.monotonic()
            if now - self._last_lease_warning >= 10.0:
                self._last_lease_warning = now
                # F6: past the lease the gateway redelivers; the store sees repeats (C1).
                log.warning("ack_latency_near_lease", latency_s=round(worst, 3), lease_s=lease)

    def _counter_values(self) -> dict[str, float]:
        stats = self._acker.stats if self._acker else None
        return {
            "acks_tokens": stats.tokens_acked if stats else 0,
            "acks_already_gone": stats.already_gone if stats else 0,
            "ack_calls": stats.ack_calls if stats else 0,
            "ack_retries": stats.ack_retries if stats else 0,
            "acks_given_up": stats.tokens_given_up if stats else 0,
            "reader_reconnects": sum(r.reconnects for r in self._readers),
            "store_outages": self._gate.outages if self._gate else 0,
        }

    def _in_flight(self) -> float:
        held = sum(b.in_hand for b in self._batchers)
        return float(held + (self._acker.stats.pending if self._acker else 0))

    async def _health(self) -> tuple[bool, str]:
        """/healthz: ready only when every reader is up and the database answers."""
        down = [r.name for r in self._readers if r.mode is None]
        if not self._readers or down:
            return False, f"readers down: {', '.join(down) or 'none started'}"
        if self._store is None or self._gate is None or not self._gate.is_up:
            return False, "store unavailable"
        try:
            async with asyncio.timeout(2.0):
                await self._store.ping()
        except (StoreUnavailableError, TimeoutError):
            return False, "store not answering"
        modes = ",".join(sorted(r.mode.value for r in self._readers if r.mode is not None))
        return True, f"ok readers={len(self._readers)} modes={modes}"

    async def _summaries(self) -> None:
        m = self.metrics
        acker = self._acker
        assert acker is not None
        last_stored = 0
        last_at = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.summary_interval)
            stored = m.totals.stored
            now = time.monotonic()
            log.info(
                "summary",
                stored=stored,
                per_s=round((stored - last_stored) / max(now - last_at, 1e-9), 1),
                acked=acker.stats.tokens_acked,
                already_gone=acker.stats.already_gone,
                repeats=m.totals.repeats,
                conflicts=m.totals.conflicts,
                exceptions=m.totals.exceptions,
                in_flight=int(self._in_flight()),
                readers={r.name: (r.mode.value if r.mode else "down") for r in self._readers},
                store_up=self._gate.is_up if self._gate else False,
            )
            last_stored, last_at = stored, now

    async def _watchdog(self, interval: float) -> None:
        """WATCHDOG=1 while the event loop turns. A database outage does not stop the pings:
        restarting cannot cure it, and the daemon recovers by itself (no crash loop)."""
        while True:
            self._notifier.notify(WATCHDOG="1", STATUS=self._status_line())
            await asyncio.sleep(interval)

    def _status_line(self) -> str:
        t = self.metrics.totals
        store = "up" if self._gate is None or self._gate.is_up else "DOWN"
        in_flight = int(self._in_flight())
        return f"stored={t.stored} repeats={t.repeats} in_flight={in_flight} store={store}"


def _feed_start_hint(settings: DaemonSettings) -> str | None:
    """A gateway that demands a client certificate refuses one without it by closing the
    socket, which the client cannot tell from a network drop (docs/daemon.md): while the feed
    cannot be reached over TLS with no client certificate, say so with each retry."""
    if settings.tls is None or settings.tls.client_cert is not None:
        return None
    return (
        "if the gateway requires a client certificate (mTLS), pass --client-cert and --client-key"
    )
