"""The PostgreSQL adapter: batch ingest of receipts and the sending side, on an asyncpg pool.

One transaction per batch, a handful of set-based statements (see `queries`), the status of
each message computed by the pure rules module. Driver errors are translated here: connection
trouble → StoreUnavailableError (retry the batch, ack nothing); deadlock/serialization → retried
in place; a data error → the batch is bisected and the poison receipt kept raw (C8).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import asyncpg
import asyncpg.exceptions
import asyncpg.exceptions._base as asyncpg_base  # the client-side DataError lives only here

from dlrfeed.config import Pooler
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import MAX_ID_CHARS, PARSER_VERSION, LogicalEvent, fingerprint, parse
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.rules import (
    EMPTY_STATE,
    RECORD_FIELDS,
    RULES_VERSION,
    Basis,
    Delivery,
    KeyContents,
    MessageState,
    PlannedException,
    Planner,
    explain,
    is_final,
    record_differences,
    status_change,
)
from dlrfeed.domain.status import STAT_TO_STATUS, Outcome, Status
from dlrfeed.domain.wire_format import evidence_key
from dlrfeed.errors import (
    BadDataError,
    ConfigError,
    SchemaOutOfDateError,
    StoreUnavailableError,
)
from dlrfeed.store import copy_rows, queries
from dlrfeed.store.migrate import ensure_current
from dlrfeed.store.server import (
    WRITABLE,
    ServerFacts,
    behind_transaction_pooler,
    check_server,
    connect_options,
)
from dlrfeed.store.submission import Submission, SubmissionResult

# Errors that mean "this input cannot be stored" (C8): retrying the same rows fails the same way.
_DATA_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,  # SQLSTATE class 22
    asyncpg.exceptions.IntegrityConstraintViolationError,  # class 23
    asyncpg.exceptions.ProgramLimitExceededError,  # class 54 (e.g. an index row too large)
    asyncpg_base.DataError,  # client side: a value the driver cannot encode
    UnicodeError,
    OverflowError,
)
# Errors that mean "the server or the connection is gone"; nothing was committed.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg_base.InterfaceError,
    # A backend killed under an idle pooled connection can leave the client's protocol state
    # confused ("cannot switch to state ..."); the connection is as good as lost.
    asyncpg_base.InternalClientError,
    OSError,
    TimeoutError,
)
# Server states that pass: a read-only server (a standby before failover completes, class 25)
# or deadlocks still failing after every retry (class 40). The batch is retried whole later.
_PASSING_SERVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidTransactionStateError,
    asyncpg.exceptions.TransactionRollbackError,
)
# The statements name a table, column or function the database no longer has.
_SCHEMA_CHANGED_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.UndefinedColumnError,
    asyncpg.exceptions.UndefinedFunctionError,
)
_DEADLOCK_RETRIES = 8
# Receptions per COPY piece: the server inserts a piece while the client plans the next one.
_COPY_PIECE = 100
# Bounds on waiting for PostgreSQL. A statement may legitimately wait for row locks held by
# another worker, so its bound is generous, but well inside the gateway's 120 s lease (F6).
_CONNECT_TIMEOUT_S = 10.0
_STATEMENT_TIMEOUT_S = 60.0
_MISSING = "\x00missing"  # a dict.get default that no storable value equals (no NUL)
_T = TypeVar("_T")
_U = TypeVar("_U")

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    # asyncpg's classes are generic only in its stubs.
    _Connection: TypeAlias = (
        asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    )

# The parameters of queries.INSERT_MESSAGES that take the columns of Submission.normalised,
# in its order.
_SUBMISSION_COLUMNS = (
    "message_ids",
    "internal_ids",
    "destinations",
    "destinations_raw",
    "destinations_e164",
    "sources",
    "routes",
    "submitted_at",
    "dlr_requested",
    "dlr_levels",
)
# Where each of rules.RECORD_FIELDS sits in a row of Submission.normalised.
_RECORD_POSITIONS = (1, 3, 5, 6, 7, 8, 9)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What `Store.ingest` did with a batch: one outcome per receipt, in batch order."""

    outcomes: list[Outcome]
    counts: Mapping[Outcome, int]
    deadlock_retries: int = 0
    bisections: int = 0


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    """What `Store.recompute` did."""

    examined: int
    """Status rows computed again."""
    changed: int
    """Of those, rows whose status, reason, basis or counters changed (each audited)."""


@dataclass(slots=True)
class _Plan:
    """What one batch writes besides the receptions, built as the planner decides each
    delivery: the receptions' outcomes and event ids a piece at a time while they are copied
    in, then the exceptions; the statuses and event counters are the planner's own."""

    planner: Planner
    outcomes: list[Outcome] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    exceptions: list[tuple[str, str, str, int | None, int | None]] = field(default_factory=list)


def _state_from_row(row: asyncpg.Record) -> MessageState:
    """The planner's state of a message from its status row (and, with no row, the counters of
    its earlier events that the rules never applied)."""
    if row["status"] is None:
        return MessageState(None, row["orphan_repeats"], row["orphan_conflicts"])
    basis = Basis(
        row["supporting_event_id"],
        row["supporting_reception_id"] or 0,
        row["basis_level"],
        Status(row["status"]),
        row["basis_stat"],
        row["basis_err"],
        row["basis_done_at"],
    )
    return MessageState(
        basis,
        row["repeats"],
        row["conflicts"],
        row["progress_events"],
        row["deadline_superseded"],
        frozenset(row["status_flags"]),
    )


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _json(rows: Iterable[list[Any]]) -> str:
    """A JSON array of rows, the one parameter of a set-based statement (see queries)."""
    return _dumps(list(rows))


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


def _columns(rows: Sequence[Sequence[Any]], count: int) -> list[list[Any]]:
    """The first `count` columns of `rows` as arrays: a set-based statement's parameters."""
    return [[row[column] for row in rows] for column in range(count)]


def _reception_ids(blocks: list[int], count: int) -> Iterator[int]:
    """The ids of a batch's `count` receptions in batch order, numbered inside the id blocks
    queries.INSERT_EVENTS_READ_STATUSES drew (RECEPTION_ID_BLOCK consecutive ids from each)."""
    size = queries.RECEPTION_ID_BLOCK
    return itertools.islice(
        itertools.chain.from_iterable(range(f, f + size) for f in blocks), count
    )


def _status_json(statuses: Mapping[str, MessageState]) -> str:
    """The :statuses rows of the upsert_statuses fragment (sql/ingest.sql) for the states
    that have a basis."""
    rows = []
    iso: dict[int, str] = {}  # by object: a batch's statuses mostly share parsed done dates
    for key, s in sorted(statuses.items()):
        basis = s.basis
        if basis is None:
            continue
        at = basis.order_at
        if at is None:
            done = None
        else:
            done = iso.get(id(at))
            if done is None:
                done = iso[id(at)] = at.isoformat()
        rows.append(
            [
                key,
                basis.status,  # StrEnum: JSON-encoded as its value
                is_final(s),
                explain(s),
                basis.event_id,
                s.repeats,
                s.conflicts,
                s.progress_events,
                s.deadline_superseded,
                basis.reception_id,
                basis.level,
                basis.stat,
                basis.err,
                done,
                " ".join(sorted(s.flags)) if s.flags else "",
            ]
        )
    return _dumps(rows)


def _planned_exceptions(
    exceptions: Iterable[PlannedException],
    message_id: str,
    event_id: int,
    position: int | None,
) -> Iterator[tuple[str, str, str, int | None, int | None]]:
    """The planner's exceptions of one delivery as rows (kind, message id, details, event id,
    batch position or reception id)."""
    for planned in exceptions:
        yield planned.kind, message_id, json.dumps(planned.details), event_id, position


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Pool release hook: nothing to reset, so no extra round trip per call.

    The store's statements leave no session state behind (transaction-scoped advisory locks
    only, no SET, LISTEN or cursors), and the pool still rolls back an unfinished transaction
    before this hook runs; the driver's default reset would cost a round trip per ingest.
    """


def _printable(value: str) -> str:
    """A form of any Python string that text and jsonb accept (C8 evidence labels)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def _first_events(events: list[LogicalEvent]) -> tuple[list[LogicalEvent], str]:
    """P14: the first delivery of each key in the batch, in arrival order, and their insert rows.

    Returns (those events, the JSON parameter of queries.INSERT_EVENTS_READ_STATUSES).
    Arrival order, not key order: event ids then follow the order the batch's receipts arrived
    in (the locks serialise the events of one id, so key order buys no deadlock safety here).
    """
    first_of_key: dict[tuple[str, int], int] = {}
    for position, event in enumerate(events):
        first_of_key.setdefault((event.message_id, event.level), position)
    firsts = [events[p] for p in first_of_key.values()]
    done_at: dict[str | None, str | None] = {None: None}  # many receipts share a done date
    rows = []
    for e in firsts:
        done_iso = done_at.get(e.done_date_raw, _MISSING)
        if done_iso is _MISSING:
            done_iso = done_at[e.done_date_raw] = (
                None if e.done_at is None else e.done_at.isoformat()
            )
        rows.append(
            [
                e.message_id,
                None if e.correlation_id == e.message_id else e.correlation_id,
                e.level,
                e.stat,
                e.status,  # StrEnum: JSON-encoded as its value
                e.err,
                e.done_date_raw,
                done_iso,
                e.fingerprint,
                " ".join(e.flags),
                int(e.received_at * 1_000_000),
            ]
        )
    return firsts, _dumps(rows)


def _replayed(row: asyncpg.Record) -> tuple[Delivery, int, int]:
    """A stored reception as the planner's delivery, with its event id and its reception id
    (late correlation, recompute)."""
    stat = row["stat"]
    err = row["err"]
    done_raw = row["done_date_raw"]
    # Receptions stored before migration 0008 have no fingerprint: derived from the stored
    # values, which equal the raw ones unless a field had to be cut or NUL-escaped.
    content = row["fingerprint"] or fingerprint(stat, err, done_raw)
    delivery = Delivery(
        row["message_id"],
        row["correlation_id"],
        row["level"],
        STAT_TO_STATUS.get(stat, Status.UNRECOGNIZED),
        stat,
        err,
        row["done_at"],
        row["received_at"].timestamp(),
        content,
        tuple(row["flags"]),
    )
    return delivery, row["event_id"], row["id"]


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
            plan.exceptions += _planned_exceptions(exceptions, e.message_id, event_id, position + 1)
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
    ) -> None:
        self._pool = pool
        self.options = options
        self.through_pooler = through_pooler
        """Whether the pool does without named prepared statements (a transaction pooler)."""
        self.server = server
        """What `open` found of the server (its synchronous commit settings)."""

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
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            async with pool.acquire(timeout=_CONNECT_TIMEOUT_S) as conn:
                facts = await check_server(
                    conn, require_synchronous_commit=require_synchronous_commit
                )
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, _CONNECTION_ERRORS):
                raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
            raise
        return cls(
            pool, options or IntegrationOptions(), through_pooler=through_pooler, server=facts
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
        except _CONNECTION_ERRORS as exc:
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
        except _CONNECTION_ERRORS as exc:
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
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable during ingest: {exc}") from exc
        except _PASSING_SERVER_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL refused the batch for now: {exc}") from exc
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise ConfigError(
                f"the database role may not ingest ({exc}): connect as the writer role, "
                "see sql/roles.sql and docs/security.md"
            ) from exc
        except _SCHEMA_CHANGED_ERRORS as exc:
            # A migration ran while this daemon was up: its statements no longer fit the
            # tables. Nothing was committed or acked (the gateway redelivers); stop, in one line.
            raise SchemaOutOfDateError(
                f"the database schema changed under this dlrfeed ({exc}): stop it, run "
                "`dlrfeed migrate`, and start the dlrfeed that matches the schema"
            ) from exc
        return IngestResult(outcomes, Counter(outcomes), retries, bisections)

    async def _ingest_bisecting(
        self,
        conn: _Connection,
        login: str,
        receipts: Sequence[Receipt],
        events: list[LogicalEvent],
    ) -> tuple[list[Outcome], int, int]:
        try:
            outcomes, retries = await self._ingest_retrying(conn, login, events)
        except _DATA_ERRORS as exc:
            # C8: find the poison receipt by halving, all inside ONE outer transaction (each
            # half's transaction becomes a savepoint): a connection lost half-way then commits
            # nothing, and the caller's whole-batch retry stores no delivery twice.
            async with conn.transaction():
                return await self._split(conn, login, receipts, events, exc)
        return outcomes, retries, 0

    async def _split(
        self,
        conn: _Connection,
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
            except _DATA_ERRORS as exc:
                done, attempts, splits = await self._split(conn, login, part, part_events, exc)
                bisections += splits
            outcomes += done
            retries += attempts
        return outcomes, retries, bisections

    async def _ingest_retrying(
        self, conn: _Connection, login: str, events: list[LogicalEvent]
    ) -> tuple[list[Outcome], int]:
        for attempt in range(_DEADLOCK_RETRIES + 1):
            try:
                async with conn.transaction():
                    return await self._ingest_once(conn, login, events), attempt
            except asyncpg.exceptions.TransactionRollbackError:
                # Deadlock or serialization failure: the transaction was rolled back whole;
                # running it again is safe. Sorted locking makes this rare.
                if attempt == _DEADLOCK_RETRIES:
                    raise
                await asyncio.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable: the loop returns or raises")

    async def _store_unstorable(
        self, conn: _Connection, login: str, receipt: Receipt, error: BaseException
    ) -> None:
        details = {
            "error": f"{type(error).__name__}: {error}"[:2000],
            "receipt": _printable(repr(receipt)[:4000]),
            "delivery_count": receipt.delivery_count,
        }
        arguments = {
            "login": login,
            "message_id": _printable(receipt.message_id)[:MAX_ID_CHARS],
            "details": json.dumps(details, ensure_ascii=True),
            "evidence": bytes(receipt.raw),
            "evidence_key": evidence_key(receipt.raw),
        }
        # Delivered again while an earlier delivery is under investigation: one open exception
        # per receipt (never counted twice), every delivery's bytes kept. Only an operator
        # resolving that exception between our two statements sends us round again.
        while await queries.OPEN_UNSTORABLE.fetchval(conn, **arguments) is None:
            if await queries.RECORD_UNSTORABLE_REDELIVERY.fetchval(conn, **arguments) is not None:
                return

    async def _correlate(
        self, conn: _Connection, login: str, ids: list[str]
    ) -> dict[str, datetime | None]:
        """Lock the messages of `ids` (sorted); those that exist with their submission time."""
        lock = queries.LOCK_MESSAGES
        found = {r[0]: r[1] for r in await lock.fetch(conn, login=login, message_ids=ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            await queries.LOCK_CORRELATION_IDS.fetchval(conn, login=login, ids=missing)
            # A new statement, so a message committed while we waited is seen now.
            found.update(
                (r[0], r[1]) for r in await lock.fetch(conn, login=login, message_ids=missing)
            )
        return found

    async def _ingest_once(
        self, conn: _Connection, login: str, events: list[LogicalEvent]
    ) -> list[Outcome]:
        # P10: correlation and the message locks first (sorted), then held statuses. Meanwhile
        # the client prepares the events insert (it depends on the receipts alone).
        correlation_ids = sorted({e.correlation_id for e in events})
        submitted, (firsts, events_json) = await _overlapped(
            self._correlate(conn, login, correlation_ids), lambda: _first_events(events)
        )
        # P14: insert-or-detect of the logical events (first delivery of each key in the batch),
        # the held statuses and the batch's reception id blocks, in one statement, while the
        # client encodes the receptions.
        returned, receipt_fields = await _overlapped(
            queries.INSERT_EVENTS_READ_STATUSES.fetch(
                conn,
                login=login,
                parser_version=PARSER_VERSION,
                rules_version=RULES_VERSION,
                events=events_json,
                correlated=sorted(submitted),
                id_blocks=-(-len(events) // queries.RECEPTION_ID_BLOCK),  # the ceiling
            ),
            lambda: copy_rows.encode_receipt_fields(login, events),
        )
        inserted: dict[tuple[str, int], int] = {}
        held: dict[str, MessageState] = {}
        id_blocks: list[int] = []
        for row in returned:
            if row["message_id"] is None:  # only the id block rows have none
                id_blocks.append(row["id"])
            elif row["id"] is not None:
                inserted[(row["message_id"], row["level"])] = row["id"]
            else:
                held[row["message_id"]] = _state_from_row(row)
        stored: dict[tuple[str, int], int] = {}
        keys: dict[tuple[str, int], KeyContents] = {}
        if len(inserted) < len(firsts):
            existing = [e for e in firsts if (e.message_id, e.level) not in inserted]
            for r in await queries.LOCK_EXISTING_EVENTS.fetch(
                conn,
                login=login,
                message_ids=[e.message_id for e in existing],
                levels=[e.level for e in existing],
            ):
                stored[(r[1], r[2])] = r[0]
                keys[(r[1], r[2])] = KeyContents(Status(r[4]), (r[3], *r[5]))

        # P6/P13: every delivery of the batch, appended by binary COPY (the server's multi-row
        # insert path: far less work and WAL than INSERT ... SELECT per row). The planner
        # decides each delivery's outcome a piece of the batch at a time, and each piece's
        # receptions go to the server as soon as they are complete: it inserts them while the
        # client plans the next piece.
        plan = _Plan(Planner(self.options, keys, dict(held), submitted))
        reception_ids = list(_reception_ids(id_blocks, len(events)))
        event_ids = [
            inserted.get((e.message_id, e.level)) or stored[(e.message_id, e.level)] for e in events
        ]

        async def planned_receptions() -> AsyncIterator[bytes]:
            yield copy_rows.SIGNATURE
            for start in range(0, len(events), _COPY_PIECE):
                piece = range(start, min(start + _COPY_PIECE, len(events)))
                _plan_piece(plan, events, piece, event_ids, reception_ids)
                yield copy_rows.complete(
                    receipt_fields[piece.start : piece.stop],
                    reception_ids[piece.start : piece.stop],
                    plan.outcomes[piece.start : piece.stop],
                    event_ids[piece.start : piece.stop],
                )
            yield copy_rows.TRAILER

        await conn.copy_to_table(
            queries.RECEPTIONS_TABLE,
            schema_name=queries.RECEPTIONS_SCHEMA,
            columns=copy_rows.COLUMNS,
            source=planned_receptions(),
            format="binary",
        )
        planner = plan.planner
        changed = {k: v for k, v in planner.messages.items() if held.get(k) is not v}
        counted = list(planner.event_last)
        kinds, message_ids, details, exception_event_ids, positions = _columns(plan.exceptions, 5)
        await queries.WRITE_BATCH.execute(
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
            statuses=_status_json(changed),
            event_ids=counted,
            event_accepted=[planner.event_accepted.get(i, 0) for i in counted],
            event_conflicts=[planner.event_conflicts.get(i, 0) for i in counted],
            event_received_at=[planner.event_last[i] for i in counted],
            event_updates=[" ".join(planner.key_updates.get(i, ())) for i in counted],
        )
        return plan.outcomes

    # ---------------------------------------------------------------- submissions

    async def record_submissions(self, submissions: Sequence[Submission]) -> SubmissionResult:
        """Record sent messages (P5) and correlate the receipts that were waiting for them.

        Idempotent: a message id already recorded for its login is left unchanged; a different
        record of it is kept in a `second_record` exception (P12). Chunks of 500 commit one by
        one; BadDataError when the database refuses a value. Deliveries that arrived first are
        replayed through the same planner in their arrival order, and the `uncorrelated`
        exceptions of their events resolved with the reason.
        """
        by_login: dict[str, list[Submission]] = {}
        for submission in submissions:
            by_login.setdefault(submission.login, []).append(submission)
        recorded = late = 0
        try:
            async with self._pool.acquire() as conn:
                for login, group in sorted(by_login.items()):
                    for start in range(0, len(group), 500):
                        chunk = group[start : start + 500]
                        async with conn.transaction():
                            new, applied = await self._record_chunk(conn, login, chunk)
                        recorded += new
                        late += applied
        except _DATA_ERRORS as exc:
            # Chunks already committed stay (recording is idempotent: run the file again).
            raise BadDataError(f"a submission was refused by the database: {exc}") from exc
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
        return SubmissionResult(
            recorded=recorded,
            already_recorded=len(submissions) - recorded,
            late_correlated_events=late,
        )

    async def _record_chunk(
        self, conn: _Connection, login: str, chunk: list[Submission]
    ) -> tuple[int, int]:
        rows = [s.normalised(self.options) for s in chunk]
        ids = sorted({row[0] for row in rows})
        # The same advisory locks as ingest takes for ids it cannot correlate: whichever of us
        # comes second sees what the first committed (late correlation is never missed), and
        # two recorders of one id see each other's record.
        await queries.LOCK_CORRELATION_IDS.fetchval(conn, login=login, ids=ids)
        first_rows: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            first_rows.setdefault(row[0], row)
        firsts = list(first_rows.values())
        columns = dict(zip(_SUBMISSION_COLUMNS, _columns(firsts, 10), strict=True))
        inserted: dict[str, datetime | None] = {
            r[0]: r[1] for r in await queries.INSERT_MESSAGES.fetch(conn, login=login, **columns)
        }
        # P12: every record that was not inserted is compared with the one recorded.
        others = [row for row in rows if row[0] not in inserted or first_rows[row[0]] is not row]
        if others:
            await self._keep_second_records(conn, login, others)
        new_ids = sorted(inserted)
        if not new_ids:
            return 0, 0
        waiting = await queries.WAITING_RECEPTIONS.fetch(conn, login=login, correlation_ids=new_ids)
        if not waiting:
            return len(new_ids), 0
        # Late correlation: every delivery that arrived before the message was recorded,
        # replayed through the planner in its recorded arrival order (P19), from no state.
        planner = Planner(self.options, {}, dict.fromkeys(new_ids, EMPTY_STATE), inserted)
        resolutions: dict[int, str] = {}
        exceptions: list[tuple[str, str, str, int | None, int | None]] = []
        for reception in waiting:
            delivery, event_id, reception_id = _replayed(reception)
            outcome, planned = planner.decide(delivery, event_id, reception_id)
            resolutions.setdefault(
                event_id,
                f"correlated late: message {delivery.correlation_id} recorded; "
                f"rules outcome {outcome.value}",
            )
            # Only the message layer's items: the others were opened when it was stored.
            exceptions += _planned_exceptions(
                (p for p in planned if p.message_level),
                delivery.message_id,
                event_id,
                reception_id,
            )
        kinds, message_ids, details, event_ids, reception_ids = _columns(exceptions, 5)
        await queries.WRITE_LATE_CORRELATION.fetchval(
            conn,
            login=login,
            rules_version=RULES_VERSION,
            statuses=_status_json(planner.messages),
            resolved_event_ids=list(resolutions),
            resolutions=list(resolutions.values()),
            exception_kinds=kinds,
            exception_message_ids=message_ids,
            exception_details=details,
            exception_event_ids=event_ids,
            exception_reception_ids=reception_ids,
        )
        return len(new_ids), len(resolutions)

    async def _keep_second_records(
        self, conn: _Connection, login: str, others: list[tuple[Any, ...]]
    ) -> None:
        """P12: a record of an already recorded message id that differs from it is kept as
        evidence in a `second_record` exception (once per distinct record); an identical one
        changes nothing."""
        recorded = {
            r["message_id"]: r
            for r in await queries.RECORDED_MESSAGES.fetch(
                conn, login=login, message_ids=sorted({row[0] for row in others})
            )
        }
        found: dict[str, tuple[str, str]] = {}
        for row in others:
            second = {
                name: row[i] for name, i in zip(RECORD_FIELDS, _RECORD_POSITIONS, strict=True)
            }
            differs = record_differences(dict(recorded[row[0]]), second)
            if not differs:
                continue
            evidence = {
                name: value.isoformat() if isinstance(value, datetime) else value
                for name, value in second.items()
            }
            details = json.dumps(
                {
                    "rule": "P12",
                    "cause": "second_record",
                    "differs_in": differs,
                    "recorded_internal_id": recorded[row[0]]["internal_id"],
                    "second_record": evidence,
                },
                ensure_ascii=False,
            )
            key = hashlib.sha256(
                json.dumps([row[0], evidence], sort_keys=True).encode("utf-8")
            ).hexdigest()
            found.setdefault(key, (row[0], details))
        if found:
            await queries.OPEN_SECOND_RECORDS.execute(
                conn,
                login=login,
                message_ids=[v[0] for v in found.values()],
                details=[v[1] for v in found.values()],
                evidence_keys=list(found),
            )

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
        examined = changed = 0
        after = ("", "")
        try:
            async with self._pool.acquire() as conn:
                while True:
                    keys = await queries.STALE_STATUSES.fetch(
                        conn,
                        after_login=after[0],
                        after_message_id=after[1],
                        chunk=chunk,
                        every=every,
                        rules_version=RULES_VERSION,
                    )
                    if not keys:
                        break
                    after = (keys[-1]["login"], keys[-1]["message_id"])
                    by_login: dict[str, list[str]] = {}
                    for key in keys:
                        by_login.setdefault(key["login"], []).append(key["message_id"])
                    for login, message_ids in by_login.items():
                        async with conn.transaction():
                            changed += await self._recompute_chunk(conn, login, message_ids)
                        examined += len(message_ids)
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
        return RecomputeResult(examined=examined, changed=changed)

    async def _recompute_chunk(self, conn: _Connection, login: str, message_ids: list[str]) -> int:
        submitted = await self._correlate(conn, login, sorted(message_ids))
        before = {
            r["message_id"]: r
            for r in await queries.LOCK_STATUSES.fetch(conn, login=login, message_ids=message_ids)
        }
        planner = Planner(self.options, {}, dict.fromkeys(submitted, EMPTY_STATE), submitted)
        for reception in await queries.WAITING_RECEPTIONS.fetch(
            conn, login=login, correlation_ids=sorted(submitted)
        ):
            planner.decide(*_replayed(reception))
        audit: list[list[Any]] = []
        gone: list[str] = []
        for message_id, old in sorted(before.items()):
            state = planner.messages.get(message_id, EMPTY_STATE)
            why = status_change(dict(old), state)
            if state.basis is None:
                gone.append(message_id)
            if why is None:
                continue
            basis = state.basis
            audit.append(
                [
                    message_id,
                    old["status"],
                    old["is_final"],
                    old["reason"],
                    old["supporting_event_id"],
                    old["rules_version"],
                    None if basis is None else basis.status,
                    None if basis is None else is_final(state),
                    None if basis is None else explain(state),
                    None if basis is None else basis.event_id,
                    f"recomputed under {RULES_VERSION} (was {old['rules_version']}): {why}",
                ]
            )
        await queries.WRITE_RECOMPUTE.execute(
            conn,
            login=login,
            rules_version=RULES_VERSION,
            statuses=_status_json({m: s for m, s in planner.messages.items() if m in before}),
            gone=gone,
            audit=_dumps(audit),
        )
        return len(audit)
