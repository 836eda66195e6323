"""Where a server listens, read back from its own log after it bound port 0.

A port picked free beforehand (bind, close, hand the number over) can be taken by another
process before the server binds it, and on a busy machine that happens. So `dlrfeed run` and
`dlrfeed relay` are started with `--metrics 127.0.0.1:0`, and the address they got is read
from the `metrics_listening` line they log once they serve (JSON logs);
`scripts/webhook_receiver.py --port 0` prints `listening PORT`. Used by the demo, the
benchmark, the chaos matrix and the tests.
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


def logged_receiver_port(log: Path, offset: int = 0) -> int | None:
    """The port of the first `listening PORT` line `scripts/webhook_receiver.py` printed to
    `log` from byte `offset`; None until it has printed one."""
    with log.open("rb") as stream:
        stream.seek(offset)
        for line in stream:
            if line.startswith(b"listening ") and line.endswith(b"\n"):
                return int(line.split()[1])
    return None
