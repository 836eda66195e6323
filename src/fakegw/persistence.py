"""Write-through persistence for fakegw: SQLite in WAL mode, written in batches off the loop.

The live queue is an in-memory index (fakegw.queue); this module makes it durable (F1). Every
change is recorded in a pending batch; one writer task commits all pending changes in a single
SQLite transaction on a dedicated thread, so per-receipt cost is one tuple append, and a burst
of N changes costs one commit. Calls that must be durable before they answer (Inject, Ack)
await `commit()`. With `synchronous=NORMAL` in WAL mode a committed change survives `kill -9`
of the process (not a power cut, which a test fake does not need).

Pending callbacks (fakegw.callbacks) are journaled the same way: recorded when they are made,
their attempt count and next due time at each retry, and deleted once they are done, so a
restarted fakegw resumes them.

`:memory:` uses `NullPersistence`, the same interface doing nothing, for benchmarks: callers
record every change unconditionally and never ask whether the store is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from fakegw.backend import LedgerRecord
from fakegw.callbacks import Callback
from fakegw.queue import Entry
from fakegw.sending import SentMessage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY,
    login TEXT NOT NULL,
    fields TEXT NOT NULL,
    enqueued_at REAL NOT NULL,
    delivery_count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    login TEXT NOT NULL,
    seq INTEGER NOT NULL,
    token TEXT NOT NULL,
    at REAL NOT NULL,
    fields TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sent (
    login TEXT NOT NULL,
    message_id TEXT NOT NULL,
    message TEXT NOT NULL,
    sent_at REAL NOT NULL,
    resolved INTEGER NOT NULL,
    PRIMARY KEY (login, message_id)
);
CREATE TABLE IF NOT EXISTS callbacks (
    key TEXT PRIMARY KEY,
    login TEXT NOT NULL,
    url TEXT NOT NULL,
    fields TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    due_at REAL NOT NULL
);
"""


@dataclass
class LoadedState:
    """Everything a starting fakegw reads back from its store."""

    hmac_key: bytes
    receipts: list[tuple[int, str, str, float, int]] = field(default_factory=list)
    ledger: list[tuple[int, str, str, int, str, float, str]] = field(default_factory=list)
    sent: list[tuple[str, str, str, float, int]] = field(default_factory=list)
    callbacks: list[tuple[str, str, str, str, int, float]] = field(default_factory=list)


@dataclass
class PendingChanges:
    """One batch of changes waiting for the writer."""

    receipts_insert: list[tuple[int, str, str, float, int]] = field(default_factory=list)
    receipts_delete: list[tuple[int]] = field(default_factory=list)
    delivery_counts: list[tuple[int, int]] = field(default_factory=list)
    ledger_insert: list[tuple[int, str, str, int, str, float, str]] = field(default_factory=list)
    sent_upsert: list[tuple[str, str, str, float, int]] = field(default_factory=list)
    sent_resolve: list[tuple[str, str]] = field(default_factory=list)
    callbacks_insert: list[tuple[str, str, str, str, int, float]] = field(default_factory=list)
    callbacks_update: list[tuple[int, float, str]] = field(default_factory=list)
    callbacks_delete: list[tuple[str]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.receipts_insert
            or self.receipts_delete
            or self.delivery_counts
            or self.ledger_insert
            or self.sent_upsert
            or self.sent_resolve
            or self.callbacks_insert
            or self.callbacks_update
            or self.callbacks_delete
        )


def dumps(value: Any) -> str:
    """Compact JSON as stored in the database and the ledger."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Journal(Protocol):
    """Where the in-memory queues write their changes: a SQLite file, or nowhere."""

    def load(self) -> LoadedState:
        """Read back the state a starting fakegw serves from."""
        ...

    async def start(self) -> None:
        """Start writing (after `load`)."""
        ...

    async def close(self) -> None:
        """Write everything recorded and close."""
        ...

    def record_enqueued(self, login: str, entries: Iterable[Entry]) -> None:
        """New receipts in the queue (F1)."""
        ...

    def record_deliveries(self, entries: Iterable[Entry]) -> None:
        """Delivery counts, so a redelivery after a restart still counts up (F6)."""
        ...

    def record_removed(self, seqs: Iterable[int]) -> None:
        """Receipts that left the queue: acked (F5) or removed by retention (F16)."""
        ...

    def record_ledger(self, records: Iterable[LedgerRecord]) -> None:
        """Ledger records, so the ledger survives a restart."""
        ...

    def record_sent(self, message: SentMessage) -> None:
        """A registered sent message (F2, F3)."""
        ...

    def record_resolved(self, login: str, message_id: str) -> None:
        """A sent message that had its result, or its deadline receipt (F3)."""
        ...

    def record_callbacks(self, callbacks: Iterable[Callback]) -> None:
        """New callbacks waiting for their first POST (F2: the webhook wins)."""
        ...

    def record_callback_retry(self, callback: Callback) -> None:
        """A callback's attempt count and next due time after a failed attempt."""
        ...

    def record_callback_done(self, key: str) -> None:
        """A callback delivered, refused or given up: it is not resumed after a restart."""
        ...

    def mark_dirty(self) -> None:
        """Write what was recorded soon, without waiting for it."""
        ...

    async def commit(self) -> None:
        """Return once everything recorded so far is written."""
        ...


class NullPersistence:
    """`--store :memory:`: keeps nothing, commits instantly."""

    def load(self) -> LoadedState:
        """A fresh state with a new token key: nothing survives this process."""
        return LoadedState(hmac_key=os.urandom(32))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def record_enqueued(self, login: str, entries: Iterable[Entry]) -> None:
        return None

    def record_deliveries(self, entries: Iterable[Entry]) -> None:
        return None

    def record_removed(self, seqs: Iterable[int]) -> None:
        return None

    def record_ledger(self, records: Iterable[LedgerRecord]) -> None:
        return None

    def record_sent(self, message: SentMessage) -> None:
        return None

    def record_resolved(self, login: str, message_id: str) -> None:
        return None

    def record_callbacks(self, callbacks: Iterable[Callback]) -> None:
        return None

    def record_callback_retry(self, callback: Callback) -> None:
        return None

    def record_callback_done(self, key: str) -> None:
        return None

    def mark_dirty(self) -> None:
        return None

    async def commit(self) -> None:
        return None


class SqlitePersistence:
    """A SQLite file (WAL) written in batches by one writer task on one dedicated thread."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fakegw-sqlite")
        self._conn: sqlite3.Connection | None = None
        self.pending = PendingChanges()
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    def load(self) -> LoadedState:
        """Open (creating if needed) the store and read its state; runs before serving."""
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.executescript(_SCHEMA)
        # F9: the HMAC key is created once and shared by every process opening this store.
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('hmac_key', ?)", (os.urandom(32),)
        )
        (key,) = conn.execute("SELECT value FROM meta WHERE key = 'hmac_key'").fetchone()
        state = LoadedState(hmac_key=bytes(key))
        state.receipts = conn.execute(
            "SELECT seq, login, fields, enqueued_at, delivery_count FROM receipts ORDER BY seq"
        ).fetchall()
        state.ledger = conn.execute(
            "SELECT id, kind, login, seq, token, at, fields FROM ledger ORDER BY id"
        ).fetchall()
        state.sent = conn.execute(
            "SELECT login, message_id, message, sent_at, resolved FROM sent ORDER BY sent_at"
        ).fetchall()
        state.callbacks = conn.execute(
            "SELECT key, login, url, fields, attempts, due_at FROM callbacks ORDER BY rowid"
        ).fetchall()
        self._conn = conn
        return state

    async def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="fakegw-sqlite-writer")

    def record_enqueued(self, login: str, entries: Iterable[Entry]) -> None:
        """New receipts in the queue (F1)."""
        self.pending.receipts_insert.extend(
            (e.seq, login, dumps(e.fields), e.enqueued_at, e.delivery_count) for e in entries
        )

    def record_deliveries(self, entries: Iterable[Entry]) -> None:
        """Delivery counts, so a redelivery after `kill -9` still counts up (F6)."""
        self.pending.delivery_counts.extend((e.delivery_count, e.seq) for e in entries)

    def record_removed(self, seqs: Iterable[int]) -> None:
        """Receipts that left the queue: acked (F5) or removed by retention (F16)."""
        self.pending.receipts_delete.extend((seq,) for seq in seqs)

    def record_ledger(self, records: Iterable[LedgerRecord]) -> None:
        """Ledger records, so the ledger survives a restart."""
        self.pending.ledger_insert.extend(
            (r.id, r.kind, r.login, r.seq, r.token, r.at, dumps(r.receipt)) for r in records
        )

    def record_sent(self, message: SentMessage) -> None:
        """A registered sent message (F2, F3)."""
        self.pending.sent_upsert.append(
            (
                message.login,
                message.message_id,
                dumps(message.to_json()),
                message.sent_at,
                int(message.resolved),
            )
        )

    def record_resolved(self, login: str, message_id: str) -> None:
        """A sent message that had its result, or its deadline receipt (F3)."""
        self.pending.sent_resolve.append((login, message_id))

    def record_callbacks(self, callbacks: Iterable[Callback]) -> None:
        """New callbacks waiting for their first POST (F2: the webhook wins)."""
        self.pending.callbacks_insert.extend(
            (c.key, c.login, c.url, dumps(c.fields), c.attempts, c.due_at) for c in callbacks
        )

    def record_callback_retry(self, callback: Callback) -> None:
        """A callback's attempt count and next due time after a failed attempt."""
        self.pending.callbacks_update.append((callback.attempts, callback.due_at, callback.key))

    def record_callback_done(self, key: str) -> None:
        """A callback delivered, refused or given up: it is not resumed after a restart."""
        self.pending.callbacks_delete.append((key,))

    def mark_dirty(self) -> None:
        """Tell the writer there are pending changes (it batches whatever piles up meanwhile)."""
        self._wake.set()

    async def commit(self) -> None:
        """Return once everything pending at the time of the call is committed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._wake.set()
        await future

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self.pending = self.pending, PendingChanges()
            waiters, self._waiters = self._waiters, []
            try:
                if not batch.empty():
                    await loop.run_in_executor(self._executor, self._write, batch)
            except BaseException as exc:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc if isinstance(exc, Exception) else RuntimeError())
                raise
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            if self._closing and self.pending.empty() and not self._waiters:
                return

    def _write(self, batch: PendingChanges) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT OR REPLACE INTO receipts (seq, login, fields, enqueued_at, delivery_count)"
                " VALUES (?, ?, ?, ?, ?)",
                batch.receipts_insert,
            )
            conn.executemany(
                "UPDATE receipts SET delivery_count = ? WHERE seq = ?", batch.delivery_counts
            )
            conn.executemany("DELETE FROM receipts WHERE seq = ?", batch.receipts_delete)
            conn.executemany(
                "INSERT INTO ledger (id, kind, login, seq, token, at, fields)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                batch.ledger_insert,
            )
            conn.executemany(
                "INSERT OR REPLACE INTO sent (login, message_id, message, sent_at, resolved)"
                " VALUES (?, ?, ?, ?, ?)",
                batch.sent_upsert,
            )
            conn.executemany(
                "UPDATE sent SET resolved = 1 WHERE login = ? AND message_id = ?",
                batch.sent_resolve,
            )
            # In this order: a callback made and done within one batch leaves no row.
            conn.executemany(
                "INSERT INTO callbacks (key, login, url, fields, attempts, due_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                batch.callbacks_insert,
            )
            conn.executemany(
                "UPDATE callbacks SET attempts = ?, due_at = ? WHERE key = ?",
                batch.callbacks_update,
            )
            conn.executemany("DELETE FROM callbacks WHERE key = ?", batch.callbacks_delete)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        """Flush everything pending, stop the writer and close the file."""
        if self._writer is not None and not self._writer.done():
            await self.commit()
            self._closing = True
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)
