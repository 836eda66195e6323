"""The per-login receipt queue: lease, redelivery, window accounting, cap and retention.

This is the in-memory index behind fakegw.memory_backend; fakegw.persistence makes it durable.
Each receipt is an `Entry` keyed by a sequence number. Waiting receipts sit in `ready` (a deque
in hand-out order); delivered ones carry a `Holder` (the Subscribe stream or Pull that holds
them) and a lease deadline. Expired leases and released streams append their receipts to the
back of `ready`, so redeliveries queue behind newer receipts (F6, F13).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class Holder:
    """Whoever a delivered receipt is leased to: one Subscribe stream, or the login's Pulls."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        # F11: the stream's delivered-but-unacked receipts; its size is checked against window.
        self.held: set[int] = set()


class Entry:
    """One queued receipt: its pre-serialized fields, token, and delivery state."""

    __slots__ = (
        "base",
        "delivery_count",
        "enqueued_at",
        "fields",
        "holder",
        "lease_generation",
        "seq",
        "token",
        "token_bytes",
    )

    def __init__(
        self,
        seq: int,
        fields: dict[str, str | int],
        base: bytes,
        token: str,
        token_bytes: bytes,
        enqueued_at: float,
        delivery_count: int,
    ) -> None:
        self.seq = seq
        self.fields = fields
        self.base = base
        self.token = token
        self.token_bytes = token_bytes
        self.enqueued_at = enqueued_at
        self.delivery_count = delivery_count
        self.holder: Holder | None = None
        self.lease_generation = 0


class LoginQueue:
    """The durable queue of one login (F1), shared by all its readers (F12)."""

    def __init__(self, login: str, lease_seconds: float, cap: int) -> None:
        self.login = login
        self.lease_seconds = lease_seconds
        self.cap = cap
        self.entries: dict[int, Entry] = {}  # insertion order = seq order = arrival order
        # Live tokens of this login only: a foreign, forged or spent token is simply absent.
        self.by_token: dict[str, int] = {}
        self.ready: deque[int] = deque()
        self._leases: deque[tuple[float, int, int]] = deque()  # (deadline, seq, generation)
        self.in_flight = 0
        self.pull_holder = Holder()

    # -- enqueue --------------------------------------------------------------------------
    def has_room(self) -> bool:
        """F15: below the cap, counting waiting and leased receipts."""
        return len(self.entries) < self.cap

    def add(self, entry: Entry) -> None:
        """Append a receipt at the back of the queue (caller has checked the cap)."""
        self.entries[entry.seq] = entry
        self.by_token[entry.token] = entry.seq
        self.ready.append(entry.seq)

    # -- delivery -------------------------------------------------------------------------
    def take(self, limit: int, holder: Holder, now: float) -> list[Entry]:
        """Lease up to `limit` waiting receipts to `holder`, oldest in hand-out order first.

        Each taken receipt gets `delivery_count + 1` (F6) and a lease deadline. Sequence
        numbers left in `ready` by acks or retention are skipped here, lazily.
        """
        taken: list[Entry] = []
        ready = self.ready
        entries = self.entries
        deadline = now + self.lease_seconds
        leases = self._leases
        held = holder.held
        while ready and len(taken) < limit:
            seq = ready.popleft()
            entry = entries.get(seq)
            if entry is None or entry.holder is not None:
                continue
            entry.holder = holder
            entry.delivery_count += 1
            entry.lease_generation += 1
            held.add(seq)
            leases.append((deadline, seq, entry.lease_generation))
            taken.append(entry)
        self.in_flight += len(taken)
        return taken

    def _unlease(self, entry: Entry) -> None:
        holder = entry.holder
        if holder is not None:
            holder.held.discard(entry.seq)
            entry.holder = None
            self.in_flight -= 1

    def release(self, holder: Holder) -> int:
        """F7: a stream ended; its unacked receipts are released at once, behind newer ones."""
        released = 0
        for seq in sorted(holder.held):
            entry = self.entries.get(seq)
            if entry is not None and entry.holder is holder:
                entry.holder = None
                self.in_flight -= 1
                self.ready.append(seq)
                released += 1
        holder.held.clear()
        return released

    def expire_leases(self, now: float) -> int:
        """F6: receipts whose lease ran out go back to the queue, behind newer receipts."""
        expired = 0
        leases = self._leases
        while leases and leases[0][0] <= now:
            _, seq, generation = leases.popleft()
            entry = self.entries.get(seq)
            if entry is None or entry.holder is None or entry.lease_generation != generation:
                continue
            self._unlease(entry)
            self.ready.append(seq)
            expired += 1
        return expired

    # -- ack and removal ------------------------------------------------------------------
    def remove_by_token(self, token: str) -> Entry | None:
        """Ack: take a receipt out of the queue whichever delivery its token came from.

        None when the token names nothing queued for this login (already_gone, F9).
        """
        seq = self.by_token.pop(token, None)
        if seq is None:
            return None
        entry = self.entries.pop(seq)
        self._unlease(entry)
        return entry

    def expire_retention(self, cutoff: float) -> list[Entry]:
        """F16: remove unread (not leased) receipts enqueued before `cutoff`."""
        removed: list[Entry] = []
        for entry in self.entries.values():
            if entry.enqueued_at >= cutoff:
                break
            if entry.holder is None:
                removed.append(entry)
        for entry in removed:
            del self.entries[entry.seq]
            del self.by_token[entry.token]
        return removed

    def restore(self, entries: Iterable[Entry]) -> None:
        """Load receipts read back from the store; all are waiting (F7: restart releases)."""
        for entry in entries:
            self.entries[entry.seq] = entry
            self.by_token[entry.token] = entry.seq
            self.ready.append(entry.seq)

    def sizes(self) -> tuple[int, int]:
        """(waiting, leased) receipts."""
        return len(self.entries) - self.in_flight, self.in_flight
