"""The chaos matrix: seeded fault scenarios against real processes, each ending with the checker.

Every scenario starts a fresh fakegw process (a SQLite store file, so it can be killed and
restarted), a fresh migrated database, and one or more `dlrfeed run` processes; feeds seeded
adversarial traffic (`fakegw.traffic.scenario`) while it breaks something on purpose; then waits
for the queue to drain and runs the ledger-vs-store invariant checker
(`dlrfeed_tools.invariants`).
Done means: 0 lost, 0 double-applied, 0 acked-but-missing, an empty queue.

    python scripts/chaos.py                       # the short form (what `make test` runs)
    python scripts/chaos.py --full --out docs/reliability.md   # `make chaos`
    python scripts/chaos.py --only daemon_kill9 --seed 7

Process handling reuses the daemon tests' command line (`dlrfeed_tools.daemon_harness.run_args`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from dlrfeed.store.migrate import migrate
from dlrfeed_tools.chaos.report import markdown
from dlrfeed_tools.chaos.rig import GatewayProcess, Rig
from dlrfeed_tools.chaos.scenarios import BY_NAME, SCENARIOS, ScenarioSpec
from dlrfeed_tools.daemon_harness import LOGIN, PASSWORD
from dlrfeed_tools.invariants import check
from dlrfeed_tools.pgcluster import PgCluster, free_port

TEMPLATE = "chaos_template"


async def run_scenario(
    spec: ScenarioSpec,
    cluster: PgCluster,
    database_url: str,
    workdir: Path,
    *,
    full: bool = False,
    seed: int = 1,
    drain_within_s: float = 120.0,
) -> dict[str, Any]:
    """Run one scenario on a fresh migrated `database_url`; its invariant report plus
    `scenario`, `faults`, `seconds`, `notes`, `clean_exits` and `ok`/`failed`."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:{spec.name}")
    gateway = GatewayProcess(workdir, ("--no-uvloop", *spec.gateway_flags))
    await gateway.start()
    rig = Rig(cluster, database_url, workdir, rng, full, gateway)
    started = time.monotonic()
    try:
        faults = await spec.run(rig)
        for daemon in rig.daemons:
            assert daemon.process is not None
            if daemon.process.returncode is not None:
                # A daemon that died by itself (not one of our kills) can drain nothing.
                tail = daemon.log.read_text(errors="replace")[-500:]
                rig.extra_failures.append(f"daemon exited {daemon.process.returncode}: {tail}")
                drain_within_s = 0.0
        # drain_seconds: from the end of the faults (and of the traffic) to an empty queue.
        report = await check(
            gateway.target, LOGIN, PASSWORD, rig.database_url, wait_drain_s=drain_within_s
        )
        exits = [await daemon.stop() for daemon in rig.daemons]
    finally:
        for daemon in rig.daemons:
            await daemon.stop()
        await gateway.stop()
        for step in rig.teardown:
            await step()
    report.update(
        scenario=spec.name,
        faults=faults,
        seconds=round(time.monotonic() - started, 1),
        notes=rig.notes,
        clean_exits=sum(code == 0 for code in exits),
        daemon_processes=len(exits),
        daemon_kills=sum(d.kills for d in rig.daemons),
        gateway_kills=gateway.kills,
        # Every daemon's JSON log: how often a reader lost its stream/Pull and reconnected;
        # how often a store outage outlasted --release-after, and a Pull reader kept what it
        # had pulled through it.
        reader_reconnects=_log_events(rig, "reader_reconnect"),
        store_releases=_log_events(rig, "streams_released"),
        pulled_kept=_log_sum(rig, "pulled_receipts_kept", "kept"),
    )
    report["failed"] = [*report["failed"], *rig.extra_failures]
    if report["clean_exits"] != len(exits):
        report["failed"].append("a daemon did not stop cleanly on SIGTERM")
    report["ok"] = not report["failed"]
    return report


def _log_sum(rig: Rig, event: str, field: str) -> int:
    """The sum of `field` over the `event` lines the daemons of `rig` logged."""
    total = 0
    for daemon in rig.daemons:
        for line in daemon.log.read_text(errors="replace").splitlines():
            if f'"{event}"' in line:
                with contextlib.suppress(ValueError):
                    total += int(json.loads(line).get(field, 0))
    return total


def _log_events(rig: Rig, event: str) -> int:
    """How many `event` lines the daemons of `rig` logged, all together."""
    return sum(d.log.read_text(errors="replace").count(f'"{event}"') for d in rig.daemons)


@contextlib.asynccontextmanager
async def own_cluster(root: Path) -> AsyncIterator[PgCluster]:
    """A throwaway cluster for a standalone run, with the migrated template database."""
    cluster = PgCluster(root / "pg", free_port())
    await asyncio.to_thread(cluster.init)
    await asyncio.to_thread(cluster.start)
    try:
        await migrate(await cluster.create_database(TEMPLATE))
        yield cluster
    finally:
        await asyncio.to_thread(cluster.destroy)


async def fresh_database(cluster: PgCluster, name: str) -> str:
    return await cluster.create_database(name, template=TEMPLATE)


async def run_matrix(names: Sequence[str], full: bool, seed: int) -> list[dict[str, Any]]:
    """Every named scenario on one throwaway cluster, a fresh database each; the reports."""
    reports: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        async with own_cluster(root) as cluster:
            for name in names:
                url = await fresh_database(cluster, f"chaos_{name}")
                report = await run_scenario(
                    BY_NAME[name], cluster, url, root / name, full=full, seed=seed
                )
                status = "ok" if report["ok"] else f"FAILED {report['failed']}"
                print(
                    f"{name:20} {report['receipts']:>7} receipts  lost {report['lost']}  "
                    f"double {report['double_applied']}  acked-missing "
                    f"{report['acked_but_missing']}  queued {report['queued']}  "
                    f"drain {report['drain_seconds']} s  ({report['seconds']} s)  {status}",
                    flush=True,
                )
                reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    """CLI: run the matrix, print one line per scenario, optionally write the markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full sizes (make chaos)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", choices=sorted(BY_NAME), help="repeatable")
    parser.add_argument("--out", type=Path, help="write the generated markdown here")
    parser.add_argument("--json", type=Path, help="write the raw reports here")
    args = parser.parse_args(argv)
    names = args.only or [spec.name for spec in SCENARIOS]
    started = time.monotonic()
    reports = asyncio.run(run_matrix(names, args.full, args.seed))
    took = time.monotonic() - started
    if args.out:
        args.out.write_text(markdown(reports, args.full, args.seed, took))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2, default=str))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
