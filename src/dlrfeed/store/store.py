"""The PostgreSQL adapter: the receipt store on an asyncpg pool, and its batch ingest.

The sending side (`recording`) and the recompute pass (`recompute`) run on a connection of the
same pool, their driver errors translated here too. One ingest transaction per batch, a handful
of set-based statements (see `queries`), the status of each message computed by the pure rules
module. Driver errors are translated here: connection trouble → StoreUnavailableError (retry
the batch, ack nothing); deadlock/serialization → retried in place; a data error → the batch
is bisected and the poison receipt kept raw (C8).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, cast

import asyncpg
import asyncpg.exceptions

from dlrfeed.config import Pooler
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import MAX_ID_CHARS, PARSER_VERSION, LogicalEvent, parse
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.rules import (
    RULES_VERSION,
    KeyContents,
    MessageState,
    Planner,
)
from dlrfeed.domain.status import Outcome, Status
from dlrfeed.domain.wire_format import callback_evidence_key, evidence_key
from dlrfeed.errors import (
    BadDataError,
    ConfigError,
    SchemaOutOfDateError,
    StoreUnavailableError,
)
from dlrfeed.store import copy_rows, queries, recompute, recording, verification
from dlrfeed.store import quality as quality_reads
from dlrfeed.store.correlation import correlate, ids_to_lock
from dlrfeed.store.migrate import ensure_current, readable_version
from dlrfeed.store.recompute import RecomputeResult as RecomputeResult
from dlrfeed.store.rows import (
    column_arrays,
    event_contents,
    first_events,
    planned_exceptions,
    printable,
    reception_ids_in_blocks,
    state_from_row,
    status_json,
)
from dlrfeed.store.server import (
    WRITABLE,
    ServerFacts,
    behind_transaction_pooler,
    check_server,
    connect_options,
)
from dlrfeed.store.server_errors import (
    CONNECTION_ERRORS,
    DATA_ERRORS,
    PASSING_SERVER_ERRORS,
    SCHEMA_CHANGED_ERRORS,
    schema_changed,
)
from dlrfeed.store.submission import Submission, SubmissionResult
from dlrfeed.store.transactions import write_transaction
from dlrfeed.store.verification import Verification, VerificationResult

if TYPE_CHECKING:
    from dlrfeed.store.rows import Connection


_DEADLOCK_RETRIES = 8
# Receptions per COPY piece: the server inserts a piece while the client plans the next one.
_COPY_PIECE = 100
# Bounds on waiting for PostgreSQL. A statement may legitimately wait for row locks held by
# another worker, so its bound is generous, but well inside the gateway's 120 s lease (F6).
_CONNECT_TIMEOUT_S = 10.0
_STATEMENT_TIMEOUT_S = 60.0
_T = TypeVar("_T")
_U = TypeVar("_U")


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What `Store.ingest` did with a batch: one outcome per receipt, in batch order."""

    outcomes: list[Outcome]
    counts: Mapping[Outcome, int]
    deadlock_retries: int = 0
    bisections: int = 0


@dataclass(slots=True)
class _Plan:
    """What one batch writes besides the receptions, built as the planner decides each
    delivery: the receptions' outcomes and event ids a piece at a time while they are copied
    in, then the exceptions; the statuses and event counters are the planner's own."""

    planner: Planner
    outcomes: list[Outcome] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    exceptions: list[tuple[str, str, str, int | None, int | None]] = field(default_factory=list)


async def _overlapped(statement: Awaitable[_T], work: Callable[[], _U]) -> tuple[_T, _U]:
    """Await `statement` while running `work` (client CPU) as the server executes it.

    On this 2-core design point the client's per-receipt Python and the server's statement run
    in parallel instead of one after the other; the connection is only used by `statement`.
    """
    pending = asyncio.ensure_future(statement)
    try:
        await asyncio.sleep(0)  # one turn of the loop: the statement is sent
        done = work()
    finally:
        result = await pending
    return result, done


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Pool release hook: nothing to reset, so no extra round trip per call.

    The store's statements leave no session state behind (transaction-scoped advisory locks
    only, no SET, LISTEN or cursors), and the pool still rolls back an unfinished transaction
    before this hook runs; the driver's default reset would cost a round trip per ingest.
    """


def _plan_piece(
    plan: _Plan,
    events: list[LogicalEvent],
    positions: range,
    event_ids: list[int],
    reception_ids: list[int],
) -> None:
    """Ask the planner about the deliveries at `positions` (the next ones, in batch order) and
    add their outcomes and exceptions to `plan` (exceptions joined to their reception by batch
    position, 1-based)."""
    decide = plan.planner.decide
    for position in positions:
        e = events[position]
        event_id = event_ids[position]
        outcome, exceptions = decide(e, event_id, reception_ids[position])
        if exceptions:
            plan.exceptions += planned_exceptions(exceptions, e.message_id, event_id, position + 1)
        plan.outcomes.append(outcome)


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
        writes: queries.SchemaWrites = queries.SCHEMA_WRITES,
        dsn: str | None = None,
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        """Where `quality` opens a connection of its own (None: it takes one of the pool)."""
        self.options = options
        self.through_pooler = through_pooler
        """Whether the pool does without named prepared statements (a transaction pooler)."""
        self.server = server
        """What `open` found of the server (its synchronous commit settings)."""
        self.writes = writes
        """How this store's schema is written (an older one's: tests only)."""

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
        try:
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
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            async with pool.acquire(timeout=_CONNECT_TIMEOUT_S) as conn:
                facts = await check_server(
                    conn, require_synchronous_commit=require_synchronous_commit
                )
                version = await readable_version(cast("asyncpg.Connection[asyncpg.Record]", conn))
                earlier_statuses = (
                    version is None
                    or version < queries.STATUSES_BY_MESSAGE_VERSION
                    or bool(await queries.HAS_EARLIER_STATUSES.fetchval(conn))
                )
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, CONNECTION_ERRORS):
                raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
            raise
        return cls(
            pool,
            options or IntegrationOptions(),
            through_pooler=through_pooler,
            server=facts,
            writes=queries.schema_writes(version, earlier_statuses=earlier_statuses),
            dsn=dsn,
        )

    async def close(self) -> None:
        """Close every connection of the pool (waits for calls in progress)."""
        await self._pool.close()

    async def ping(self) -> None:
        """One round trip to the server; StoreUnavailableError when it does not answer or can
        no longer take writes (a primary demoted, or failed over to while still a standby)."""
        try:
            async with self._pool.acquire(timeout=_CONNECT_TIMEOUT_S) as conn:
                writable = await conn.fetchval(WRITABLE.text, timeout=_CONNECT_TIMEOUT_S)
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
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
        try:
            async with self._pool.acquire() as conn:
                # ensure_current is typed for a bare Connection; the pool proxy delegates to one.
                await ensure_current(cast("asyncpg.Connection[asyncpg.Record]", conn))
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    # ---------------------------------------------------------------- ingest

    async def ingest(self, login: str, receipts: Sequence[Receipt]) -> IngestResult:
        """Store one batch of receipts of `login` in one transaction; outcomes in batch order.

        On return every receipt is durably committed - as a reception, or (C8) as an
        `unstorable` exception with its raw bytes - so the caller may ack every token. Raises
        StoreUnavailableError when the connection or the server fails: nothing is acked then,
        and ingesting the same batch again is safe (its receipts become repeats at worst).
        """
        if not receipts:
            return IngestResult([], {})
        events = [parse(receipt, self.options) for receipt in receipts]
        try:
            async with self._pool.acquire() as conn:
                outcomes, retries, bisections = await self._ingest_bisecting(
                    conn, login, receipts, events
                )
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable during ingest: {exc}") from exc
        except PASSING_SERVER_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL refused the batch for now: {exc}") from exc
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise ConfigError(
                f"the database role may not ingest ({exc}): connect as the writer role, "
                "see sql/roles.sql and docs/security.md"
            ) from exc
        except SCHEMA_CHANGED_ERRORS as exc:
            if not schema_changed(exc):
                raise
            # A migration ran while this daemon was up: its statements no longer fit the
            # tables. Nothing was committed or acked (the gateway redelivers); stop, in one line.
            raise SchemaOutOfDateError(
                f"the database schema changed under this dlrfeed ({exc}): stop it, run "
                "`dlrfeed migrate`, and start the dlrfeed that matches the schema"
            ) from exc
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
        except DATA_ERRORS as exc:
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
            await self._store_unstorable(conn, login, receipts[0], error)
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
            except DATA_ERRORS as exc:
                done, attempts, splits = await self._split(conn, login, part, part_events, exc)
                bisections += splits
            outcomes += done
            retries += attempts
        return outcomes, retries, bisections

    async def _ingest_retrying(
        self, conn: Connection, login: str, events: list[LogicalEvent]
    ) -> tuple[list[Outcome], int]:
        for attempt in range(_DEADLOCK_RETRIES + 1):
            try:
                async with write_transaction(conn):
                    return await self._ingest_once(conn, login, events), attempt
            except asyncpg.exceptions.TransactionRollbackError:
                # Deadlock or serialization failure: the transaction was rolled back whole;
                # running it again is safe. Sorted locking makes this rare.
                if attempt == _DEADLOCK_RETRIES:
                    raise
                await asyncio.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable: the loop returns or raises")

    async def _store_unstorable(
        self, conn: Connection, login: str, receipt: Receipt, error: BaseException
    ) -> None:
        details: dict[str, object] = {
            "error": f"{type(error).__name__}: {error}"[:2000],
            "receipt": printable(repr(receipt)[:4000]),
            "delivery_count": receipt.delivery_count,
        }
        if receipt.channel == "feed":
            key = evidence_key(receipt.raw)
        else:
            details |= {"channel": receipt.channel, "peer": receipt.peer}
            key = callback_evidence_key(receipt.raw)
        await self._keep_evidence(conn, login, receipt.message_id, details, receipt.raw, key)

    async def keep_unreadable_callback(
        self, login: str, raw: bytes, reason: str, *, peer: str | None
    ) -> None:
        """C8 for an HTTP callback that cannot be read as a receipt at all (not JSON, no `id`,
        a wrong type, too large): its bytes kept whole as an `unstorable` exception, one open
        exception however often the same bytes are posted. StoreUnavailableError when the store
        cannot take it (nothing kept: the sender must post it again)."""
        details = {"error": reason[:2000], "channel": "webhook", "peer": peer}
        try:
            async with self._pool.acquire() as conn, write_transaction(conn):
                await self._keep_evidence(conn, login, "", details, raw, callback_evidence_key(raw))
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
        except PASSING_SERVER_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL refused the callback for now: {exc}") from exc

    async def _keep_evidence(
        self,
        conn: Connection,
        login: str,
        message_id: str,
        details: Mapping[str, object],
        raw: bytes,
        key: str,
    ) -> None:
        arguments = {
            "login": login,
            "message_id": printable(message_id)[:MAX_ID_CHARS],
            "details": json.dumps(details, ensure_ascii=True),
            "evidence": bytes(raw),
            "evidence_key": key,
        }
        # Delivered again while an earlier delivery is under investigation: one open exception
        # per receipt (never counted twice), every delivery's bytes kept. Only an operator
        # resolving that exception between our two statements sends us round again.
        while await queries.OPEN_UNSTORABLE.fetchval(conn, **arguments) is None:
            if await queries.RECORD_UNSTORABLE_REDELIVERY.fetchval(conn, **arguments) is not None:
                return

    async def _ingest_once(
        self, conn: Connection, login: str, events: list[LogicalEvent]
    ) -> list[Outcome]:
        # P10: correlation and the message locks first (sorted), then held statuses. Meanwhile
        # the client prepares the events insert (it depends on the receipts alone).
        correlation_ids = sorted({e.correlation_id for e in events})
        correlated, (firsts, events_json) = await _overlapped(
            correlate(conn, login, ids_to_lock(events, own_ids=self.writes.events.by_message)),
            lambda: first_events(events),
        )
        found = correlated.of(correlation_ids)
        own_refs = correlated.of(e.message_id for e in firsts)
        # P14: insert-or-detect of the logical events (first delivery of each key in the batch),
        # the held statuses and the batch's reception id blocks, in one statement, while the
        # client encodes the receptions.
        returned, receipt_fields = await _overlapped(
            self.writes.events.insert.fetch(
                conn,
                login=login,
                parser_version=PARSER_VERSION,
                rules_version=RULES_VERSION,
                events=events_json,
                correlated=list(found),
                correlated_refs=list(found.values()),
                id_blocks=-(-len(events) // queries.RECEPTION_ID_BLOCK),  # the ceiling
                **self.writes.insert_arguments(own_refs),
            ),
            lambda: copy_rows.encode_receipt_fields(
                events, login if self.writes.receptions.with_key else None
            ),
        )
        inserted: dict[tuple[str, int], int] = {}
        held: dict[str, MessageState] = {}
        id_blocks: list[int] = []
        by_message: set[int] = set()  # the events kept under their message (0024)
        for row in returned:
            if row["message_id"] is None:  # only the id block rows have none
                id_blocks.append(row["id"])
            elif row["id"] is not None:
                inserted[(row["message_id"], row["level"])] = row["id"]
                if row["by_message"]:
                    by_message.add(row["id"])
            else:
                held[row["message_id"]] = state_from_row(row)
        stored: dict[tuple[str, int], int] = {}
        keys: dict[tuple[str, int], KeyContents] = {}
        existing_rows: list[asyncpg.Record] = []
        if len(inserted) < len(firsts):
            existing = [e for e in firsts if (e.message_id, e.level) not in inserted]
            existing_rows = await self.writes.events.lock_existing.fetch(
                conn,
                login=login,
                message_ids=[e.message_id for e in existing],
                levels=[e.level for e in existing],
                **self.writes.lock_arguments([own_refs.get(e.message_id) for e in existing]),
            )
            for r in existing_rows:
                stored[(r[1], r[2])] = r[0]
                if r["by_message"]:
                    by_message.add(r[0])
                keys[(r[1], r[2])] = KeyContents(Status(r[4]), (r[3], *r[5]))

        # P6/P13: every delivery of the batch, appended by binary COPY (the server's multi-row
        # insert path: far less work and WAL than INSERT ... SELECT per row). The planner
        # decides each delivery's outcome a piece of the batch at a time, and each piece's
        # receptions go to the server as soon as they are complete: it inserts them while the
        # client plans the next piece.
        plan = _Plan(Planner(self.options, keys, dict(held), correlated.submitted))
        reception_ids = list(reception_ids_in_blocks(id_blocks, len(events)))
        event_ids = [
            inserted.get((e.message_id, e.level)) or stored[(e.message_id, e.level)] for e in events
        ]
        # A delivery whose parsed content is its event's leaves it to the event (0016).
        firsts_held = (
            None if self.writes.full_rows else event_contents(firsts, inserted, existing_rows)
        )
        receipt_contents = copy_rows.contents(events, event_ids, firsts_held)

        async def planned_receptions() -> AsyncIterator[bytes]:
            yield copy_rows.SIGNATURE
            for start in range(0, len(events), _COPY_PIECE):
                piece = range(start, min(start + _COPY_PIECE, len(events)))
                _plan_piece(plan, events, piece, event_ids, reception_ids)
                yield copy_rows.complete(
                    receipt_fields[piece.start : piece.stop],
                    receipt_contents[piece.start : piece.stop],
                    reception_ids[piece.start : piece.stop],
                    plan.outcomes[piece.start : piece.stop],
                    event_ids[piece.start : piece.stop],
                )
            yield copy_rows.TRAILER

        await conn.copy_to_table(
            self.writes.receptions.table,
            schema_name=queries.RECEPTIONS_SCHEMA,
            columns=self.writes.receptions.columns,
            source=planned_receptions(),
            format="binary",
        )
        planner = plan.planner
        changed = {k: v for k, v in planner.messages.items() if held.get(k) is not v}
        counted = list(planner.event_last)
        kinds, message_ids, details, exception_event_ids, positions = column_arrays(
            plan.exceptions, 5
        )
        await self.writes.statuses.batch.execute(
            conn,
            login=login,
            rules_version=RULES_VERSION,
            id_blocks=id_blocks,
            id_block_size=queries.RECEPTION_ID_BLOCK,
            exception_kinds=kinds,
            exception_message_ids=message_ids,
            exception_details=details,
            exception_event_ids=exception_event_ids,
            exception_positions=positions,
            statuses=status_json(changed, correlated.refs),
            event_ids=counted,
            event_accepted=[planner.event_accepted.get(i, 0) for i in counted],
            event_conflicts=[planner.event_conflicts.get(i, 0) for i in counted],
            event_received_at=[planner.event_last[i] for i in counted],
            event_updates=[" ".join(planner.key_updates.get(i, ())) for i in counted],
            event_by_message=[i in by_message for i in counted],
        )
        return plan.outcomes

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
        try:
            async with self._pool.acquire() as conn:
                return await recording.record_submissions(
                    conn,
                    self.options,
                    submissions,
                    self.writes.statuses,
                    self.writes.receptions,
                )
        except DATA_ERRORS as exc:
            # Chunks already committed stay, durable once the server flushes its WAL (within
            # wal_writer_delay); recording is idempotent: run the file again.
            raise BadDataError(f"a submission was refused by the database: {exc}") from exc
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    # ---------------------------------------------------------------- verifications

    async def record_verifications(
        self, verifications: Sequence[Verification]
    ) -> VerificationResult:
        """Record independent verifications (C6): idempotent, correlated with their messages
        by message id when read (one recorded before its message waits for it), and never an
        input of a computed status (P2). Chunks of 1000 commit one by one; BadDataError when
        the database refuses a value.
        """
        try:
            async with self._pool.acquire() as conn:
                return await verification.record_verifications(conn, verifications)
        except DATA_ERRORS as exc:
            raise BadDataError(f"a verification was refused by the database: {exc}") from exc
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    async def quality(
        self, by: quality_reads.GroupBy, window: quality_reads.Window
    ) -> list[quality_reads.JsonDict]:
        """`dlrfeed quality` for the daemon's route gauges (`dlrfeed.store.quality.quality`), on a
        connection of its own: a report over a busy day reads for seconds, and the pool is the
        ingest's. StoreUnavailableError when the server does not answer or refuses it for now.
        """
        try:
            if self._dsn is None:
                async with self._pool.acquire() as pooled:
                    return await quality_reads.quality(pooled, by, window)
            conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
                self._dsn, timeout=_CONNECT_TIMEOUT_S, **connect_options(self.through_pooler)
            )
            try:
                return await quality_reads.quality(conn, by, window)
            finally:
                await conn.close()
        except (*CONNECTION_ERRORS, *PASSING_SERVER_ERRORS) as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    # ---------------------------------------------------------------- recompute

    async def recompute(self, *, every: bool = False, chunk: int = 200) -> RecomputeResult:
        """Compute stored statuses again under the current rules (RULES_VERSION), from every
        delivery of each message replayed in its recorded arrival order through the planner.

        Rows of another rules version are the stale ones (P8); `every` takes all rows. Each
        change is written to `dlr.status_recomputations` with its before, after and why; a row
        with no applicable receipt under the current rules is removed (and audited). Chunks of
        `chunk` messages commit one by one, each under the same message locks as the ingest,
        so it runs safely beside a live daemon; running it again finds nothing stale.
        """
        try:
            async with self._pool.acquire() as conn:
                return await recompute.recompute(
                    conn,
                    self.options,
                    every=every,
                    chunk=chunk,
                    writes=self.writes.statuses,
                    waiting=self.writes.receptions.waiting,
                )
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
