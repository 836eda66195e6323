"""The `dlrfeed` console script run as an operator runs it: in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys


def dlrfeed(
    *args: str, stdin: str | None = None, password: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`dlrfeed ARGS` in a process of its own, its output captured; no DLRFEED_* setting of the
    test's environment reaches it but the gateway password, when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")}
    if password is not None:
        env["DLRFEED_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "dlrfeed.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        check=False,
        env=env,
    )
