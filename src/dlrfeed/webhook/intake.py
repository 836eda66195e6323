"""Group commit for HTTP callbacks: concurrent requests share ingest transactions.

A callback may be answered 2xx only after the transaction that stored its reception commits
(P6, processing.md "answer only after"): the answer is what tells the gateway it may forget the
receipt. One transaction per request would cost one WAL flush per request, so requests wait
together: each hands its receipt to `CallbackIntake.take` and sleeps on a future; up to
`commits` committer tasks each take everything waiting (at most `batch_size`), run one
`Store.ingest` — the same one the feed's readers use, so one planner and one evidence log serve
both paths — and wake each request with its own receipt's outcome. Under light load a request
commits alone and at once (no linger); under heavy load the batches grow while the previous
commits run, as the daemon's batches do.

A callback that cannot be read as a receipt takes the same path (`keep`): it waits with the
others, and its committer keeps the batch's unreadable callbacks as evidence in one more
transaction right after the batch's ingest, on the same connection slot — so bad bodies share
the good ones' commits, their load shedding and their pool, and cannot hold connections of
their own. One committer at a time keeps unreadable callbacks: were their inserts blocked
(the exceptions table locked), the other committers still commit receipts.

A store that cannot commit fails every request of that batch with `StoreUnavailableError`
(nothing was committed: the caller answers 503 and the gateway posts again). The gate then
holds the store down until its prober's ping succeeds, and requests in the meantime fail at
once instead of each waiting for a connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import structlog

from dlrfeed.domain.receipt import Receipt, UnreadableCallback
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import StoreUnavailableError

if TYPE_CHECKING:
    from dlrfeed.daemon.store_gate import StoreGate
    from dlrfeed.store.store import IngestResult

log = structlog.get_logger("dlrfeed.webhook")


class IntakeStore(Protocol):
    """What the intake needs of `dlrfeed.store.Store`."""

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult: ...

    async def keep_unreadable_callbacks(
        self, login: str, callbacks: Sequence[UnreadableCallback]
    ) -> None: ...


_Waiter = tuple[Receipt | UnreadableCallback, "asyncio.Future[Outcome]"]


CommitObserver = Callable[[Sequence[Receipt], "IngestResult", float], None]
"""Called after each commit with the batch, the store's result and the commit seconds."""


class CallbackIntake:
    """Receipts of concurrent callbacks committed together; see the module docstring."""

    def __init__(
        self,
        store: IntakeStore,
        gate: StoreGate,
        *,
        login: str,
        batch_size: int,
        commits: int,
        on_commit: CommitObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._gate = gate
        self._login = login
        self._batch_size = batch_size
        self._commits = commits
        self._on_commit = on_commit
        self._clock = clock
        self._waiting: list[_Waiter] = []  # receipts
        self._unreadable: list[_Waiter] = []
        self._keeping_unreadable = False  # a committer is keeping unreadable callbacks
        self._commits_started: dict[int, float] = {}  # committer → when its commit began
        self._arrived = asyncio.Condition()
        self._committing = 0
        self._stopping = False  # a committer was cancelled: each finishes its batch, no more
        self._idle = asyncio.Event()  # nothing waiting and nothing committing
        self._idle.set()

    @property
    def in_hand(self) -> int:
        """Receipts taken and not yet answered (waiting or committing)."""
        return len(self._waiting) + len(self._unreadable) + self._committing

    def stalled_seconds(self) -> float:
        """How long the oldest commit in progress has taken so far; 0 when none is."""
        if not self._commits_started:
            return 0.0
        return self._clock() - min(self._commits_started.values())

    async def take(self, receipt: Receipt) -> Outcome:
        """Store `receipt` with whatever else is waiting; its outcome once committed.

        StoreUnavailableError when the store is down (at once) or the commit failed (nothing of
        it committed). A request cancelled while it waits leaves its receipt in the batch: the
        commit goes ahead, and the gateway's next post of it is a repeat.
        """
        return await self._enqueue(receipt)

    async def keep(self, callback: UnreadableCallback) -> None:
        """Keep an unreadable callback as evidence with the next commit (as `take`)."""
        await self._enqueue(callback)

    async def _enqueue(self, item: Receipt | UnreadableCallback) -> Outcome:
        if not self._gate.is_up:
            raise StoreUnavailableError("the store is down (waiting for PostgreSQL to answer)")
        outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        # Read the outcome even when the request has gone, so no error is left unretrieved.
        outcome.add_done_callback(_retrieve)
        if isinstance(item, Receipt):
            self._waiting.append((item, outcome))
        else:
            self._unreadable.append((item, outcome))
        self._idle.clear()
        async with self._arrived:
            self._arrived.notify_all()
        return await asyncio.shield(outcome)

    async def run(self) -> None:
        """The committers, until cancelled; a fatal store error (not an outage) ends them and
        is raised as it is, so the service stops with its one line (not a task group's)."""
        try:
            async with asyncio.TaskGroup() as group:
                for number in range(self._commits):
                    group.create_task(self._committer(number), name=f"webhook-commit-{number}")
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0]  # noqa: B904 - the committer's error is the reason

    async def drain(self) -> None:
        """Wait until every receipt taken so far is committed (or failed) and answered."""
        await self._idle.wait()

    async def _committer(self, number: int) -> None:
        while True:
            async with self._arrived:
                await self._arrived.wait_for(self._work_for_me)
            commits = asyncio.ensure_future(self._commit_while_waiting(number))
            try:
                await asyncio.shield(commits)
            except asyncio.CancelledError:
                # Stopped mid-commit (the service stops, or another committer failed): finish
                # the batch under way, so its requests get their answers, and take no more.
                self._stopping = True
                while not commits.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(commits)
                if not commits.cancelled() and (failure := commits.exception()) is not None:
                    raise failure from None
                raise

    async def _commit_while_waiting(self, number: int) -> None:
        """Commit batches back to back while callbacks wait: the next batch's transaction
        begins in the same turn of the loop as the last one's answers are released, ahead of
        the requests that arrive meanwhile."""
        while self._work_for_me() and not self._stopping:
            batch = self._waiting[: self._batch_size]
            del self._waiting[: len(batch)]
            keeps = not self._keeping_unreadable and bool(self._unreadable)
            if keeps:
                self._keeping_unreadable = True
                batch += self._unreadable[: self._batch_size]
                del self._unreadable[: self._batch_size]
            self._committing += len(batch)
            self._commits_started[number] = self._clock()
            try:
                await self._commit(batch)
            finally:
                del self._commits_started[number]
                self._committing -= len(batch)
                if keeps:
                    self._keeping_unreadable = False
                    async with self._arrived:
                        self._arrived.notify_all()  # the unreadable ones left may go now
                if not self._waiting and not self._unreadable and not self._committing:
                    self._idle.set()

    def _work_for_me(self) -> bool:
        return bool(self._waiting) or (bool(self._unreadable) and not self._keeping_unreadable)

    async def _commit(self, batch: list[_Waiter]) -> None:
        """One ingest for the batch's receipts, then one transaction keeping its unreadable
        callbacks; every waiting request learns its outcome or the failure."""
        receipts = [(r, w) for r, w in batch if isinstance(r, Receipt)]
        unreadable = [(u, w) for u, w in batch if isinstance(u, UnreadableCallback)]
        started = self._clock()
        try:
            if receipts:
                result = await self._store.ingest(self._login, [r for r, _ in receipts])
                seconds = self._clock() - started
                if self._on_commit is not None:
                    self._on_commit([r for r, _ in receipts], result, seconds)
                for (_, waiter), outcome in zip(receipts, result.outcomes, strict=True):
                    if not waiter.done():
                        waiter.set_result(outcome)
            if unreadable:
                await self._store.keep_unreadable_callbacks(self._login, [u for u, _ in unreadable])
                for _, waiter in unreadable:
                    if not waiter.done():
                        waiter.set_result(Outcome.UNSTORABLE)
        except StoreUnavailableError as exc:
            self._gate.mark_down(exc)
            _fail(batch, exc)  # only those not answered yet: nothing of theirs is committed
            log.warning("callbacks_not_stored", receipts=len(batch), error=str(exc))
            return
        except BaseException as exc:
            # A fatal error (the schema changed under us, the role may not write): every
            # waiting request is answered 503, and the error ends the service.
            failed = StoreUnavailableError(f"the store failed: {exc}")
            _fail(batch, failed)
            _fail(self._waiting + self._unreadable, failed)  # nobody will commit them now
            self._waiting.clear()
            self._unreadable.clear()
            raise
        self._gate.mark_up()
        log.debug(
            "callbacks_committed",
            receipts=len(batch),
            ms=round((self._clock() - started) * 1000, 2),
        )


def _retrieve(outcome: asyncio.Future[Outcome]) -> None:
    if not outcome.cancelled():
        outcome.exception()


def _fail(
    batch: Sequence[tuple[object, asyncio.Future[Outcome]]], error: StoreUnavailableError
) -> None:
    for _, waiter in batch:
        if not waiter.done():
            waiter.set_exception(error)
