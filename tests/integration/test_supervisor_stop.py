"""The supervisor's clean stop when it races with a worker's start.

A worker sets its SIGTERM handler first thing, before it opens the store or reads a receipt. A
stop that reaches it earlier kills it by the signal's default action: it held nothing, so that
is a clean stop, and the supervisor must exit 0. A worker whose start was under way when the
stop came must be told to stop too, not waited on until the shutdown timeout and killed.
"""

from __future__ import annotations

import asyncio
import sys

from dlrfeed.daemon.supervisor import Supervisor
from dlrfeed_tools.daemon_harness import settings_for

# A worker that has not set its handler yet: SIGTERM ends it (-15), anything else waits.
_STARTING_WORKER = "import time; time.sleep(60)"


class _StartingWorkers(Supervisor):
    def command(self, index: int) -> list[str]:
        return [sys.executable, "-c", _STARTING_WORKER]


def _supervisor() -> _StartingWorkers:
    settings = settings_for(
        "127.0.0.1:1", "postgresql://dlrfeed@127.0.0.1:1/dlrfeed", "--processes", "2"
    )
    return _StartingWorkers(settings, ["run"])


async def test_a_stop_before_the_workers_set_their_handlers_is_clean() -> None:
    supervisor = _supervisor()
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0.5)  # both workers spawned, sleeping without a handler
    supervisor.stop()
    assert await asyncio.wait_for(running, 10) == 0
    assert supervisor.restarts == 0


async def test_a_stop_during_a_spawn_reaches_that_worker() -> None:
    supervisor = _supervisor()
    running = asyncio.create_task(supervisor.run())
    supervisor.stop()  # before the first spawn has returned its process
    # Far below the shutdown timeout (+5 s) after which an unsignalled worker is killed.
    assert await asyncio.wait_for(running, 4) == 0
