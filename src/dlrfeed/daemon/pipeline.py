"""The pipeline of one daemon process: FeedReader x N → Batcher x N → Store → Acker, plus the
StoreGate, as named tasks that the daemon supervises and stops in order.

The ordered stop (`stop_in_order`, F7/F8): stop reading → give an in-flight Pull a second →
commit every batch in hand → flush the acks → only then close the streams (closing first would
release receipts already stored, F7). `cancel()` ends whatever still runs afterwards — or
instead, after a failure or timeout — and a commit in progress is finished first (shielded).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import DlrfeedError
from dlrfeed.feed.acker import Acker
from dlrfeed.feed.client import FeedClient
from dlrfeed.feed.reader import FeedReader, Mode, mode_policy

from .batcher import Batcher, BatchStore
from .settings import DaemonSettings
from .store_gate import StoreGate

if TYPE_CHECKING:
    from dlrfeed.store.store import IngestResult

log = structlog.get_logger("dlrfeed.daemon")


class PipelineStore(BatchStore, Protocol):
    """What the pipeline needs of the store: ingest (batchers) and ping (the gate's prober)."""

    async def ping(self) -> None: ...


class Observers(Protocol):
    """What the pipeline reports as it runs (the daemon's telemetry implements it)."""

    def reader_state(self, reader: str, mode: Mode | None) -> None: ...

    def received(self, mode: Mode, count: int) -> None: ...

    def committed(self, batch: Sequence[Receipt], result: IngestResult, seconds: float) -> None: ...

    def acked(self, received_at: Sequence[float], acked_at: float) -> None: ...


class Pipeline:
    """Builds and runs the readers, batchers, gate and Acker of one process."""

    def __init__(
        self,
        settings: DaemonSettings,
        client: FeedClient,
        store: PipelineStore,
        observers: Observers,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        s = settings
        self._clock = clock
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self.acker = Acker(
            client,
            ack_batch=s.ack_batch,
            ack_linger=s.ack_linger,
            lease_seconds=s.lease_seconds,
            max_pending=max(4 * s.ack_batch, s.streams * s.batch_size * 2),
            observe=observers.acked,
            monotonic=clock,
        )
        self.gate = StoreGate(
            store.ping, release_after=s.release_after, on_release=self._release, clock=clock
        )
        self.batchers: list[Batcher] = []
        self.readers: list[FeedReader] = []
        for index in range(s.streams):
            name = f"r{index}"
            # One policy per reader, fed by the reader and by its batcher (full batches).
            policy = mode_policy(s.reader, s.batch_size)
            batcher = Batcher(
                name,
                login=s.login,
                store=store,
                acker=self.acker,
                gate=self.gate,
                batch_size=s.batch_size,
                linger=s.linger,
                on_commit=observers.committed,
                on_batch_closed=policy.batch_closed,
                clock=clock,
            )
            reader = FeedReader(
                name,
                client,
                batcher,
                s.reader,
                policy=policy,
                on_state=observers.reader_state,
                on_received=observers.received,
                clock=clock,
            )
            self.batchers.append(batcher)
            self.readers.append(reader)
        self._acker_task: asyncio.Task[None] | None = None
        self._reader_tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the Acker, the gate's prober, the batchers and then the readers."""
        self._acker_task = self.spawn(self.acker.run(), "acker")
        self.spawn(self.gate.run(), "store-gate")
        for batcher in self.batchers:
            self.spawn(batcher.run(), f"batcher-{batcher.name}")
        self._reader_tasks = [self.spawn(r.run(), f"reader-{r.name}") for r in self.readers]

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run `coro` as a named task of the pipeline: supervised, cancelled by `cancel()`."""
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = name
        return task

    def in_flight(self) -> int:
        """Receipts received and not yet acked: held by the batchers or queued for an Ack."""
        return sum(b.in_hand for b in self.batchers) + self.acker.pending

    async def wait_for_stop_or_failure(self, stop: asyncio.Event) -> BaseException | None:
        """Return None once `stop` is set, or the error of the first task that ends."""
        stop_task = asyncio.create_task(stop.wait(), name="stop-signal")
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

    async def stop_in_order(self, within_seconds: float) -> bool:
        """Stop reading → commit in hand → flush acks → close streams; False past
        `within_seconds`. Raises the Acker's error if it dies meanwhile (e.g. credentials
        revoked: exit 77)."""
        acker_task = self._acker_task
        assert acker_task is not None, "start() first"
        started = self._clock()
        try:
            async with asyncio.timeout(within_seconds):
                for reader in self.readers:
                    reader.stop_reading()
                await asyncio.gather(*(r.settle(1.0) for r in self.readers))
                drains = asyncio.gather(*(b.drain() for b in self.batchers))
                # If the Acker dies (e.g. credentials revoked) the drain cannot finish.
                either: list[asyncio.Future[Any]] = [drains, acker_task]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if acker_task.done():
                    drains.cancel()
                    error = None if acker_task.cancelled() else acker_task.exception()
                    log.error("task_failed", task="acker", error=str(error))
                    if isinstance(error, DlrfeedError):
                        raise error
                    return False
                await drains
                self.acker.close()
                await acker_task
                for reader in self.readers:
                    reader.close()  # F7: now closing releases nothing that is stored
                await asyncio.gather(*self._reader_tasks, return_exceptions=True)
        except TimeoutError:
            log.error(  # noqa: TRY400 - a timeout has no useful traceback
                "shutdown_timeout", timeout_s=within_seconds, in_flight=self.in_flight()
            )
            return False
        log.info("shutdown_clean", seconds=round(self._clock() - started, 3))
        return True

    async def cancel(self) -> None:
        """Cancel whatever still runs; a commit in progress is finished first (shielded).
        What is still in hand is dropped unacked: the gateway redelivers it (F7)."""
        for batcher in self.batchers:
            batcher.abandon()
        for reader in self.readers:
            reader.close()
        self.acker.close()
        for task in self._tasks:
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, result in zip(self._tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | DlrfeedError
            ):
                log.error("task_error_on_stop", task=self._tasks[task], error=repr(result))

    def _release(self) -> None:
        """F7: the store is down past --release-after; each reader gives back what a closed
        stream gives back (a Pull reader keeps what it pulled: `FeedReader.release`)."""
        for reader in self.readers:
            reader.release()
