"""fakegw in a child process, for benchmarks and tools that must not share its CPU or its loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(*serve_args: str, stop_timeout: float = 30.0) -> Iterator[str]:
    """Run `fakegw serve --listen 127.0.0.1:0 SERVE_ARGS…`; yield its `HOST:PORT`.

    The target is read from the one JSON line `serve` prints when it listens. On exit the child
    gets SIGTERM (a clean stop), then SIGKILL if it has not stopped within `stop_timeout`.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "fakegw", "serve", "--listen", "127.0.0.1:0", *serve_args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"fakegw serve exited at start (status {process.wait()})")
        yield str(json.loads(line)["target"])
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
