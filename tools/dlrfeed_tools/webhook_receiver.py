"""A webhook endpoint for tests and the chaos matrix: checks and records what `dlrfeed relay`
POSTs, and misbehaves on request.

Each request's signature (`X-Dlrfeed-Signature`) is checked against the secret; its changes are
appended as one JSON line to --log (fsync'd) before the answer, so a kill -9 never loses an
acknowledged batch. `--script` scripts the answers of the first requests, comma-separated:
`503` answers 503 Service Unavailable; `slow` records the batch, then waits `--slow-seconds`
(longer than the relay's timeout) before answering 200, so the relay sends it again: a
duplicate the receiver dedupes by position; `ok` answers 200. Requests after the script get 200.
`--port 0` binds a free port; the first line printed, `listening PORT`, says which.

    python scripts/webhook_receiver.py --port N --secret-file FILE --log FILE [--script 503,slow]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Receiver(ThreadingHTTPServer):
    """The server and its state: the secret, the log file, the scripted answers left."""

    daemon_threads = True

    def __init__(self, port: int, secret: bytes, log_path: Path, script: list[str], slow: float):
        super().__init__(("127.0.0.1", port), Handler)
        self.secret = secret
        self.log_path = log_path
        self.script = script
        self.slow_seconds = slow
        self.lock = threading.Lock()

    def next_answer(self) -> str:
        with self.lock:
            return self.script.pop(0) if self.script else "ok"

    def record(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with self.lock, self.log_path.open("ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if len(body) < length:
            # The sender died mid-request (the tests kill -9 the relay): an incomplete request
            # is no delivery, as for any HTTP server; recording it would log a bad signature.
            self.close_connection = True
            return
        answer = self.server.next_answer()
        if answer == "503":
            self._answer(503)
            return
        expected = "sha256=" + hmac.new(self.server.secret, body, hashlib.sha256).hexdigest()
        valid = hmac.compare_digest(expected, self.headers.get("X-Dlrfeed-Signature", ""))
        changes = json.loads(body)["changes"] if valid else []
        self.server.record({"signature_valid": valid, "changes": changes, "answer": answer})
        if answer == "slow":
            time.sleep(self.server.slow_seconds)  # processed, but answered after the timeout
        self._answer(200 if valid else 401)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the log file is the record


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every recorded request, in arrival order (a line cut by kill -9 is skipped)."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def delivery_problems(
    entries: Sequence[Mapping[str, Any]],
    logged: Sequence[Mapping[str, Any]],
    statuses: Mapping[tuple[str, str], str],
) -> list[str]:
    """What is wrong with a relay's deliveries (empty when nothing): `entries` as read_log
    gives them, `logged` every change of dlr.status_changes (position, login, message_id,
    status), `statuses` each message's status in dlr.message_status. Checks every signature,
    that every change arrived (duplicates allowed: the receiver dedupes by position) and
    nothing else did, that first arrivals follow the positions, and that each message's last
    delivered change is its status (null for a message that has none any more)."""
    problems = []
    invalid = sum(1 for e in entries if not e["signature_valid"])
    if invalid:
        problems.append(f"relay: {invalid} request(s) with an invalid signature")
    received = [c for e in entries for c in e["changes"]]
    positions = {c["position"] for c in received}
    expected = {c["position"] for c in logged}
    if expected - positions:
        problems.append(f"relay: {len(expected - positions)} change(s) never delivered")
    if positions - expected:
        problems.append(f"relay: {len(positions - expected)} delivered change(s) not in the log")
    first_seen = list(dict.fromkeys(c["position"] for c in received))
    if first_seen != sorted(first_seen):
        problems.append("relay: changes first arrived out of position order")
    last: dict[tuple[str, str], str | None] = {}
    for change in sorted({c["position"]: c for c in received}.values(), key=_position):
        last[(change["login"], change["message_id"])] = change["status"]
    # A message with no status any more (withdrawn by a recompute) ends on a null status.
    wrong = sum(1 for key in set(last) | set(statuses) if last.get(key) != statuses.get(key))
    if wrong:
        problems.append(f"relay: {wrong} message(s) whose last delivered change is not its status")
    return problems


def _position(change: Mapping[str, Any]) -> int:
    return int(change["position"])


def main(argv: list[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--script", default="")
    parser.add_argument("--slow-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    secret = Path(args.secret_file).read_bytes().rstrip(b"\r\n")
    script = [s for s in args.script.split(",") if s]
    server = Receiver(args.port, secret, Path(args.log), script, args.slow_seconds)
    print(f"listening {server.server_address[1]}", flush=True)  # the port bound, for --port 0
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
