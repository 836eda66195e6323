"""`dlrfeed recompute --all` at size, and what it costs the live ingest running beside it.

On a throwaway PostgreSQL: MESSAGES messages recorded, each with a progress and a final receipt
(two receptions a message), their statuses made stale. Then, in order:

1. the live ingest alone for SECONDS (`Store.ingest`, batches of 500 new receipts of new
   messages, one writer): its rate (the mean of a measure before step 2 and one after it, as
   the load of a shared machine drifts);
2. `dlrfeed recompute` (a process of its own, as an operator runs it, with its default
   `--busy`) of every stale status, with the live ingest running beside it: the recompute's
   time and the ingest's rate while it runs, as a share of its rate alone;
3. `dlrfeed recompute --all --busy 1` alone: its time over every status at full speed.

Prints one JSON document. Usage: `python scripts/bench_recompute.py --messages 150000`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time

import asyncpg

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.pgcluster import scratch_directory, start_on_a_free_port
from dlrfeed_tools.rule_receipts import LOGIN, SUBMITTED, feed_receipt

_BATCH = 500
_tokens = itertools.count()


def _receipts(ids: list[str], level: int, stat: str) -> list[object]:
    now = time.time()
    return [
        feed_receipt(
            m, level, stat, ack_token=f"t{next(_tokens)}", received_at=now, done_date="2611291201"
        )
        for m in ids
    ]


async def _grow(store: Store, messages: int) -> None:
    for start in range(0, messages, 5_000):
        ids = [f"m{n:08}" for n in range(start, min(start + 5_000, messages))]
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600000001", submitted_at=SUBMITTED) for m in ids]
        )
        for a in range(0, len(ids), _BATCH):
            await store.ingest(LOGIN, _receipts(ids[a : a + _BATCH], 1, "ENROUTE"))  # type: ignore[arg-type]
            await store.ingest(LOGIN, _receipts(ids[a : a + _BATCH], 2, "DELIVRD"))  # type: ignore[arg-type]
        print(f"grown: {min(start + 5_000, messages)} messages", file=sys.stderr)


class _Live:
    """The live ingest: batches of new receipts, one writer, counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ids = (f"live{n:09}" for n in itertools.count())
        self.receipts = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = [next(self.ids) for _ in range(_BATCH)]
            await self.store.ingest(LOGIN, _receipts(batch, 2, "DELIVRD"))  # type: ignore[arg-type]
            self.receipts += len(batch)

    async def rate_for(self, seconds: float) -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop))
        before, started = self.receipts, time.monotonic()
        await asyncio.sleep(seconds)
        stop.set()
        await task
        return (self.receipts - before) / (time.monotonic() - started)


async def _recompute(dsn: str, *flags: str) -> tuple[float, str]:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dlrfeed.cli", "recompute", "--database-url", dsn,
        "--progress-every", "30", *flags,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0
    return time.monotonic() - started, out.decode().strip()


async def main(messages: int, seconds: float, busy: str) -> dict[str, object]:
    cluster = start_on_a_free_port(scratch_directory("bench-recompute"), fsync=True)
    try:
        dsn = await cluster.create_database("bench")
        await migrate(dsn)
        store = await Store.open(dsn, pool_size=2)
        try:
            grow_started = time.monotonic()
            await _grow(store, messages)
            grown_s = time.monotonic() - grow_started
            db = await asyncpg.connect(dsn)
            try:
                receptions = await db.fetchval("SELECT count(*) FROM dlr.reception_rows")
                await db.execute("UPDATE dlr.statuses SET rules_version = 'rules-0'")
                await db.execute("VACUUM ANALYZE")
            finally:
                await db.close()
            live = _Live(store)
            alone = await live.rate_for(seconds)
            stop = asyncio.Event()
            beside = asyncio.create_task(live.run(stop))
            before, started = live.receipts, time.monotonic()
            stale_s, stale_out = await _recompute(dsn, "--busy", busy)
            during = (live.receipts - before) / (time.monotonic() - started)
            stop.set()
            await beside
            alone = (alone + await live.rate_for(seconds)) / 2
            all_s, all_out = await _recompute(dsn, "--all", "--busy", "1")
        finally:
            await store.close()
    finally:
        cluster.destroy()
    return {
        "messages": messages,
        "receptions": receptions,
        "grow_s": round(grown_s, 1),
        "ingest_alone_receipts_per_s": round(alone),
        "recompute_busy": busy,
        "recompute_stale_s": round(stale_s, 1),
        "recompute_stale_output": stale_out,
        "ingest_during_recompute_receipts_per_s": round(during),
        "ingest_share_during_recompute": round(during / alone, 2),
        "recompute_all_alone_s": round(all_s, 1),
        "recompute_all_output": all_out,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="each measure of the ingest alone"
    )
    parser.add_argument("--busy", default="0.3", help="the recompute's --busy beside the ingest")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.messages, args.seconds, args.busy)), indent=2))
