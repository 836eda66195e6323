"""The write floor benchmark: Store.ingest and the floor write the same receipts alternately,
the floor one row per distinct receipt, and its report section shows both rates and the ratio."""

from __future__ import annotations

import statistics

from dlrfeed_tools.bench.write_floor import SIDES, measure, report_section, workload
from dlrfeed_tools.pgcluster import PgCluster


async def test_both_writers_measured_on_the_same_receipts_and_reported(
    pg_cluster: PgCluster, template_database: str
) -> None:
    figures = await measure(pg_cluster, template_database, receipts=1_500, repetitions=2)

    work = workload(1_500)
    distinct = {(r.message_id, r.level) for batch in work.batches for r in batch}
    assert figures["receipts"] == work.receipts > len(distinct) == 2 * figures["messages"]
    for run in figures["runs"]["floor"]:
        assert run["rows"] == len(distinct)  # a redelivery is a no-op: one row a receipt
    for run in figures["runs"]["store"]:
        # Every receipt stored, its messages recorded first: applied once, redeliveries repeats.
        assert run["outcomes"] == {
            "applied": len(distinct),
            "repeat": work.receipts - len(distinct),
        }
    for side in SIDES:
        assert len(figures["runs"][side]) == 2
        assert figures["median"][side]["receipts_per_s"] > 0
        assert figures["median"][side]["wal_bytes"] > 0
    ratios = [
        s["receipts_per_s"] / f["receipts_per_s"]
        for s, f in zip(figures["runs"]["store"], figures["runs"]["floor"], strict=True)
    ]
    assert figures["rate_ratio"] == round(statistics.median(ratios), 3) > 0

    section = "\n".join(report_section(figures))
    store, floor = figures["median"]["store"], figures["median"]["floor"]
    assert (
        f"| `Store.ingest` | {store['receipts_per_s']:,.0f} | {store['server_cpu_us']:.1f} |"
        in section
    )
    assert (
        f"| write floor | {floor['receipts_per_s']:,.0f} | {floor['server_cpu_us']:.1f} |"
        in section
    )
    assert f"**{figures['rate_ratio']:.2f}** of the floor's rate" in section
