"""Where a server listens, read back from its own log after it bound port 0.

A port picked free beforehand (bind, close, hand the number over) can be taken by another
process before the server binds it, and on a busy machine that happens. So `dlrfeed run` and
`dlrfeed relay` are started with `--metrics 127.0.0.1:0`, and the address they got is read
from the `metrics_listening` line they log once they serve (JSON logs). Used by the demo, the
benchmark and the tests.
"""

from __future__ import annotations

import json
from pathlib import Path


def logged_metrics_address(log: Path, offset: int = 0) -> tuple[str, int] | None:
    """(host, port) of the first `metrics_listening` line in `log` from byte `offset`; None
    until the process has logged one (a line still being written is not read)."""
    with log.open("rb") as stream:
        stream.seek(offset)
        for line in stream:
            if line.startswith(b"{") and line.endswith(b"\n"):
                entry = json.loads(line)
                if entry.get("event") == "metrics_listening":
                    return str(entry["host"]), int(entry["port"])
    return None
