"""The interface the feed's RPCs are written against, once, whatever holds the queues.

`FakeGateway` implements Subscribe, Pull and Ack a single time over a `FeedBackend`:
- `fakegw.memory_backend.MemoryBackend`: this process owns the queues in memory, and a journal
  (SQLite, or nothing for `:memory:`) makes them durable;
- `fakegw.shared_backend.SharedBackend` (`--shared-store`): a SQLite file shared by several
  processes owns queues, leases and acks, so those processes act as one gateway.

The backend hands out complete serialized `Receipt`s (fakegw.wire), keeps its ledger, and
reports what it did to each login's `LoginActivity` (counters, wake-ups).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from fakegw.wire import ReceiptFields


class EnqueueResult(NamedTuple):
    """How many receipts one enqueue queued, and how many the cap dropped (F15)."""

    enqueued: int
    dropped_at_cap: int


class AckResult(NamedTuple):
    """Per token True = acked, False = already_gone (F9); and how many were not valid (FD3)."""

    acked: list[bool]
    invalid_tokens: int


class Deliveries(NamedTuple):
    """Receipts handed to one reader: serialized `Receipt`s, and how many were redeliveries."""

    receipts: Sequence[bytes]
    redelivered: int


@dataclass(frozen=True)
class SweepCounts:
    """What one housekeeping pass did to one login's queue."""

    lease_expired: int = 0
    removed_by_retention: int = 0


class LedgerRecord(NamedTuple):
    """One ledger record: a receipt entering the queue (`enqueue`) or leaving it by an ack
    (`ack`); or, for a receipt meant for a `dlr_url` (F2), its callback made (`callback`) and
    answered 2xx by the receiver (`callback_answered`), `token` then the callback's key."""

    id: int
    kind: str
    login: str
    seq: int
    token: str
    at: float
    receipt: ReceiptFields

    def to_json(self) -> dict[str, Any]:
        """The record as `FakeGateway.ledger` and the admin `Ledger` method return it."""
        return self._asdict()


class LedgerPage(NamedTuple):
    """Ledger records after some id, the id to ask after next, and the oldest id still held."""

    records: list[LedgerRecord]
    next_after: int
    first_id: int


class Reader(Protocol):
    """One reader of one login's queue: a Subscribe stream, or the login's Pulls (F12)."""

    async def take(self, limit: int, window: int | None, now: float) -> Deliveries:
        """Lease up to `limit` waiting receipts to this reader, in hand-out order.

        With a `window` (Subscribe, F11) the reader's receipts still unacked count against it.
        Each receipt leaves with `delivery_count + 1` and a lease (F6).
        """
        ...

    def release(self, on_released: Callable[[int], None]) -> None:
        """F7: this stream ended; its unacked receipts wait again at once, behind newer ones.

        `on_released` learns how many, now or once the release is done. Not a coroutine, so a
        cancelled stream cannot skip it.
        """
        ...


class FeedBackend(Protocol):
    """Queues, leases, acks and the ledger of every configured login."""

    async def start(self) -> None:
        """Open what the backend needs before the first RPC."""
        ...

    async def close(self) -> None:
        """Flush and close; called after the server stopped and every stream ended."""
        ...

    def reader(self, login: str, *, pull: bool) -> Reader:
        """A new Subscribe stream's reader, or (`pull=True`) the one shared by the login's Pulls."""
        ...

    async def enqueue(
        self, login: str, receipts: Sequence[ReceiptFields], now: float
    ) -> EnqueueResult:
        """Append receipts at the back of the queue below the cap (F15); durable on return."""
        ...

    async def ack(self, login: str, tokens: Sequence[str], now: float) -> AckResult:
        """Remove the receipts these tokens name (F9, FD2, FD3); durable on return."""
        ...

    async def sweep(self, now: float, retention_cutoff: float) -> dict[str, SweepCounts]:
        """Expire leases (F6) and remove unread receipts enqueued before the cutoff (F16)."""
        ...

    def sizes(self, login: str) -> tuple[int, int]:
        """(waiting, leased) receipts of `login`."""
        ...

    def ledger(self, login: str | None, after: int, limit: int) -> LedgerPage:
        """Ledger records with id > `after`, of `login` or of all, oldest first, at most `limit`."""
        ...

    def record_callbacks(
        self, kind: str, login: str, callbacks: Sequence[tuple[str, ReceiptFields]], now: float
    ) -> None:
        """Ledger records of callbacks (`callback` or `callback_answered`), each (key, fields)."""
        ...
