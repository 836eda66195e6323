"""The receipt store on an asyncpg pool: each call takes a connection of the pool, runs one of
this package's modules on it (`ingest`, `recording`, `recompute`, `verification`) and
translates the driver's errors by SQLSTATE class (`server_errors`). A batch the database
refuses for its data is bisected down to the poison receipt, kept raw (C8); a deadlock or
serialization failure is first retried in place.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import asyncpg
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from dlrfeed.backoff import Backoff
from dlrfeed.config import Pooler
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import LogicalEvent, parse
from dlrfeed.domain.receipt import Receipt, UnreadableCallback
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.store import evidence, recompute, recording, verification
from dlrfeed.store import quality as quality_reads
from dlrfeed.store.ingest import ingest_batch
from dlrfeed.store.migrate import ensure_current
from dlrfeed.store.recompute import Progress
from dlrfeed.store.recompute import RecomputeResult as RecomputeResult
from dlrfeed.store.server import (
    WRITABLE,
    ServerFacts,
    behind_transaction_pooler,
    check_server,
    connect_options,
)
from dlrfeed.store.server_errors import describe, is_bad_data, refusing, rolled_back
from dlrfeed.store.submission import Submission, SubmissionResult
from dlrfeed.store.transactions import write_transaction
from dlrfeed.store.verification import Verification, VerificationResult

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection


log = structlog.get_logger("dlrfeed.store")

# Serialization failures and deadlocks (SQLSTATE class 40) are retried in place this many
# times, ~1 s in all, before the batch is handed back as StoreUnavailableError.
_ROLLED_BACK_ATTEMPTS = 8
ROLLED_BACK_DELAY = Backoff(initial=0.01, maximum=0.5)
"""Between in-place attempts of a transaction the server rolled back (deadlock, serialization)."""
# Bounds on waiting for PostgreSQL. A statement may legitimately wait for row locks held by
# another worker, so its bound is generous, but well inside the gateway's 120 s lease (F6).
_CONNECT_TIMEOUT_S = 10.0
_STATEMENT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What `Store.ingest` did with a batch: one outcome per receipt, in batch order."""

    outcomes: list[Outcome]
    counts: Mapping[Outcome, int]
    deadlock_retries: int = 0
    bisections: int = 0


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Pool release hook: nothing to reset, so no extra round trip per call.

    The store's statements leave no session state behind (transaction-scoped advisory locks
    only, no SET, LISTEN or cursors), and the pool still rolls back an unfinished transaction
    before this hook runs; the driver's default reset would cost a round trip per ingest.
    """


def _rolled_back_delay(state: RetryCallState) -> float:
    return ROLLED_BACK_DELAY.delay(state.attempt_number)


def _log_rolled_back(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning(
        "transaction_retry",
        attempt=state.attempt_number,
        error=describe(error) if error is not None else None,
    )


class Store:
    """The receipt store on one PostgreSQL database (schema `dlr`), shared by all readers.

    Safe for concurrent use: each call takes its own pooled connection; concurrent ingests of
    overlapping receipts give exactly-once effects (locks in sorted key order).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        options: IntegrationOptions,
        *,
        through_pooler: bool = False,
        server: ServerFacts | None = None,
        dsn: str,
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        """Where `quality` opens a connection of its own."""
        self.options = options
        self.through_pooler = through_pooler
        """Whether the pool does without named prepared statements (a transaction pooler)."""
        self.server = server
        """What `open` found of the server (its synchronous commit settings)."""
        self.rules_version = options.rules_version(RULES_VERSION)
        """P22: recorded on what this store computes: the rules and the options they read."""

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        pool_size: int = 4,
        options: IntegrationOptions | None = None,
        pooler: Pooler = Pooler.AUTO,
        require_synchronous_commit: bool = False,
    ) -> Store:
        """Connect a pool of up to `pool_size` connections and check the server (`check_server`).

        StoreUnavailableError if unreachable; ConfigError (one line) if the server is read-only
        or, with `require_synchronous_commit`, does not confirm synchronous replication.
        `pooler` says whether `dsn` reaches PostgreSQL through a transaction pooler (server).
        """
        with refusing("a connection"):
            through_pooler = await behind_transaction_pooler(dsn, pooler)
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=pool_size,
                reset=_keep_session,
                timeout=_CONNECT_TIMEOUT_S,
                # A server that stops answering must become StoreUnavailableError (so readers
                # pause and, past --release-after, release their streams, F7), not a hang.
                command_timeout=_STATEMENT_TIMEOUT_S,
                **connect_options(through_pooler),
            )
        try:
            with refusing("a connection"):
                async with pool.acquire(timeout=_CONNECT_TIMEOUT_S) as conn:
                    facts = await check_server(
                        conn, require_synchronous_commit=require_synchronous_commit
                    )
        except BaseException:
            await pool.close()
            raise
        return cls(
            pool,
            options or IntegrationOptions(),
            through_pooler=through_pooler,
            server=facts,
            dsn=dsn,
        )

    async def close(self) -> None:
        """Close every connection of the pool (waits for calls in progress)."""
        await self._pool.close()

    async def ping(self) -> None:
        """One round trip to the server; StoreUnavailableError when it does not answer or can
        no longer take writes (a primary demoted, or failed over to while still a standby)."""
        with refusing("a ping"):
            async with self._pool.acquire(timeout=_CONNECT_TIMEOUT_S) as conn:
                writable = await conn.fetchval(WRITABLE.text, timeout=_CONNECT_TIMEOUT_S)
        if not writable:
            # The pooled connections stay on this server; new ones go through the host list of
            # the URL again (target_session_attrs=read-write finds the new primary).
            await self._pool.expire_connections()
            raise StoreUnavailableError(
                "PostgreSQL is read-only (a standby, or read-only mode): nothing is stored or "
                "acked until a writable primary answers"
            )

    async def check_schema(self) -> None:
        """SchemaOutOfDateError (one line naming `dlrfeed migrate`) unless the schema is current."""
        with refusing("the schema check"):
            async with self._pool.acquire() as conn:
                # ensure_current is typed for a bare Connection; the pool proxy delegates to one.
                await ensure_current(cast("asyncpg.Connection[asyncpg.Record]", conn))

    # ---------------------------------------------------------------- ingest

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult:
        """Store one batch of receipts of `login` in one transaction; outcomes in batch order.

        On return every receipt is durably committed - as a reception, or (C8) as an
        `unstorable` exception with its raw bytes - so the caller may ack every token. Raises
        StoreUnavailableError for any transient SQLSTATE class or a lost connection: nothing is
        acked then, and ingesting the same batch again is safe (its receipts become repeats at
        worst). A fatal error (privileges, the schema changed under us) is one line: nothing
        was committed or acked, and the gateway redelivers to a dlrfeed that can store it.
        """
        if not receipts:
            return IngestResult([], {})
        events = [parse(receipt, self.options) for receipt in receipts]
        with refusing("the batch"):
            async with self._pool.acquire() as conn:
                outcomes, retries, bisections = await self._ingest_bisecting(
                    conn, login, receipts, events
                )
        return IngestResult(outcomes, Counter(outcomes), retries, bisections)

    async def _ingest_bisecting(
        self,
        conn: Connection,
        login: str,
        receipts: Sequence[Receipt],
        events: list[LogicalEvent],
    ) -> tuple[list[Outcome], int, int]:
        try:
            outcomes, retries = await self._ingest_retrying(conn, login, events)
        except Exception as exc:
            if not is_bad_data(exc):
                raise
            # C8: find the poison receipt by halving, all inside ONE outer transaction (each
            # half's transaction becomes a savepoint): a connection lost half-way then commits
            # nothing, and the caller's whole-batch retry stores no delivery twice.
            async with conn.transaction():
                return await self._split(conn, login, receipts, events, exc)
        return outcomes, retries, 0

    async def _split(
        self,
        conn: Connection,
        login: str,
        receipts: Sequence[Receipt],
        events: list[LogicalEvent],
        error: BaseException,
    ) -> tuple[list[Outcome], int, int]:
        """`receipts` failed for a data reason: store each half on its own, recursively."""
        if len(events) == 1:
            # C8: the poison receipt, isolated; kept raw so it can be acked and studied.
            await evidence.keep_unstorable(conn, login, receipts[0], error)
            return [Outcome.UNSTORABLE], 0, 0
        half = len(events) // 2
        outcomes: list[Outcome] = []
        retries, bisections = 0, 1
        for part, part_events in (
            (receipts[:half], events[:half]),
            (receipts[half:], events[half:]),
        ):
            try:
                done, attempts = await self._ingest_retrying(conn, login, part_events)
            except Exception as exc:
                if not is_bad_data(exc):
                    raise
                done, attempts, splits = await self._split(conn, login, part, part_events, exc)
                bisections += splits
            outcomes += done
            retries += attempts
        return outcomes, retries, bisections

    async def _ingest_retrying(
        self, conn: Connection, login: str, events: list[LogicalEvent]
    ) -> tuple[list[Outcome], int]:
        # Deadlock or serialization failure: the transaction was rolled back whole, so running
        # it again is safe. Sorted locking makes this rare; a failure that lasts is handed back.
        outcomes: list[Outcome] = []
        attempt_number = 1
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(rolled_back),
            wait=_rolled_back_delay,
            stop=stop_after_attempt(_ROLLED_BACK_ATTEMPTS),
            before_sleep=_log_rolled_back,
            reraise=True,
        ):
            with attempt:
                attempt_number = attempt.retry_state.attempt_number
                async with write_transaction(conn):
                    outcomes = await ingest_batch(
                        conn, login, events, self.options, self.rules_version
                    )
        return outcomes, attempt_number - 1

    async def keep_unreadable_callbacks(
        self, login: str, callbacks: Sequence[UnreadableCallback]
    ) -> None:
        """C8 for HTTP callbacks that cannot be read as receipts (not JSON, no `id`, a wrong
        type, too large): each one's bytes kept whole as an `unstorable` exception under the
        id it names (P24), one open exception however often the same bytes are posted (or,
        with a `flood_key`, one for the flood), all in one transaction. StoreUnavailableError
        when the store cannot take them (nothing kept: the senders must post them again)."""
        with refusing("the callback"):
            async with self._pool.acquire() as conn, write_transaction(conn):
                await evidence.keep_unreadable(conn, login, callbacks)

    # ---------------------------------------------------------------- submissions

    async def record_submissions(self, submissions: Sequence[Submission]) -> SubmissionResult:
        """Record sent messages (P5) and correlate the receipts that were waiting for them.

        Idempotent: a message id already recorded for its login is left unchanged; a different
        record of it is kept in a `second_record` exception (P12). Chunks of 500 commit one by
        one, and the call returns once all of them are durable (one WAL flush for the call, not
        one per chunk); BadDataError when the database refuses a value. Deliveries that arrived
        first are replayed through the same planner in their arrival order, and the
        `uncorrelated` exceptions of their events resolved with the reason.
        """
        # On BadDataError, chunks already committed stay, durable once the server flushes its
        # WAL (within wal_writer_delay); recording is idempotent: run the file again.
        with refusing("a submission"):
            async with self._pool.acquire() as conn:
                return await recording.record_submissions(conn, self.options, submissions)

    # ---------------------------------------------------------------- verifications

    async def record_verifications(
        self, verifications: Sequence[Verification]
    ) -> VerificationResult:
        """Record independent verifications (C6): idempotent, correlated with their messages
        by message id when read (one recorded before its message waits for it), and never an
        input of a computed status (P2). Chunks of 1000 commit one by one; BadDataError when
        the database refuses a value.
        """
        with refusing("the verifications"):
            async with self._pool.acquire() as conn:
                return await verification.record_verifications(conn, verifications)

    async def quality(
        self, by: quality_reads.GroupBy, window: quality_reads.Window
    ) -> list[quality_reads.JsonDict]:
        """`dlrfeed quality` for the daemon's route gauges (`dlrfeed.store.quality.quality`), on a
        connection of its own: a report over a busy day reads for seconds, and the pool is the
        ingest's. StoreUnavailableError when the server does not answer or refuses it for now.
        """
        with refusing("the quality report"):
            conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
                self._dsn, timeout=_CONNECT_TIMEOUT_S, **connect_options(self.through_pooler)
            )
            try:
                return await quality_reads.quality(conn, by, window)
            finally:
                await conn.close()

    # ---------------------------------------------------------------- recompute

    async def recompute(
        self,
        *,
        every: bool = False,
        chunk: int = 200,
        progress: Progress | None = None,
        busy: float = 1.0,
    ) -> RecomputeResult:
        """Compute the stale statuses (of another `rules_version`, P8, P22; all with `every`)
        again, every delivery of each message replayed in arrival order through the planner.

        Each change is audited in `dlr.status_recomputations`; a row with no applicable receipt
        any more is removed; a row computed the same gets its version only; the events' totals
        and conflict exceptions become those the live path writes. A row whose deliveries
        retention took beyond what its events keep is left as it is and counted (P21). Chunks
        of `chunk` messages commit one by one under the ingest's message locks, so it runs
        beside a live daemon and may be stopped at any moment (`progress` hears after each);
        with `busy` below 1 it works only that share of the time.
        """
        with refusing("the recompute"):
            async with self._pool.acquire() as conn:
                return await recompute.recompute(
                    conn,
                    self.options,
                    every=every,
                    chunk=chunk,
                    progress=progress,
                    busy=busy,
                )
