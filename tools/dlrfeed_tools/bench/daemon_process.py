"""The daemon under measurement: a `dlrfeed run` process, its metrics and its memory.

Shared by the benchmarks that drive the real daemon (`make bench`, `make bench-growth`), so that
each measures the same process the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from dlrfeed_tools.local_login import LOGIN, PASSWORD
from dlrfeed_tools.metrics import histogram_quantile
from dlrfeed_tools.ports import logged_metrics_address


def ms_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile in milliseconds of a histogram in seconds (None: nothing observed)."""
    seconds = histogram_quantile(q, buckets)
    return None if seconds is None else 1000 * seconds


def vm_kb(pid: int, field: str) -> int:
    """A memory figure of /proc/PID/status in kB (`VmRSS`, `VmHWM`), 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _daemon_command(target: str, database_url: str, mode: str, extra: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "dlrfeed.cli", "run", "--gateway", target, "--login", LOGIN,
        "--database-url", database_url, "--mode", mode, "--log-format", "json",
        "--log-level", "warning", "--summary-interval", "0", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def daemon(
    target: str, database_url: str, mode: str, extra: Sequence[str] = (), log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A `dlrfeed run` process (default settings but `mode`), its log lines appended to `log`
    (discarded without); stopped by SIGTERM on exit."""
    env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD}
    with open(log, "ab") if log else contextlib.nullcontext(subprocess.DEVNULL) as stderr:
        process = subprocess.Popen(
            _daemon_command(target, database_url, mode, extra), env=env, stderr=stderr
        )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def metrics_address(log: Path, process: subprocess.Popen[bytes]) -> str:
    """HOST:PORT the daemon logged once it served its metrics (it was given port 0)."""
    deadline = time.monotonic() + 60
    while (address := logged_metrics_address(log)) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"dlrfeed run logged no metrics_listening line in {log}")
        time.sleep(0.05)
    return f"{address[0]}:{address[1]}"


def http_text(url: str) -> str:
    """The body of a loopback GET (the daemon's /metrics)."""
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback http
        return str(response.read().decode())


def histogram_buckets(text: str, name: str) -> list[tuple[float, float]]:
    """The cumulative (upper bound, count) pairs of histogram `name` in a /metrics text."""
    pattern = rf'^{name}_bucket\{{le="([^"]+)"\}} (\S+)$'
    matches = re.finditer(pattern, text, re.MULTILINE)
    return sorted((float(m.group(1)), float(m.group(2))) for m in matches)
