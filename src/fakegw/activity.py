"""What one node saw of one login's feed: its counters, its open streams, and reader wake-ups.

Both backends keep the queue itself (fakegw.memory_backend in this process, fakegw.shared_backend
in a shared SQLite file); this is the part that is always local to the process serving the RPCs:
the counters `fakegw stats` reports, and the event that wakes this node's paused streams and
long polls when something may let them proceed (F10, F11).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass


@dataclass
class QueueCounters:
    """Monotonic counters of one login's queue and callbacks since this process started."""

    enqueued: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    already_gone: int = 0
    invalid_tokens: int = 0  # of already_gone: malformed, forged or another login's
    dropped_at_cap: int = 0
    removed_by_retention: int = 0
    lease_expired: int = 0
    released_on_stream_end: int = 0
    deadline_unknown: int = 0
    filtered_by_f2: int = 0
    # Callbacks (F2: the webhook wins), each counted once when it is done, except `retried`
    # (failed attempts followed by another) and `duplicated` (the duplicate-callback fault).
    callbacks_delivered: int = 0
    callbacks_retried: int = 0
    callbacks_failed: int = 0  # given up after the last attempt
    callbacks_refused: int = 0  # a 4xx other than 408/429: never retried
    callbacks_duplicated: int = 0


class LoginActivity:
    """The counters and wake-ups of one login on this node, shared by all its readers (F12)."""

    def __init__(self, login: str) -> None:
        self.login = login
        self.counters = QueueCounters()
        self.streams = 0
        self._changed = asyncio.Event()

    def changed_event(self) -> asyncio.Event:
        """An event set at the next change that may let a waiting reader proceed."""
        return self._changed

    def notify(self) -> None:
        """Wake every reader waiting on this login (new receipts, releases, acks)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def enqueued(self, enqueued: int, dropped_at_cap: int) -> None:
        """Count an enqueue (F15: what the cap dropped) and wake the readers."""
        self.counters.enqueued += enqueued
        self.counters.dropped_at_cap += dropped_at_cap
        if enqueued:
            self.notify()

    def delivered(self, delivered: int, redelivered: int) -> None:
        """Count receipts handed out, of which `redelivered` had been delivered before (F6)."""
        self.counters.delivered += delivered
        self.counters.redelivered += redelivered

    def acks(self, acked: int, already_gone: int, invalid_tokens: int) -> None:
        """Count one Ack's outcome (F9, FD3); acks on any channel reopen paused windows (F11)."""
        counters = self.counters
        counters.acked += acked
        counters.already_gone += already_gone
        counters.invalid_tokens += invalid_tokens
        if acked:
            self.notify()

    def released(self, released: int) -> None:
        """F7: count the receipts a stream's end put back, and wake the other readers."""
        self.counters.released_on_stream_end += released
        if released:
            self.notify()

    def swept(self, lease_expired: int, removed_by_retention: int) -> None:
        """Count expired leases (F6) and receipts retention removed (F16)."""
        self.counters.lease_expired += lease_expired
        self.counters.removed_by_retention += removed_by_retention
        if lease_expired:
            self.notify()

    def counter_values(self) -> dict[str, int]:
        """Every counter by name, as `fakegw stats` reports it."""
        return asdict(self.counters)
