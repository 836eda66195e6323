"""`--processes M`: a supervisor that runs M worker processes of `dlrfeed run` and restarts a
dead one.

Each worker is the same command with `--processes 1` appended (a later flag wins in argparse)
and, when `--metrics HOST:PORT` is set, its own port PORT+1+i (the supervisor itself serves
none). The workers share the login's queue (F12) and the store. The supervisor alone talks to
systemd (`NotifyAccess=main`): the workers get no NOTIFY_SOCKET. SIGTERM/SIGINT are forwarded;
a worker that exits 77/78 (bad credentials, bad configuration) stops everything with that
status, since a restart cannot fix it; any other death is restarted after the project's retry
delay (`dlrfeed.backoff`), so that workers that died together do not restart together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

import structlog

from dlrfeed.backoff import Backoff

from .sdnotify import SystemdNotifier
from .settings import DaemonSettings

log = structlog.get_logger("dlrfeed.supervisor")

# 2: argparse usage error; 77, 78: credentials, configuration. A restart cannot fix any.
FATAL_EXIT_CODES = frozenset({2, 77, 78})

RESTART_DELAY = Backoff(initial=0.5, maximum=30.0)
"""Before restarting a dead worker; a worker that ran a minute starts the count afresh."""

RAN_A_WHILE_SECONDS = 60.0
"""A worker that ran this long before dying is not in a crash loop."""


def worker_argv(argv: Sequence[str], settings: DaemonSettings, index: int) -> list[str]:
    """The command line of worker `index`: ours (`run ...`), forced to one process, own port."""
    args = [sys.executable, "-m", "dlrfeed.cli", *argv, "--processes", "1"]
    if settings.metrics is not None:
        host, port = settings.metrics
        args += ["--metrics", f"{host}:{port + 1 + index if port else 0}"]
    return args


class Supervisor:
    """Runs and restarts the worker processes; `await run()` returns the exit status."""

    def __init__(
        self,
        settings: DaemonSettings,
        argv: Sequence[str],
        notifier: SystemdNotifier | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._argv = list(argv)
        self._notifier = notifier or SystemdNotifier()
        self._stop = asyncio.Event()
        self.restarts = 0

    def stop(self) -> None:
        """Stop every worker cleanly (idempotent): each worker's watcher forwards SIGTERM, to a
        worker whose start raced with the stop as well."""
        self._stop.set()

    def command(self, index: int) -> list[str]:
        """The command line of worker `index`."""
        return worker_argv(self._argv, self._settings, index)

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        child = await asyncio.create_subprocess_exec(*self.command(index), env=env)
        log.info("worker_started", worker=index, pid=child.pid)
        return child

    async def run(self) -> int:
        """Start M workers, keep them alive until stopped, then wait for their clean exit."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
        try:
            watchers = [
                asyncio.create_task(self._keep_alive(i), name=f"worker-{i}")
                for i in range(self._settings.processes)
            ]
            self._notifier.notify(READY="1", STATUS=f"{self._settings.processes} worker processes")
            watchdog = (
                asyncio.create_task(self._watchdog(self._notifier.watchdog_interval), name="wd")
                if self._notifier.watchdog_interval
                else None
            )
            codes = await asyncio.gather(*watchers)
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        fatal = [code for code in codes if code in FATAL_EXIT_CODES]
        if fatal:
            return fatal[0]
        return 0 if all(code == 0 for code in codes) else 1

    async def _keep_alive(self, index: int) -> int:
        deaths = 0  # in a row, each within RAN_A_WHILE_SECONDS of its start
        while True:
            started = self._clock()
            child = await self._spawn(index)
            code = await self._wait(child)
            if self._stop.is_set():
                if code == -signal.SIGTERM:
                    # Our SIGTERM reached a worker still starting, before it set its handler
                    # (the first thing it does, before it reads a receipt): it held nothing,
                    # so it stopped cleanly.
                    code = 0
                log.info("worker_stopped", worker=index, exit_code=code)
                return code
            if code in FATAL_EXIT_CODES:
                log.error("worker_fatal", worker=index, exit_code=code)
                self.stop()
                return code
            self.restarts += 1
            deaths = 1 if self._clock() - started > RAN_A_WHILE_SECONDS else deaths + 1
            delay = RESTART_DELAY.delay(deaths)
            log.warning("worker_died", worker=index, exit_code=code, restart_in_s=round(delay, 3))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            if self._stop.is_set():
                return 0

    async def _wait(self, child: asyncio.subprocess.Process) -> int:
        """The child's exit status; past the shutdown timeout after a stop, SIGKILL it."""
        wait = asyncio.create_task(child.wait(), name=f"wait-{child.pid}")
        stop = asyncio.create_task(self._stop.wait(), name=f"stop-{child.pid}")
        await asyncio.wait([wait, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not wait.done():
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(self._settings.shutdown_timeout + 5):
                    await asyncio.shield(wait)
            except TimeoutError:
                log.error("worker_killed", pid=child.pid)  # noqa: TRY400 - no traceback to show
                child.kill()
        return await wait

    async def _watchdog(self, interval: float) -> None:
        while True:
            self._notifier.notify(WATCHDOG="1")
            await asyncio.sleep(interval)
