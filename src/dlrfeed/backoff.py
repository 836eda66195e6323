"""The one retry delay of dlrfeed: exponential backoff with jitter, capped.

Used by the readers (reconnects), the store gate (pings while PostgreSQL is down) and start-up
(waiting for the store or the gateway). Jitter keeps many workers that failed together from
retrying together — reconnect storms are the most reported failure of peer clients.
"""

from __future__ import annotations

import random


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """Seconds to wait before try `attempt` (1, 2, …): a random half to all of
    `initial · 2^(attempt-1)`, never above `maximum` (equal jitter)."""
    ceiling = min(maximum, initial * 2 ** max(attempt - 1, 0))
    return random.uniform(ceiling / 2, ceiling)
