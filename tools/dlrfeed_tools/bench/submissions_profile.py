"""Where one `record_submissions` of 5,000 ids spends its time, on a store as it is.

Runs the real recording code (`dlrfeed.store.recording`) for 5,000 sent messages - most of
them new, some whose receipts are already waiting (the login's open `uncorrelated`
exceptions), as a sending application's call is - inside one transaction that is then rolled
back, so the store is left as it was (each chunk's own transaction becomes a savepoint). For
each statement it reports the calls, the wall time and the CPU time of the backend that ran it
(read from /proc: run it on the database's host). The chunks' ten commits are not in it (a
commit is one WAL flush; `pg_test_fsync` tells what that costs on the host).

    python -m dlrfeed_tools.bench.submissions_profile DSN [--login L] [--ids 5000] [--late 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.store import Submission, correlation, recording, replay
from dlrfeed.store.recording import record_submissions
from dlrfeed.store.sql import Query
from dlrfeed_tools.local_login import LOGIN

_NAMES = {
    q.text: q.name
    for module in (correlation, recording, replay)
    for q in vars(module).values()
    if isinstance(q, Query)
}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TimedConnection:
    """The connection the recording code is given: each statement timed, by query name.

    It offers the methods the recording code calls on its connection and nothing else, so a
    change there that needs another one fails here at once rather than timing the wrong thing.
    """

    def __init__(self, conn: asyncpg.Connection, backend: int) -> None:
        self._conn = conn
        self.backend = backend
        self.calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])

    def is_in_transaction(self) -> bool:
        return self._conn.is_in_transaction()

    def is_closed(self) -> bool:
        return self._conn.is_closed()

    async def _timed(self, method: str, text: str, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), _cpu_seconds(self.backend)
        result = await getattr(self._conn, method)(text, *args)
        entry = self.calls[_NAMES.get(text, text.split()[0])]
        entry[0] += 1
        entry[1] += 1000 * (time.perf_counter() - wall)
        entry[2] += 1000 * (_cpu_seconds(self.backend) - cpu)
        return result

    async def fetch(self, text: str, *args: Any) -> Any:
        return await self._timed("fetch", text, *args)

    async def fetchrow(self, text: str, *args: Any) -> Any:
        return await self._timed("fetchrow", text, *args)

    async def fetchval(self, text: str, *args: Any) -> Any:
        return await self._timed("fetchval", text, *args)

    async def execute(self, text: str, *args: Any) -> Any:
        return await self._timed("execute", text, *args)


async def profile(dsn: str, login: str, ids: int, late: int, settings: dict[str, str]) -> str:
    conn = await asyncpg.connect(dsn, server_settings=settings)
    try:
        stored = await conn.fetchval(
            "SELECT coalesce(sum(reltuples), 0)::bigint FROM pg_class AS c"
            " JOIN pg_inherits AS i ON i.inhrelid = c.oid"
            " WHERE i.inhparent = 'dlr.reception_rows'::regclass"
        )
        waiting = [
            r["message_id"]
            for r in await conn.fetch(
                "SELECT DISTINCT message_id FROM dlr.exceptions WHERE kind = 'uncorrelated'"
                " AND resolved_at IS NULL AND login = $1 LIMIT $2",
                login,
                late,
            )
        ]
        fresh = [str(uuid.uuid4()) for _ in range(ids - len(waiting))]
        submissions = [
            Submission(login, m, "+34600123456", submitted_at=None) for m in fresh + waiting
        ]
        timed = TimedConnection(conn, await conn.fetchval("SELECT pg_backend_pid()"))
        outer = conn.transaction()
        await outer.start()
        wall, cpu = time.perf_counter(), _cpu_seconds(timed.backend)
        try:
            # The recording code's Connection type, met by the methods it uses.
            result = await record_submissions(
                timed,  # type: ignore[arg-type]
                IntegrationOptions(),
                submissions,
            )
            total_ms = 1000 * (time.perf_counter() - wall)
            total_cpu_ms = 1000 * (_cpu_seconds(timed.backend) - cpu)
        finally:
            await outer.rollback()
    finally:
        await conn.close()
    lines = [
        f"record_submissions of {len(submissions):,} ids ({len(waiting)} with waiting receipts,"
        f" {result.late_correlated_events} events correlated late) on a store of"
        f" ~{stored:,} receptions: {total_ms:,.0f} ms wall, {total_cpu_ms:,.0f} ms backend CPU",
        "",
        "| statement | calls | wall ms | backend CPU ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, (calls, ms, cpu_ms) in sorted(timed.calls.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {name} | {calls:.0f} | {ms:,.1f} | {cpu_ms:,.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn")
    parser.add_argument("--login", default=LOGIN)
    parser.add_argument("--ids", type=int, default=5000)
    parser.add_argument("--late", type=int, default=100, help="ids with receipts waiting, at most")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a session setting"
    )
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    print(asyncio.run(profile(args.dsn, args.login, args.ids, args.late, settings)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
