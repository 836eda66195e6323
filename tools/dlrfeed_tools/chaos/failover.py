"""Failover drills, measured: the chaos matrix's failover scenario with synchronous and with
asynchronous replication, several times each, and what each lost.

Each run is the chaos matrix's `failover` scenario (a primary and a streaming standby of their
own, the daemon on a multi-host URL, kill -9 of the primary at a quarter of the drain, promotion
of the standby) followed by the ledger-vs-store checker against the promoted server. With
synchronous replication every figure of loss must be 0 (the chaos matrix asserts it); with
asynchronous replication an ack can precede what the standby has, and `acked_but_missing` is
the size of that window: receipts the gateway deleted on our ack that the new primary lacks.
Measures and reports; asserts nothing. Prints one JSON object.

    python scripts/failover.py [--repeat 3] [--full] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from dlrfeed_tools.chaos.run import fresh_database, own_cluster, run_scenario
from dlrfeed_tools.chaos.scenarios import ScenarioSpec, failover

_FIGURES = (
    "receipts",
    "acks",
    "lost",
    "double_applied",
    "acked_but_missing",
    "repeats",
    "queued",
    "drain_seconds",
)


async def drills(repeat: int, full: bool, seed: int) -> dict[str, Any]:
    """`repeat` failovers with each kind of replication; their figures and the daemon's notes."""
    results: dict[str, list[dict[str, Any]]] = {"synchronous": [], "asynchronous": []}
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
        root = Path(tmp)
        # The scenario brings its own two servers; this cluster only satisfies the rig.
        async with own_cluster(root) as cluster:
            for run in range(repeat):
                for kind in results:
                    spec = ScenarioSpec(
                        f"failover_{kind}",
                        f"failover, {kind} replication",
                        "measured",
                        functools.partial(failover, synchronous=kind == "synchronous"),
                    )
                    url = await fresh_database(cluster, f"failover_{kind}_{run}")
                    report = await run_scenario(
                        spec, cluster, url, root / f"{kind}{run}", full=full, seed=seed + run
                    )
                    figures = {key: report.get(key) for key in _FIGURES}
                    figures["notes"] = report["notes"]
                    results[kind].append(figures)
                    print(f"{kind:12} run {run}: {json.dumps(figures)}", file=sys.stderr)
    return {
        "repeat": repeat,
        "full": full,
        "totals": {
            kind: {
                key: sum(int(r[key] or 0) for r in runs)
                for key in ("receipts", "lost", "double_applied", "acked_but_missing")
            }
            for kind, runs in results.items()
        },
        "runs": results,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the drills and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="20,000 receipts a run, not 4,000")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(drills(args.repeat, args.full, args.seed)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
