"""The PostgreSQL adapter: batch ingest of receipts and the sending side, on an asyncpg pool.

One transaction per batch, a handful of set-based statements (see `queries`), the status of
each message computed by the pure rules module. Driver errors are translated here: connection
trouble → StoreUnavailableError (retry the batch, ack nothing); deadlock/serialization → retried
in place; a data error → the batch is bisected and the poison receipt kept raw (C8).
"""

from __future__ import annotations

import asyncio
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
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import asyncpg
import asyncpg.exceptions
import asyncpg.exceptions._base as asyncpg_base  # the client-side DataError lives only here

from dlrfeed.config import Pooler
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import MAX_ID_CHARS, PARSER_VERSION, LogicalEvent, parse
from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.rules import RULES_VERSION, EventFacts, MessageStatus, apply, count
from dlrfeed.domain.status import Outcome, Status
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

# Parse flags that deserve a `malformed` exception; ND/empty dates are documented absences.
_BENIGN_FLAG_SUFFIXES = ("_nd", "_empty", "stat_unrecognized")


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What `Store.ingest` did with a batch: one outcome per receipt, in batch order."""

    outcomes: list[Outcome]
    counts: Mapping[Outcome, int]
    deadlock_retries: int = 0
    bisections: int = 0


@dataclass(slots=True)
class _Plan:
    """The rows one batch writes, built in Python after the reads: its receptions' outcomes
    a piece at a time while they are copied in, then the statuses, exceptions and counters."""

    outcomes: list[Outcome] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    exceptions: list[tuple[str, str, str, int | None, int | None]] = field(default_factory=list)
    statuses: dict[str, MessageStatus] = field(default_factory=dict)
    event_repeats: Counter[int] = field(default_factory=Counter)
    event_conflicts: Counter[int] = field(default_factory=Counter)
    event_last: dict[int, float] = field(default_factory=dict)


def _status_from_row(row: asyncpg.Record) -> MessageStatus:
    basis = EventFacts(
        ref=row["supporting_event_id"],
        status=Status(row["basis_status"]),
        stat=row["basis_stat"],
        err=row["basis_err"],
        done_at=row["basis_done_at"],
        fingerprint=row["basis_fingerprint"],
    )
    return MessageStatus(
        status=Status(row["status"]),
        is_final=row["is_final"],
        reason=row["reason"],
        basis=basis,
        repeats=row["repeats"],
        conflicts=row["conflicts"],
        progress_events=row["progress_events"],
        deadline_superseded=row["deadline_superseded"],
    )


def _facts(event: LogicalEvent, ref: int) -> EventFacts:
    return EventFacts(ref, event.status, event.stat, event.err, event.done_at, event.fingerprint)


def _is_malformed(flags: tuple[str, ...]) -> bool:
    return any(not flag.endswith(_BENIGN_FLAG_SUFFIXES) for flag in flags)


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


def _status_json(statuses: Mapping[str, MessageStatus]) -> str:
    return _json(
        [
            key,
            s.status,  # StrEnum: JSON-encoded as its value
            s.is_final,
            s.reason,
            s.basis.ref,
            s.repeats,
            s.conflicts,
            s.progress_events,
            s.deadline_superseded,
        ]
        for key, s in sorted(statuses.items())
    )


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Pool release hook: nothing to reset, so no extra round trip per call.

    The store's statements leave no session state behind (transaction-scoped advisory locks
    only, no SET, LISTEN or cursors), and the pool still rolls back an unfinished transaction
    before this hook runs; the driver's default reset would cost a round trip per ingest.
    """


def _printable(value: str) -> str:
    """A form of any Python string that text and jsonb accept (C8 evidence labels)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def _first_events(
    events: list[LogicalEvent],
) -> tuple[dict[tuple[str, int], int], list[LogicalEvent], str]:
    """P14: the first delivery of each key in the batch, sorted by key, and their insert rows.

    Returns (position of each key's first delivery, those events, the JSON parameter of
    queries.INSERT_EVENTS_READ_STATUSES).
    """
    first_of_key: dict[tuple[str, int], int] = {}
    for position, event in enumerate(events):
        first_of_key.setdefault((event.message_id, event.level), position)
    firsts = [events[p] for p in sorted(first_of_key.values())]
    firsts.sort(key=lambda e: (e.message_id, e.level))
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
    return first_of_key, firsts, _dumps(rows)


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
                writable = await conn.fetchval(WRITABLE, timeout=_CONNECT_TIMEOUT_S)
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
        arguments = (
            login,
            _printable(receipt.message_id)[:MAX_ID_CHARS],
            json.dumps(details, ensure_ascii=True),
            bytes(receipt.raw),
            evidence_key(receipt.raw),
        )
        # Delivered again while an earlier delivery is under investigation: one open exception
        # per receipt (never counted twice), every delivery's bytes kept. Only an operator
        # resolving that exception between our two statements sends us round again.
        while await conn.fetchval(queries.OPEN_UNSTORABLE, *arguments) is None:
            if await conn.fetchval(queries.RECORD_UNSTORABLE_REDELIVERY, *arguments) is not None:
                return

    async def _correlate(self, conn: _Connection, login: str, ids: list[str]) -> set[str]:
        """Lock the messages of `ids` (sorted) and return those that exist (P10-P12)."""
        found = {r[0] for r in await conn.fetch(queries.LOCK_MESSAGES, login, ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            await conn.fetchval(queries.LOCK_CORRELATION_IDS, login, missing)
            # A new statement, so a message committed while we waited is seen now.
            found.update(r[0] for r in await conn.fetch(queries.LOCK_MESSAGES, login, missing))
        return found

    async def _ingest_once(
        self, conn: _Connection, login: str, events: list[LogicalEvent]
    ) -> list[Outcome]:
        # P10: correlation and the message locks first (sorted), then held statuses. Meanwhile
        # the client prepares the events insert (it depends on the receipts alone).
        correlation_ids = sorted({e.correlation_id for e in events})
        correlated, (first_of_key, firsts, events_json) = await _overlapped(
            self._correlate(conn, login, correlation_ids), lambda: _first_events(events)
        )
        # P14: insert-or-detect of the logical events (first delivery of each key in the batch),
        # the held statuses and the batch's reception id blocks, in one statement, while the
        # client encodes the receptions.
        returned, receipt_fields = await _overlapped(
            conn.fetch(
                queries.INSERT_EVENTS_READ_STATUSES,
                login,
                PARSER_VERSION,
                RULES_VERSION,
                events_json,
                sorted(correlated),
                -(-len(events) // queries.RECEPTION_ID_BLOCK),  # blocks: the ceiling
            ),
            lambda: copy_rows.encode_receipt_fields(login, events),
        )
        inserted: dict[tuple[str, int], int] = {}
        held: dict[str, MessageStatus] = {}
        pending: dict[str, list[int]] = {}
        id_blocks: list[int] = []
        for row in returned:
            if row["message_id"] is None:  # only the id block rows have none
                id_blocks.append(row["id"])
            elif row["id"] is not None:
                inserted[(row["message_id"], row["level"])] = row["id"]
            elif row["status"] is not None:
                held[row["message_id"]] = _status_from_row(row)
            else:
                pending[row["message_id"]] = [row["orphan_repeats"], row["orphan_conflicts"]]
        stored: dict[tuple[str, int], tuple[int, str]] = {}
        if len(inserted) < len(firsts):
            existing = [e for e in firsts if (e.message_id, e.level) not in inserted]
            for r in await conn.fetch(
                queries.LOCK_EXISTING_EVENTS,
                login,
                [e.message_id for e in existing],
                [e.level for e in existing],
            ):
                stored[(r[1], r[2])] = (r[0], r[3])

        # P6/P13: every delivery of the batch, appended by binary COPY (the server's multi-row
        # insert path: far less work and WAL than INSERT ... SELECT per row). The plan decides
        # each delivery's outcome a piece of the batch at a time, and each piece's receptions
        # go to the server as soon as they are complete: it inserts them while the client
        # plans the next piece.
        plan = _Plan(statuses=dict(held))
        reception_ids = list(_reception_ids(id_blocks, len(events)))

        async def planned_receptions() -> AsyncIterator[bytes]:
            yield copy_rows.SIGNATURE
            for start in range(0, len(events), _COPY_PIECE):
                piece = range(start, min(start + _COPY_PIECE, len(events)))
                self._plan(plan, events, piece, first_of_key, inserted, stored, correlated, pending)
                yield copy_rows.complete(
                    receipt_fields[piece.start : piece.stop],
                    reception_ids[piece.start : piece.stop],
                    plan.outcomes[piece.start : piece.stop],
                    plan.event_ids[piece.start : piece.stop],
                )
            yield copy_rows.TRAILER

        await conn.copy_to_table(
            queries.RECEPTIONS_TABLE,
            schema_name=queries.RECEPTIONS_SCHEMA,
            columns=copy_rows.COLUMNS,
            source=planned_receptions(),
            format="binary",
        )
        changed = {k: v for k, v in plan.statuses.items() if held.get(k) is not v}
        await conn.execute(
            queries.WRITE_BATCH,
            login,
            RULES_VERSION,
            id_blocks,
            *_columns(plan.exceptions, 5),
            _status_json(changed),
            list(plan.event_last),
            [plan.event_repeats[i] for i in plan.event_last],
            [plan.event_conflicts[i] for i in plan.event_last],
            list(plan.event_last.values()),
        )
        return plan.outcomes

    def _plan(
        self,
        plan: _Plan,
        events: list[LogicalEvent],
        positions: range,
        first_of_key: dict[tuple[str, int], int],
        inserted: dict[tuple[str, int], int],
        stored: dict[tuple[str, int], tuple[int, str]],
        correlated: set[str],
        pending: dict[str, list[int]],
    ) -> None:
        """Add to `plan` the outcome of the deliveries at `positions` (the next ones, in batch
        order), new statuses, exceptions and event counters (P14-P19)."""
        options = self.options
        for position in positions:
            event = events[position]
            key = (event.message_id, event.level)
            cid = event.correlation_id
            new_id = inserted.get(key)
            if new_id is not None and first_of_key[key] == position:
                event_id = new_id
                outcome = self._apply_new(plan, event, event_id, position, cid in correlated)
                if cid in correlated and outcome is not Outcome.UNRECOGNIZED:
                    previous = plan.statuses.get(cid)
                    status, outcome = apply(previous, _facts(event, event_id), options)
                    if status is not None:
                        if previous is None:
                            carried = pending.pop(cid, [0, 0])
                            status = count(status, repeats=carried[0], conflicts=carried[1])
                        plan.statuses[cid] = status
                    self._open_rule_exception(plan, event, event_id, position, outcome, previous)
            else:
                if new_id is not None:
                    event_id, stored_fp = new_id, events[first_of_key[key]].fingerprint
                else:
                    event_id, stored_fp = stored[key]
                repeat = stored_fp == event.fingerprint
                outcome = Outcome.REPEAT if repeat else Outcome.CONFLICT
                if repeat:
                    plan.event_repeats[event_id] += 1
                else:
                    plan.event_conflicts[event_id] += 1
                    plan.exceptions.append(
                        (
                            "conflict",
                            event.message_id,
                            json.dumps(
                                {
                                    "cause": "same_key_other_content",
                                    "rule": "P14",
                                    "level": event.level,
                                    "stored_event_id": event_id,
                                    "stored_fingerprint": stored_fp,
                                    "fingerprint": event.fingerprint,
                                    "stat": event.stat,
                                    "err": event.err,
                                    "done_date": event.done_date_raw,
                                }
                            ),
                            event_id,
                            position + 1,
                        )
                    )
                if cid in correlated:
                    current = plan.statuses.get(cid)
                    if current is None:
                        counts = pending.setdefault(cid, [0, 0])
                        counts[0 if repeat else 1] += 1
                    else:
                        plan.statuses[cid] = count(
                            current, repeats=int(repeat), conflicts=int(not repeat)
                        )
                plan.event_last[event_id] = max(
                    plan.event_last.get(event_id, 0.0), event.received_at
                )
            if event.flags and outcome is not Outcome.REPEAT and _is_malformed(event.flags):
                plan.exceptions.append(
                    (
                        "malformed",
                        event.message_id,
                        json.dumps({"flags": list(event.flags), "rule": "C4"}),
                        event_id,
                        position + 1,
                    )
                )
            plan.outcomes.append(outcome)
            plan.event_ids.append(event_id)

    @staticmethod
    def _apply_new(
        plan: _Plan, event: LogicalEvent, event_id: int, position: int, correlated: bool
    ) -> Outcome:
        """Outcome of a new logical event before the rules: uncorrelated/unrecognized waits."""
        if not correlated:
            # P12/C5: no message with this id; never guessed from destination or text.
            plan.exceptions.append(
                (
                    "uncorrelated",
                    event.message_id,
                    json.dumps(
                        {
                            "rule": "P12",
                            "correlation_id": event.correlation_id,
                            "level": event.level,
                            "stat": event.stat,
                        }
                    ),
                    event_id,
                    position + 1,
                )
            )
            return Outcome.UNCORRELATED
        if event.status is Status.UNRECOGNIZED:
            plan.exceptions.append(
                (
                    "unrecognized",
                    event.message_id,
                    json.dumps({"rule": "P17", "stat": event.stat, "level": event.level}),
                    event_id,
                    position + 1,
                )
            )
            return Outcome.UNRECOGNIZED
        return Outcome.APPLIED

    @staticmethod
    def _open_rule_exception(
        plan: _Plan,
        event: LogicalEvent,
        event_id: int,
        position: int | None,
        outcome: Outcome,
        previous: MessageStatus | None,
    ) -> None:
        if outcome is Outcome.CONFLICT and previous is not None:
            # P18/C3: the first final applied stays; the later incompatible one is kept here.
            plan.exceptions.append(
                (
                    "conflict",
                    event.message_id,
                    json.dumps(
                        {
                            "cause": "incompatible_final",
                            "rule": "P18",
                            "held_status": previous.status.value,
                            "held_event_id": previous.basis.ref,
                            "incoming_status": event.status.value,
                            "incoming_stat": event.stat,
                        }
                    ),
                    event_id,
                    None if position is None else position + 1,
                )
            )

    # ---------------------------------------------------------------- submissions

    async def record_submissions(self, submissions: Sequence[Submission]) -> SubmissionResult:
        """Record sent messages (P5) and correlate the receipts that were waiting for them.

        Idempotent: a message id already recorded for its login is left unchanged. Chunks of 500
        commit one by one; BadDataError when the database refuses a value. Events that
        arrived first (open `uncorrelated` exceptions) are applied by the same rules, in the
        order they were first received, and their exceptions resolved with the reason.
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
        new_ids = sorted(
            r[0]
            for r in await conn.fetch(
                queries.INSERT_MESSAGES,
                login,
                *[[row[i] for row in rows] for i in range(10)],
            )
        )
        if not new_ids:
            return 0, 0
        # The same advisory locks as ingest takes for ids it cannot correlate: whichever of us
        # comes second sees what the first committed.
        await conn.fetchval(queries.LOCK_CORRELATION_IDS, login, new_ids)
        waiting = await conn.fetch(queries.WAITING_EVENTS, login, new_ids)
        if not waiting:
            return len(new_ids), 0
        plan = _Plan()
        resolved_ids: list[int] = []
        resolutions: list[str] = []
        counters: dict[str, list[int]] = {}
        for row in waiting:
            cid = row["correlation_id"]
            event_id = row["id"]
            totals = counters.setdefault(cid, [0, 0])
            totals[0] += row["times_received"] - 1
            totals[1] += row["conflicting_receptions"]
            facts = EventFacts(
                event_id,
                Status(row["status"]),
                row["stat"],
                row["err"],
                row["done_at"],
                row["fingerprint"],
            )
            previous = plan.statuses.get(cid)
            status, outcome = apply(previous, facts, self.options)
            if status is not None:
                plan.statuses[cid] = status
            if outcome is Outcome.UNRECOGNIZED:
                plan.exceptions.append(
                    (
                        "unrecognized",
                        row["message_id"],
                        json.dumps({"rule": "P17", "stat": row["stat"], "level": row["level"]}),
                        event_id,
                        None,
                    )
                )
            elif outcome is Outcome.CONFLICT and previous is not None:
                plan.exceptions.append(
                    (
                        "conflict",
                        row["message_id"],
                        json.dumps(
                            {
                                "cause": "incompatible_final",
                                "rule": "P18",
                                "held_status": previous.status.value,
                                "held_event_id": previous.basis.ref,
                                "incoming_status": row["status"],
                                "incoming_stat": row["stat"],
                            }
                        ),
                        event_id,
                        None,
                    )
                )
            resolved_ids.append(event_id)
            resolutions.append(
                f"correlated late: message {cid} recorded; rules outcome {outcome.value}"
            )
        for cid, status in list(plan.statuses.items()):
            totals = counters[cid]
            plan.statuses[cid] = count(status, repeats=totals[0], conflicts=totals[1])
        await conn.fetchval(
            queries.WRITE_LATE_CORRELATION,
            login,
            RULES_VERSION,
            _status_json(plan.statuses),
            resolved_ids,
            resolutions,
            *_columns(plan.exceptions, 4),
        )
        return len(new_ids), len(waiting)
