"""The `--shared-store` backend: the feed's interface over one SQLite file many nodes share.

The SQL is in fakegw.shared; this module turns its rows into deliveries and its per-login
counts into the gateway's counters, names each reader's leases, and wakes this node's waiting
readers when another node committed (F10, F11).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable, Sequence

from fakegw.backend import (
    AckResult,
    Deliveries,
    EnqueueResult,
    LedgerPage,
    LedgerRecord,
    SweepCounts,
)
from fakegw.shared import LedgerRow, SharedStore
from fakegw.tokens import TokenSigner
from fakegw.wire import ReceiptFields, delivery_bytes, token_field

_NOTHING = Deliveries((), 0)


class SharedReader:
    """One Subscribe stream, or this node's Pulls: a lease owner in the shared store."""

    __slots__ = ("_lease_seconds", "_login", "_owner", "_store")

    def __init__(self, store: SharedStore, login: str, owner: str, lease_seconds: float) -> None:
        self._store = store
        self._login = login
        self._owner = owner
        self._lease_seconds = lease_seconds

    async def take(self, limit: int, window: int | None, now: float) -> Deliveries:
        """Lease up to `limit` receipts in one atomic UPDATE (F12), at most `window` (F11).

        The window counts this owner's leases in the store, so an ack at any node (or a lease
        running out) reopens it. Delivery counts are committed before the receipts leave (F6).
        """
        rows = await self._store.lease(
            self._login, self._owner, limit, window, now + self._lease_seconds
        )
        if not rows:
            return _NOTHING
        return Deliveries(
            [delivery_bytes(wire, token_field(token), count) for _, count, wire, token, _ in rows],
            sum(1 for row in rows if row[1] > 1),
        )

    def release(self, on_released: Callable[[int], None]) -> None:
        """F7: a stream that ends releases its unacked receipts at once, for every node."""
        login = self._login

        def released(done: asyncio.Future[dict[str, int]]) -> None:
            if not done.cancelled() and done.exception() is None:
                on_released(done.result().get(login, 0))

        self._store.release_soon(self._owner).add_done_callback(released)


class SharedBackend:
    """Queues, leases, acks and the ledger in a store file that other nodes serve too."""

    def __init__(
        self,
        path: str,
        signer: TokenSigner,
        *,
        lease_seconds: float,
        cap: int,
        poll_seconds: float,
        on_change_elsewhere: Callable[[], None],
    ) -> None:
        self._store = SharedStore(path, signer)
        self._lease_seconds = lease_seconds
        self._cap = cap
        self._poll_seconds = poll_seconds
        self._on_change_elsewhere = on_change_elsewhere
        self._stream_numbers = 0
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the store (adding the shared columns) and start watching other nodes."""
        self._store.open()
        self._watcher = asyncio.create_task(self._watch(), name="fakegw-shared-watch")

    async def close(self) -> None:
        """Stop watching, then close the store after the stream releases queued on it (F7)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        self._store.close()

    async def _watch(self) -> None:
        """Wake this node's waiting readers when another connection committed (F10, F11)."""
        while True:
            await asyncio.sleep(self._poll_seconds)
            if self._store.changed_elsewhere():
                self._on_change_elsewhere()

    def reader(self, login: str, *, pull: bool) -> SharedReader:
        """A lease owner named "<node>:s<n>" per stream, "<node>:pull" for this node's Pulls."""
        if pull:
            owner = f"{self._store.node}:pull"
        else:
            self._stream_numbers += 1
            owner = f"{self._store.node}:s{self._stream_numbers}"
        return SharedReader(self._store, login, owner, self._lease_seconds)

    async def enqueue(
        self, login: str, receipts: Sequence[ReceiptFields], now: float
    ) -> EnqueueResult:
        """Append receipts below the cap (F15), counted across every node, in one transaction."""
        enqueued, dropped = await self._store.enqueue(login, list(receipts), self._cap, now)
        return EnqueueResult(enqueued, dropped)

    async def ack(self, login: str, tokens: Sequence[str], now: float) -> AckResult:
        """F9: one DELETE ... RETURNING; a token of a receipt acked at any node, of another
        login, malformed or forged names no row and is already_gone (FD3)."""
        outcome, invalid = await self._store.ack(login, list(tokens), now)
        return AckResult(outcome, invalid)

    async def sweep(self, now: float, retention_cutoff: float) -> dict[str, SweepCounts]:
        """Expire leases of any node, dead or alive (F6); apply retention (F16)."""
        expired = await self._store.expire(now)
        removed = await self._store.expire_retention(retention_cutoff)
        return {
            login: SweepCounts(expired.get(login, 0), removed.get(login, 0))
            for login in expired.keys() | removed.keys()
        }

    def sizes(self, login: str) -> tuple[int, int]:
        """(waiting, leased) receipts of `login`, across all nodes."""
        return self._store.sizes(login)

    def record_callbacks(
        self, kind: str, login: str, callbacks: Sequence[tuple[str, ReceiptFields]], now: float
    ) -> None:
        """Ledger records of this node's callbacks, in the file every node reads."""
        self._store.add_ledger(
            [(kind, login, 0, key, now, json.dumps(fields)) for key, fields in callbacks]
        )

    def ledger(self, login: str | None, after: int, limit: int) -> LedgerPage:
        """Ledger records of every node with id > `after` (of `login`, or all)."""
        records = list(_ledger_records(self._store.ledger_page(login, after, limit)))
        last = records[-1].id if records else after
        return LedgerPage(records, last, self._store.first_ledger_id())


def _ledger_records(rows: Iterable[LedgerRow]) -> Iterable[LedgerRecord]:
    for ledger_id, kind, login, seq, token, at, fields_json in rows:
        yield LedgerRecord(ledger_id, kind, login, seq, token, at, json.loads(fields_json))
