"""`dlrfeed webhook` as its own process, as an operator runs it: for the tests in which a real
gateway (Kannel, Jasmin's thrower) calls it back over loopback.

It listens on the port given, or on port 0 and the test reads the port it got from its
`webhook_ready` log line (JSON logs); on exit it is stopped with SIGTERM and must exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from dlrfeed_tools.paths import REPO

_READY_S = 60.0  # generous: two cores shared with other test runs


@dataclass(frozen=True, slots=True)
class WebhookProcess:
    """A running `dlrfeed webhook`: its base URL and its log."""

    url: str
    log: Path

    def log_events(self) -> list[dict[str, object]]:
        """Every JSON event logged so far."""
        return [
            json.loads(line)
            for line in self.log.read_text(errors="replace").splitlines()
            if line.startswith("{")
        ]


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _ready_port(log: Path) -> int | None:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"webhook_ready"' in line:
            return int(json.loads(line)["port"])
    return None


@contextlib.asynccontextmanager
async def webhook_process(
    database_url: str, log: Path, *args: str, login: str = "acme", port: int = 0
) -> AsyncIterator[WebhookProcess]:
    """`dlrfeed webhook --login LOGIN ARGS...` on `port` of 127.0.0.1 (0: a free one) until the
    block ends; its exit code checked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")}
    env.pop("NOTIFY_SOCKET", None)
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dlrfeed.cli", "webhook",
            "--listen", f"127.0.0.1:{port}", "--login", login, "--database-url", database_url,
            "--log-format", "json", *args,
            env=env, stdout=out, stderr=out, cwd=REPO,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + _READY_S
        while (bound := _ready_port(log)) is None:
            if process.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"dlrfeed webhook did not start:\n{_tail(log)}")
            await asyncio.sleep(0.05)
        yield WebhookProcess(f"http://127.0.0.1:{bound}", log)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    assert code == 0, _tail(log)
