"""`--shared-store`: SQLite as the authority, so several fakegw processes act as one gateway.

This module is the SQL; fakegw.shared_backend puts the feed's interface on top of it.

In the default mode each process owns an in-memory index and SQLite is only its journal. In
this mode the store file itself holds queue membership, leases and acks, and every node (a
fakegw process, or a FakeGateway instance) reads and changes it in short `BEGIN IMMEDIATE`
transactions on one dedicated thread. A lease is one atomic `UPDATE ... RETURNING`, so two
nodes can never hold one receipt at once (F12). Sequence numbers and hand-out positions come
from one counter in `meta`, ledger ids from SQLite's rowid, so they are unique across nodes.

Nodes learn of each other's commits by polling `PRAGMA data_version` (it changes when another
connection commits) every `poll_seconds`; a lease left by a node that died runs out (F6) and
any node's housekeeping puts it back at the back of the queue.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import structlog

from fakegw.persistence import dumps
from fakegw.tokens import TokenSigner
from fakegw.wire import ReceiptFields, encode_fields

log = structlog.get_logger("fakegw.shared")

# One row per leased receipt: (seq, delivery_count, wire, token, queue_pos).
LeasedRow = tuple[int, int, bytes, str, int]
# One ledger row: (id, kind, login, seq, token, at, fields as JSON).
LedgerRow = tuple[int, str, str, int, str, float, str]
_Result = TypeVar("_Result")

_COLUMNS = {
    "lease_owner": "TEXT",
    "lease_until": "REAL",
    "queue_pos": "INTEGER",
    "wire": "BLOB",
    "token": "TEXT",
}
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS receipts_ready ON receipts (login, queue_pos)"
    " WHERE lease_owner IS NULL",
    "CREATE INDEX IF NOT EXISTS receipts_owner ON receipts (lease_owner)"
    " WHERE lease_owner IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS receipts_lease_until ON receipts (lease_until)"
    " WHERE lease_until IS NOT NULL",
)


class SharedStore:
    """One node's connections to a store file shared with other nodes."""

    def __init__(self, path: str, signer: TokenSigner) -> None:
        self.path = path
        self.signer = signer
        # Lease owners are "<node>:<holder>", so a node's leases are told apart from others'.
        self.node = uuid.uuid4().hex[:12]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fakegw-shared")
        self._conn: sqlite3.Connection | None = None
        # Read-only probes (data_version, counts, ledger pages) on the event loop thread: WAL
        # readers never wait for writers, and these are single indexed reads.
        self._reader: sqlite3.Connection | None = None
        self._data_version = -1

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        """Add the shared-mode columns and indexes (idempotent) and open both connections."""
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            present = {row[1] for row in conn.execute("PRAGMA table_info(receipts)")}
            for name, kind in _COLUMNS.items():
                if name not in present:
                    conn.execute(f"ALTER TABLE receipts ADD COLUMN {name} {kind}")
            for statement in _INDEXES:
                conn.execute(statement)
            # Rows written by a non-shared process have no position yet: their seq is their place.
            conn.execute("UPDATE receipts SET queue_pos = seq WHERE queue_pos IS NULL")
            (top,) = conn.execute(
                "SELECT MAX(m) FROM (SELECT MAX(seq) AS m FROM receipts UNION ALL"
                " SELECT MAX(queue_pos) FROM receipts UNION ALL SELECT MAX(seq) FROM ledger)"
            ).fetchone()
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('next_seq', ?)", ((top or 0) + 1,)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._conn = conn
        reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        reader.execute("PRAGMA busy_timeout=10000")
        self._reader = reader
        self._data_version = self._read_data_version()

    def close(self) -> None:
        """Close both connections and the thread (call after the last operation finished)."""
        self._executor.shutdown(wait=True)
        for conn in (self._conn, self._reader):
            if conn is not None:
                conn.close()
        self._conn = self._reader = None

    # -- the operations, each one transaction on the store thread --------------------------
    async def _on_store_thread(self, operation: Callable[[], _Result]) -> _Result:
        """Run one operation on the store thread (one connection, one at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, operation)

    def add_ledger(self, rows: list[tuple[str, str, int, str, float, str]]) -> None:
        """Append ledger rows (kind, login, seq, token, at, fields JSON) on the store thread,
        behind the operations already queued there; a failure is logged, not raised."""
        self._executor.submit(self._add_ledger, rows).add_done_callback(_log_failure)

    def _add_ledger(self, rows: list[tuple[str, str, int, str, float, str]]) -> None:
        conn = self._transaction()
        try:
            conn.executemany(
                "INSERT INTO ledger (kind, login, seq, token, at, fields)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def enqueue(
        self, login: str, all_fields: list[ReceiptFields], cap: int, now: float
    ) -> tuple[int, int]:
        """Append receipts for `login` below the cap (F15); returns (enqueued, dropped)."""
        return await self._on_store_thread(partial(self._enqueue, login, all_fields, cap, now))

    async def lease(
        self, login: str, owner: str, limit: int, window: int | None, lease_until: float
    ) -> list[LeasedRow]:
        """Atomically lease up to `limit` waiting receipts to `owner`, in hand-out order.

        With a `window` (Subscribe, F11) the owner's receipts still leased count against it,
        wherever they were acked. Each leased receipt gets `delivery_count + 1` (F6).
        """
        return await self._on_store_thread(
            partial(self._lease, login, owner, limit, window, lease_until)
        )

    def release_soon(self, owner: str) -> asyncio.Future[dict[str, int]]:
        """F7: queue the release of `owner`'s leases on the store thread, without awaiting.

        Every receipt leased to `owner` waits again, behind newer receipts (F13); the future
        tells how many per login. Queued, not awaited, so a cancelled stream cannot skip it.
        """
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._release, owner)

    async def ack(self, login: str, tokens: list[str], now: float) -> tuple[list[bool], int]:
        """F9: remove the receipts these tokens name; per token True = acked, False = gone.

        Also returns how many tokens were malformed, forged or another login's (FD3).
        """
        return await self._on_store_thread(partial(self._ack, login, tokens, now))

    async def expire(self, now: float) -> dict[str, int]:
        """F6: receipts whose lease ran out (on any node, dead or alive) wait again."""
        return await self._on_store_thread(partial(self._expire, now))

    async def expire_retention(self, cutoff: float) -> dict[str, int]:
        """F16: remove unread (not leased) receipts enqueued before `cutoff`; per login."""
        return await self._on_store_thread(partial(self._expire_retention, cutoff))

    # -- change detection -----------------------------------------------------------------
    def _read_data_version(self) -> int:
        assert self._reader is not None
        (version,) = self._reader.execute("PRAGMA data_version").fetchone()
        return int(version)

    def changed_elsewhere(self) -> bool:
        """True once per commit made by another connection (another node or our writer)."""
        version = self._read_data_version()
        if version == self._data_version:
            return False
        self._data_version = version
        return True

    # -- the transactions themselves (on the store thread) ---------------------------------
    def _transaction(self) -> sqlite3.Connection:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        return conn

    @staticmethod
    def _allocate(conn: sqlite3.Connection, count: int) -> int:
        """Reserve `count` numbers from the one counter behind seqs and queue positions."""
        (first,) = conn.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
        conn.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (first + count,))
        return int(first)

    def _enqueue(
        self, login: str, all_fields: list[ReceiptFields], cap: int, now: float
    ) -> tuple[int, int]:
        conn = self._transaction()
        try:
            (total,) = conn.execute(
                "SELECT COUNT(*) FROM receipts WHERE login = ?", (login,)
            ).fetchone()
            room = max(0, cap - total)
            accepted = all_fields[:room]
            first = self._allocate(conn, len(accepted)) if accepted else 0
            rows = []
            ledger = []
            for offset, fields in enumerate(accepted):
                seq = first + offset
                token = self.signer.issue(login, seq)
                fields_json = dumps(fields)
                rows.append((seq, login, fields_json, now, seq, encode_fields(fields), token))
                ledger.append(("enqueue", login, seq, token, now, fields_json))
            conn.executemany(
                "INSERT INTO receipts (seq, login, fields, enqueued_at, delivery_count,"
                " queue_pos, wire, token) VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                rows,
            )
            conn.executemany(
                "INSERT INTO ledger (kind, login, seq, token, at, fields)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                ledger,
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(accepted), len(all_fields) - len(accepted)

    def _lease(
        self, login: str, owner: str, limit: int, window: int | None, lease_until: float
    ) -> list[LeasedRow]:
        conn = self._transaction()
        try:
            if window is not None:
                (held,) = conn.execute(
                    "SELECT COUNT(*) FROM receipts WHERE lease_owner = ?", (owner,)
                ).fetchone()
                limit = min(limit, window - held)
            rows: list[tuple[int, int, bytes | None, str | None, int, str]] = []
            if limit > 0:
                rows = conn.execute(
                    "UPDATE receipts SET lease_owner = ?, lease_until = ?,"
                    " delivery_count = delivery_count + 1"
                    " WHERE seq IN (SELECT seq FROM receipts WHERE login = ?"
                    " AND lease_owner IS NULL ORDER BY queue_pos LIMIT ?)"
                    " RETURNING seq, delivery_count, wire, token, queue_pos, fields",
                    (owner, lease_until, login, limit),
                ).fetchall()
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        rows.sort(key=lambda row: row[4])
        leased: list[LeasedRow] = []
        for seq, count, wire, token, position, fields_json in rows:
            if wire is None or token is None:  # a row written by a non-shared process
                wire = encode_fields(json.loads(fields_json))
                token = self.signer.issue(login, seq)
            leased.append((seq, count, wire, token, position))
        return leased

    def _release(self, owner: str) -> dict[str, int]:
        return self._requeue("lease_owner = ?", (owner,))

    def _expire(self, now: float) -> dict[str, int]:
        assert self._conn is not None
        if (
            self._conn.execute(
                "SELECT 1 FROM receipts WHERE lease_until < ? LIMIT 1", (now,)
            ).fetchone()
            is None
        ):
            return {}
        return self._requeue("lease_until < ?", (now,))

    def _requeue(self, where: str, params: tuple[str | float, ...]) -> dict[str, int]:
        conn = self._transaction()
        counts: dict[str, int] = {}
        try:
            seqs = []
            for seq, login in conn.execute(
                f"SELECT seq, login FROM receipts WHERE {where} ORDER BY queue_pos", params
            ):
                seqs.append(seq)
                counts[login] = counts.get(login, 0) + 1
            if seqs:
                first = self._allocate(conn, len(seqs))
                conn.executemany(
                    "UPDATE receipts SET lease_owner = NULL, lease_until = NULL, queue_pos = ?"
                    " WHERE seq = ?",
                    [(first + offset, seq) for offset, seq in enumerate(seqs)],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return counts

    def _ack(self, login: str, tokens: list[str], now: float) -> tuple[list[bool], int]:
        verify = self.signer.verify
        seqs = [verify(login, token) for token in tokens]
        invalid = seqs.count(None)
        wanted = [seq for seq in seqs if seq is not None]
        removed: dict[int, tuple[str, str]] = {}
        if wanted:
            conn = self._transaction()
            try:
                for seq, token, fields_json in conn.execute(
                    "DELETE FROM receipts WHERE login = ? AND seq IN"
                    " (SELECT value FROM json_each(?)) RETURNING seq, token, fields",
                    (login, json.dumps(wanted)),
                ).fetchall():
                    removed[seq] = (token or self.signer.issue(login, seq), fields_json)
                conn.executemany(
                    "INSERT INTO ledger (kind, login, seq, token, at, fields)"
                    " VALUES ('ack', ?, ?, ?, ?, ?)",
                    [(login, seq, token, now, fields) for seq, (token, fields) in removed.items()],
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        # A token repeated within one Ack is acked once; the repeat is already gone.
        outcome = [seq is not None and removed.pop(seq, None) is not None for seq in seqs]
        return outcome, invalid

    def _expire_retention(self, cutoff: float) -> dict[str, int]:
        assert self._conn is not None
        if (
            self._conn.execute(
                "SELECT 1 FROM receipts WHERE enqueued_at < ? AND lease_owner IS NULL LIMIT 1",
                (cutoff,),
            ).fetchone()
            is None
        ):
            return {}
        conn = self._transaction()
        try:
            removed: dict[str, int] = {}
            for (login,) in conn.execute(
                "DELETE FROM receipts WHERE enqueued_at < ? AND lease_owner IS NULL"
                " RETURNING login",
                (cutoff,),
            ).fetchall():
                removed[login] = removed.get(login, 0) + 1
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return removed

    # -- reads on the caller's thread -----------------------------------------------------
    def sizes(self, login: str) -> tuple[int, int]:
        """(waiting, leased) receipts of `login`, across all nodes."""
        assert self._reader is not None
        total, leased = self._reader.execute(
            "SELECT COUNT(*), COUNT(lease_owner) FROM receipts WHERE login = ?", (login,)
        ).fetchone()
        return int(total) - int(leased), int(leased)

    def ledger_page(self, login: str | None, after: int, limit: int) -> list[LedgerRow]:
        """Ledger rows of every node with id > `after` (of `login`, or all), oldest first."""
        assert self._reader is not None
        if login is None:
            cursor = self._reader.execute(
                "SELECT id, kind, login, seq, token, at, fields FROM ledger WHERE id > ?"
                " ORDER BY id LIMIT ?",
                (after, limit),
            )
        else:
            cursor = self._reader.execute(
                "SELECT id, kind, login, seq, token, at, fields FROM ledger"
                " WHERE id > ? AND login = ? ORDER BY id LIMIT ?",
                (after, login, limit),
            )
        return cursor.fetchall()

    def first_ledger_id(self) -> int:
        """The oldest ledger id in the store (1 when empty)."""
        assert self._reader is not None
        (first,) = self._reader.execute("SELECT MIN(id) FROM ledger").fetchone()
        return int(first or 1)


def _log_failure(done: Future[None]) -> None:
    if done.exception() is not None:
        log.error("ledger_write_failed", exc_info=done.exception())
