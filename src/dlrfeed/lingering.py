"""The one wait behind every "flush on size or on time" in dlrfeed (the Batcher, the Acker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def linger(wakeup: asyncio.Event, deadline: float, ready: Callable[[], bool]) -> None:
    """Return once `ready()` holds or the monotonic clock reaches `deadline`.

    `ready()` is checked again whenever `wakeup` is set (new items, a flush request), so the
    caller waits on both triggers at once instead of sleeping in a loop (STYLE, asyncio habits).
    """
    while not ready():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        wakeup.clear()
        try:
            async with asyncio.timeout(remaining):
                await wakeup.wait()
        except TimeoutError:
            return
