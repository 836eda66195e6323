"""The default backend: this process owns its logins' queues in memory (fakegw.queue).

Every change is recorded in a journal (fakegw.persistence): a SQLite file the next start reads
back (F1), or nothing at all for `--store :memory:`. Enqueue and Ack answer only once their
changes are written; a Pull's delivery counts are written before its receipts leave (F6 after
`kill -9`), a stream's soon after.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from fakegw.backend import (
    AckResult,
    Deliveries,
    EnqueueResult,
    LedgerPage,
    LedgerRecord,
    SweepCounts,
)
from fakegw.persistence import Journal, LoadedState
from fakegw.queue import Entry, Holder, LoginQueue
from fakegw.tokens import TokenSigner
from fakegw.wire import ReceiptFields, delivery_bytes, encode_fields, token_field

_NOTHING = Deliveries((), 0)


class MemoryReader:
    """One Subscribe stream's hold on a queue, or the hold all Pulls of a login share."""

    __slots__ = ("_durable_before_handing_out", "_holder", "_journal", "_queue")

    def __init__(self, queue: LoginQueue, holder: Holder, journal: Journal, *, pull: bool) -> None:
        self._queue = queue
        self._holder = holder
        self._journal = journal
        # A Pull answers once; a stream keeps going, and its counts are written meanwhile.
        self._durable_before_handing_out = pull

    async def take(self, limit: int, window: int | None, now: float) -> Deliveries:
        """Lease up to `limit` waiting receipts (F6), at most `window` unacked (F11)."""
        queue = self._queue
        if window is not None:
            limit = min(limit, window - len(self._holder.held))
        if limit <= 0 or not queue.ready:
            return _NOTHING
        batch = queue.take(limit, self._holder, now)
        if not batch:
            return _NOTHING
        # delivery_count survives a restart, so a redelivery after kill -9 still counts up.
        self._journal.record_deliveries(batch)
        if self._durable_before_handing_out:
            await self._journal.commit()
        else:
            self._journal.mark_dirty()
        return Deliveries(
            [delivery_bytes(e.base, e.token_bytes, e.delivery_count) for e in batch],
            sum(1 for e in batch if e.delivery_count > 1),
        )

    def release(self, on_released: Callable[[int], None]) -> None:
        """F7: the stream ended; its unacked receipts wait again at once, behind newer ones."""
        on_released(self._queue.release(self._holder))


class MemoryBackend:
    """Queues, leases, acks and the ledger of this process's logins, held in memory."""

    def __init__(
        self,
        logins: Sequence[str],
        journal: Journal,
        state: LoadedState,
        signer: TokenSigner,
        *,
        lease_seconds: float,
        cap: int,
        ledger_max_records: int,
    ) -> None:
        self._journal = journal
        self._signer = signer
        self._queues = {login: LoginQueue(login, lease_seconds, cap) for login in logins}
        self._ledger: list[LedgerRecord] = []
        # A long demo would otherwise hold every receipt ever seen; 0 keeps everything.
        self._ledger_max_records = ledger_max_records
        self._ledger_dropped = 0  # records trimmed from memory; ids stay stable
        self._next_seq = self._restore(state) + 1

    def _restore(self, state: LoadedState) -> int:
        """Load the journal's receipts (all waiting: F7, a restart releases) and ledger.

        Returns the highest sequence number in use.
        """
        max_seq = 0
        by_login: dict[str, list[Entry]] = {}
        for seq, login, fields_json, enqueued_at, delivery_count in state.receipts:
            max_seq = max(max_seq, seq)
            if login not in self._queues:
                continue  # a login no longer configured keeps its rows, unserved
            fields: ReceiptFields = json.loads(fields_json)
            token = self._signer.issue(login, seq)
            entry = Entry(
                seq,
                fields,
                encode_fields(fields),
                token,
                token_field(token),
                enqueued_at,
                delivery_count,
            )
            by_login.setdefault(login, []).append(entry)
        for login, entries in by_login.items():
            self._queues[login].restore(entries)
        for ledger_id, kind, login, seq, token, at, fields_json in state.ledger:
            max_seq = max(max_seq, seq)
            if not self._ledger:
                self._ledger_dropped = ledger_id - 1
            self._ledger.append(
                LedgerRecord(ledger_id, kind, login, seq, token, at, json.loads(fields_json))
            )
        self._trim_ledger()
        return max_seq

    async def start(self) -> None:
        """Nothing to open: the journal is the gateway's, started before the first RPC."""

    async def close(self) -> None:
        """Nothing to close: the gateway closes the journal after the last change."""

    def reader(self, login: str, *, pull: bool) -> MemoryReader:
        """A new stream's reader, or (`pull=True`) one holding for all of the login's Pulls."""
        queue = self._queues[login]
        holder = queue.pull_holder if pull else Holder()
        return MemoryReader(queue, holder, self._journal, pull=pull)

    async def enqueue(
        self, login: str, receipts: Sequence[ReceiptFields], now: float
    ) -> EnqueueResult:
        """Append receipts below the cap (F15); written to the journal before returning."""
        queue = self._queues[login]
        signer = self._signer
        added: list[Entry] = []
        for fields in receipts:
            if not queue.has_room():
                break  # F15: at the cap the rest is dropped, the old unread receipts kept
            seq = self._next_seq
            self._next_seq = seq + 1
            token = signer.issue(login, seq)
            entry = Entry(seq, fields, encode_fields(fields), token, token_field(token), now, 0)
            queue.add(entry)
            added.append(entry)
        if added:
            self._journal.record_enqueued(login, added)
            self._append_ledger("enqueue", login, added, now)
        await self._journal.commit()
        return EnqueueResult(len(added), len(receipts) - len(added))

    async def ack(self, login: str, tokens: Sequence[str], now: float) -> AckResult:
        """F9: remove each token's receipt; already_gone for gone, foreign, forged (FD3)."""
        # Tokens are HMAC-signed and deterministic, (key, login, seq) -> token, so the live
        # tokens of a login are rebuilt from the journal after a restart; acking is then one
        # dict lookup per token, and a foreign, forged or spent token is simply not found.
        remove = self._queues[login].remove_by_token
        outcome: list[bool] = []
        removed: list[Entry] = []
        invalid = 0
        for token in tokens:
            entry = remove(token)
            if entry is None:
                outcome.append(False)
                if self._signer.verify(login, token) is None:
                    invalid += 1
            else:
                outcome.append(True)
                removed.append(entry)
        if removed:
            self._append_ledger("ack", login, removed, now)
            self._journal.record_removed(entry.seq for entry in removed)
            await self._journal.commit()
        return AckResult(outcome, invalid)

    async def sweep(self, now: float, retention_cutoff: float) -> dict[str, SweepCounts]:
        """Expire leases (F6) and remove unread receipts older than the cutoff (F16)."""
        counts: dict[str, SweepCounts] = {}
        for login, queue in self._queues.items():
            expired = queue.expire_leases(now)
            removed = queue.expire_retention(retention_cutoff)
            if removed:
                self._journal.record_removed(entry.seq for entry in removed)
            if expired or removed:
                counts[login] = SweepCounts(expired, len(removed))
        self._journal.mark_dirty()
        return counts

    def sizes(self, login: str) -> tuple[int, int]:
        """(waiting, leased) receipts of `login`."""
        return self._queues[login].sizes()

    def ledger(self, login: str | None, after: int, limit: int) -> LedgerPage:
        """Ledger records with id > `after` (of `login`, or all), at most `limit`."""
        records: list[LedgerRecord] = []
        last = after
        for record in self._ledger[max(after - self._ledger_dropped, 0) :]:
            last = record.id
            if login is not None and record.login != login:
                continue
            records.append(record)
            if len(records) >= limit:
                break
        return LedgerPage(records, last, self._ledger_dropped + 1)

    def record_callbacks(
        self, kind: str, login: str, callbacks: Sequence[tuple[str, ReceiptFields]], now: float
    ) -> None:
        """Ledger records of callbacks; journaled with the next commit, as the others."""
        self._add_ledger_records([(kind, login, 0, key, now, fields) for key, fields in callbacks])

    def _append_ledger(self, kind: str, login: str, entries: Sequence[Entry], at: float) -> None:
        self._add_ledger_records(
            [(kind, login, entry.seq, entry.token, at, entry.fields) for entry in entries]
        )

    def _add_ledger_records(
        self, rows: Sequence[tuple[str, str, int, str, float, ReceiptFields]]
    ) -> None:
        first = self._ledger_dropped + len(self._ledger) + 1
        records = [LedgerRecord(first + offset, *row) for offset, row in enumerate(rows)]
        self._ledger.extend(records)
        self._journal.record_ledger(records)
        if self._ledger_max_records and len(self._ledger) > self._ledger_max_records * 11 // 10:
            self._trim_ledger()

    def _trim_ledger(self) -> None:
        excess = len(self._ledger) - self._ledger_max_records
        if self._ledger_max_records and excess > 0:
            del self._ledger[:excess]
            self._ledger_dropped += excess
