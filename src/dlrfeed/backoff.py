"""The one retry-delay policy of dlrfeed: exponential backoff with equal jitter, capped.

Used by the readers (reconnects), the store gate (pings while PostgreSQL is down), the batchers
(a batch whose commit failed), the store (a transaction rolled back by a deadlock, as tenacity's
`wait`), start-up (waiting for the store or the gateway) and the Acker (Ack retries, as
tenacity's `wait`).
Jitter keeps many workers that failed together from retrying together — reconnect storms are
the most reported failure of peer clients.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays `initial · 2^(attempt-1)` capped at `maximum`, each a random half to all of its
    step (equal jitter). `rng` is injectable so that tests can seed it."""

    initial: float
    maximum: float
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try `attempt` (1, 2, …)."""
        ceiling = min(self.maximum, self.initial * 2 ** max(attempt - 1, 0))
        return self.rng.uniform(ceiling / 2, ceiling)
