"""The growth benchmark's traffic has the shape it claims (scripts/bench_growth.py)."""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dlrfeed_tools.bench.growth_configs import config_sizes
from dlrfeed_tools.bench.growth_report import (
    config_result,
    markdown,
    merged_reports,
    report_key,
)
from dlrfeed_tools.bench.growth_traffic import (
    BATCHES_PER_ROUND,
    LATE_SHARE,
    MESSAGES_PER_BATCH,
    Traffic,
)
from dlrfeed_tools.bench.sender_time import Reading, SenderClock


def test_traffic_is_gateway_shaped() -> None:
    traffic = Traffic(seed=3)
    first_round = traffic.submissions()
    batches = [traffic.batch(i) for i in range(BATCHES_PER_ROUND)]
    second_round = {s.message_id for s in traffic.submissions()}
    fresh = MESSAGES_PER_BATCH * BATCHES_PER_ROUND
    # Random UUID-like ids, recorded ahead of their receipts; 2 % held back to the next round.
    assert all(uuid.UUID(s.message_id).version == 4 for s in first_round)
    assert len(first_round) == fresh - int(fresh * LATE_SHARE)
    first_ids = {s.message_id for s in first_round}
    progressed = {r.message_id for b in batches for r in b if r.level == 1}
    held_back = progressed - first_ids
    assert len(held_back) == int(fresh * LATE_SHARE)
    assert held_back <= second_round  # recorded late, in the next round's call
    # A message's result comes one batch after its progress, never in the same batch.
    for earlier, later in itertools.pairwise(batches):
        progress = {r.message_id for r in earlier if r.level == 1 and r.delivery_count == 1}
        results = {r.message_id for r in later if r.level == 2 and r.delivery_count == 1}
        assert results == progress
        assert not {r.message_id for r in earlier if r.level == 2} & progress
    # ~5 % of each batch repeats a receipt of the batch before, as a redelivery.
    repeats = Counter(r.delivery_count for b in batches[1:] for r in b)
    share = repeats[2] / sum(repeats.values())
    assert 0.04 < share < 0.06


def test_each_configuration_may_grow_to_its_own_size() -> None:
    assert config_sizes("default=8000000,recommended", 20_000_000) == {
        "default": 8_000_000,
        "recommended": 20_000_000,
    }
    with pytest.raises(ValueError, match="unknown configuration 'fast'"):
        config_sizes("default,fast", 1)


STEP = {
    "stored": 1_000_000,
    "receptions_per_s": 3000,
    "client_cpu_us": 90.0,
    "server_cpu_us": 160.0,
    "batch_p50_ms": 120.0,
    "batch_p99_ms": 200.0,
    "submissions_p50_ms": 300.0,
    "submissions_p99_ms": 500.0,
    "submissions_max_ms": 600.0,
    "submissions_server_cpu_max_ms": 400.0,
    "wal_bytes_per_reception": 2400,
    "disk_bytes_per_reception": 1700,
    "checkpoints": 1,
}


def one_run(configs: dict[str, Any]) -> dict[str, Any]:
    """A report of one run holding `configs`."""
    return {
        "command": "c",
        "when": "w",
        "machine": "m",
        "receipt_bytes": 223,
        "batch_receptions": 525,
        "configs": configs,
    }


def test_an_interrupted_configuration_is_reported_as_stopped_with_its_disk_profile() -> None:
    step = dict(STEP)
    sizes = {"receptions": {"(table)": 485_000_000, "receptions_pkey": 101_000_000}}
    result = config_result("default", 20_000_000, [step], sizes)
    assert not result["complete"]
    assert result["bytes_per_reception_by_table"] == {"receptions": 586}
    text = markdown(one_run({"default": result}))
    assert "**Reached 1,000,000 of 20,000,000 receptions**" in text
    assert "| receptions receptions_pkey | 101 |" in text


def test_the_row_profile_lists_each_tables_columns_largest_first_and_survives_a_merge() -> None:
    row_bytes = {
        "events": {"rows_per_reception": 0.951, "row": 269.0, "message_id": 37.0, "level": 8.0},
        "receptions": {
            "rows_per_reception": 1.0,
            "row": 469.2,
            "message_id": 37.0,
            "payload": 227.0,
            "id": 8.0,
            "level": 8.0,
        },
    }
    result = config_result("default", 1_000_000, [STEP], {}, "daemon", row_bytes)
    text = markdown(merged_reports([one_run({"default": result})]))
    assert "| receptions | 1 | 469.2 | payload 227, message_id 37, id 8, level 8 |" in text
    # The widest rows first.
    assert text.index("| receptions | 1 |") < text.index("| events | 0.951 | 269 |")
    # A configuration measured before the profile existed renders as it did.
    assert "Where a row's bytes go" not in markdown(
        one_run({"default": config_result("default", 1_000_000, [STEP], {})})
    )


def test_reports_of_different_runs_merge_each_configuration_naming_its_own_run() -> None:
    def saved(when: str, name: str, stored: int) -> dict[str, object]:
        result = config_result(name, stored, [dict(STEP, stored=stored)], {})
        return {
            "command": f"python scripts/bench_growth.py --configs {name}",
            "when": when,
            "machine": "2 CPUs",
            "receipt_bytes": 223,
            "batch_receptions": 525,
            "configs": {name: result},
        }

    text = markdown(
        merged_reports(
            [
                saved("2026-11-30", "default", 8_000_000),
                saved("2026-12-01", "recommended", 1_000_000),
            ]
        )
    )
    assert "merged from the saved reports of several runs" in text
    assert (
        "From the run of 2026-11-30 (2 CPUs): `python scripts/bench_growth.py --configs default`"
        in text
    )
    assert (
        "From the run of 2026-12-01 (2 CPUs): `python scripts/bench_growth.py --configs rec" in text
    )
    # A merged report merges again with a later run, each configuration still naming its own.
    again = markdown(
        merged_reports(
            [
                merged_reports(
                    [
                        saved("2026-11-30", "default", 8_000_000),
                        saved("2026-12-01", "recommended", 1_000_000),
                    ]
                ),
                saved("2026-12-02", "shared_buffers", 1_000_000),
            ]
        )
    )
    assert "From the run of 2026-11-30 (2 CPUs)" in again
    assert "From the run of 2026-12-02 (2 CPUs)" in again
    assert "From the run of None" not in again
    # One run's reports merge as before: its command heads the report.
    alone = markdown(merged_reports([saved("2026-12-01", "recommended", 1_000_000)]))
    assert "- command: `python scripts/bench_growth.py --configs recommended`" in alone
    assert "From the run of" not in alone


def test_a_run_through_the_daemon_has_its_own_section_with_the_daemons_memory() -> None:
    result = config_result("recommended", 1_000_000, [dict(STEP, daemon_rss_mb=63.0)], {}, "daemon")
    key = report_key("recommended", "daemon")
    report = one_run(
        {
            "recommended": config_result("recommended", 1_000_000, [STEP], {}),
            key: result,
        }
    )
    text = markdown(report)
    assert "## recommended\n" in text
    assert f"## {key}\n" in text
    assert text.count("daemon RSS MB") == 1  # the daemon's section alone has the column
    assert "| 63.0 |" in text
    assert "one long-lived `dlrfeed run`" in text.split(f"## {key}")[1]
    assert "one `Store` in the benchmark's process" in text.split(f"## {key}")[0]


def test_the_slowest_record_submissions_is_reported_with_its_cpu_and_the_others() -> None:
    # Backend 300 connected during the call: it counts from zero. Ticks are the kernel's.
    before = Reading({100: 5_000_000, 200: 0}, busy_ticks=1_000, idle_ticks=500)
    after = Reading({100: 45_000_000, 200: 60_000_000, 300: 2_000_000}, 1_030, 502)
    call = SenderClock.between(before, after)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert call.cpu_ms == 102.0
    assert call.others_cpu_ms == pytest.approx(30 * tick_ms - 102.0)
    assert call.idle_ms == pytest.approx(2 * tick_ms)
    steps: list[dict[str, Any]] = [
        dict(STEP, submissions_max_ms=600.0, **call.columns()),
        dict(
            STEP,
            stored=2_000_000,
            submissions_max_ms=1_100.0,
            submissions_max_cpu_ms=310.0,
            submissions_max_others_cpu_ms=760.0,
            submissions_max_idle_ms=30.0,
            submissions_max_waits={"CPU": 0.5, "Lock:advisory": 0.3, "client": 0.2},
        ),
    ]
    result = config_result("recommended", 2_000_000, steps, {}, "daemon")
    assert result["targets"]["max_record_submissions_ms"] == 1_100.0
    assert result["targets"]["slowest_record_submissions_cpu_ms"] == 310.0
    assert result["targets"]["slowest_record_submissions_others_cpu_ms"] == 760.0
    assert result["targets"]["slowest_record_submissions_idle_ms"] == 30.0
    assert (
        result["targets"]["slowest_record_submissions_backend"]
        == "CPU 50%, Lock:advisory 30%, client 20%"
    )
    text = markdown(one_run({"recommended through the daemon": result}))
    assert "| slowest subs: its CPU ms | others' CPU ms | idle ms |" in text
    assert "| 310.0 | 760.0 | 30.0 |" in text
    # Only the step whose slowest call was sampled has a line in the table of waits.
    assert "| 2,000,000 | 1,100.0 | CPU 50%, Lock:advisory 30%, client 20% |" in text
    assert "| 1,000,000 | 600.0 |" not in text


def test_the_committed_growth_report_is_its_saved_json_rendered() -> None:
    """docs/benchmarks-growth.md is generated: a hand edit (or a renderer change the report was
    not regenerated after) would make the figures the docs quote disagree with the runs."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    saved = json.loads((docs / "benchmarks-growth.json").read_text(encoding="utf-8"))
    assert (docs / "benchmarks-growth.md").read_text(encoding="utf-8") == markdown(saved), (
        "docs/benchmarks-growth.md is stale: run `python scripts/bench_growth.py --render "
        "docs/benchmarks-growth.json --out docs/benchmarks-growth.md` and commit it"
    )
