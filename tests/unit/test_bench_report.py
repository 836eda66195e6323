"""The benchmark report: figures, ratios and verdicts rendered from synthetic results.

No benchmark runs here and nothing depends on wall-clock time: `render_report` is pure.
"""

from __future__ import annotations

from typing import Any

import pytest

from dlrfeed_tools.bench.latency import latency_id, received_by_mode
from dlrfeed_tools.bench.profile import summarise_profile
from dlrfeed_tools.bench.report import hand_written_section, ratios, render_report
from dlrfeed_tools.bench.run import quantile, summary
from dlrfeed_tools.metrics import histogram_quantile


def _figures(feed: list[float], store: list[float], e2e: list[float]) -> dict[str, Any]:
    return {"feed": _runs(feed), "store": _runs(store), "e2e": _runs(e2e)}


def _runs(values: list[float]) -> dict[str, Any]:
    """A figure as `bench.run` records it: its summary and each repetition's value."""
    return summary(values) | {"runs": values}


def _results() -> dict[str, Any]:
    return {
        "machine": {
            "nproc": 2,
            "cpu": "Test CPU",
            "kernel": "6.0",
            "load_at_start": (1.0, 1.0, 1.0),
            "load_at_end": (2.0, 2.0, 2.0),
            "python": "3.11.7",
            "grpcio": "1.66.0",
            "packages": {"grpcio": "1.66.0", "asyncpg": "0.30.0"},
            "postgres": "postgres (PostgreSQL) 15.0",
        },
        "postgres_settings": {"fsync": "on"},
        "sizes": {
            "e2e_receipts": 30_000,
            "repetitions": 3,
            "naive_receipts": 1_500,
            "backlog_time_limit_s": 35.0,
            "latency_seconds": 20.0,
            "latency_warmup_seconds": 3.0,
            "profile_seconds": 10.0,
        },
        "wall_seconds": 600,
        # subscribe: c = 6,000 vs min(a, b) = 8,000 -> 0.75 (met); vs naive 200 -> 30 (met)
        # pull: c = 5,000 vs min(a, b) = 10,000 -> 0.50 (not met); vs naive -> 25 (met)
        "configurations": {
            "subscribe 1x2": _figures(
                [9_000, 10_000, 11_000], [7_000, 8_000, 9_000], [5_000, 6_000, 6_500]
            ),
            "pull 1x2": _figures(
                [60_000, 70_000, 80_000], [9_000, 10_000, 12_000], [4_000, 5_000, 5_500]
            ),
        },
        "naive": summary([190.0, 200.0, 240.0]),
        "backlogs": [
            {
                "backlog": 10_000,
                "acked": 10_000,
                "drained": True,
                "seconds": 2.0,
                "peak_rss_mb": 60.0,
            },
            {
                "backlog": 1_000_000,
                "acked": 300_000,
                "drained": False,
                "seconds": 35.0,
                "peak_rss_mb": 80.0,
            },
        ],
        "latency": {
            "rate": 3_000,
            "injected": 60_000,
            "measured": 51_000,
            "unacked": 0,
            "ledger_p50_ms": 120.0,
            "ledger_p99_ms": 240.0,
            "ledger_max_ms": 400.0,
            "histogram_p50_ms": 110.0,
            "histogram_p99_ms": 230.0,
            "histogram_bounds": [0.1, 0.25],
            "modes": {"subscribe": 60_000.0},
        },
        "profiles": [{"mode": "pull", "error": "py-spy not installed"}],
    }


def test_ratios_are_end_to_end_over_the_slower_ceiling_and_over_naive() -> None:
    """The ratios: c / min(a, b) and c / d, from the medians."""
    result = ratios(_figures([9e3, 1e4, 11e3], [7e3, 8e3, 9e3], [5e3, 6e3, 7e3]), 250.0)
    assert result["to_ceiling"] == pytest.approx(6_000 / 8_000)
    assert result["to_naive"] == pytest.approx(6_000 / 250)


def test_summary_is_median_with_min_and_max() -> None:
    """Each throughput figure is the median of the repetitions, min-max beside."""
    assert summary([3.0, 1.0, 10.0, 2.0, 5.0]) == {"median": 3.0, "min": 1.0, "max": 10.0}


def test_report_shows_figures_ratios_and_verdicts() -> None:
    """The table carries median (min-max), the two ratios and met / not met per target."""
    report = render_report(_results())
    assert "| `subscribe 1x2` | 10,000 (9,000-11,000) | 8,000 (7,000-9,000) |" in report
    assert "6,000 (5,000-6,500) | 0.75 met | 30.0 met |" in report
    assert "5,000 (4,000-5,500) | 0.50 **not met** | 25.0 met |" in report
    assert "| (d) naive consumer | | | 200 (190-240) | | 1 |" in report
    # 80 MB breaks both the 70 MB bound and flatness.
    assert "| 1,000,000 | 300,000 (time-bounded) | 35.0 | 80.0 **not met** |" in report
    assert "60.0-80.0 MB): **not met**" in report
    assert "| fakegw ledger (enqueue → ack) | 51,000 | 120.0 | 240.0 met | 400.0 |" in report
    assert "No profile: py-spy not installed" in report
    assert "10.0 min" in report
    # The one ratio below target gets its wall explained; met targets get none.
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "`pull 1x2` reaches 0.50 of min(a, b)" in walls
    assert "subscribe 1x2" not in walls
    assert "p99 receive" not in walls


def test_quantiles_nearest_rank_and_from_histogram_buckets() -> None:
    """Latency p50/p99: exact from sorted values, interpolated from cumulative buckets."""
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    buckets = [(0.1, 50.0), (0.25, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.175)


def test_profile_summary_charges_samples_to_components() -> None:
    """Where the time goes: self frames and components from py-spy's collapsed stacks."""
    raw = (
        "main (dlrfeed/cli.py);ingest (dlrfeed/store/store.py);execute (asyncpg/connection.py) 6\n"
        "main (dlrfeed/cli.py);read (dlrfeed/feed/client.py);_read (grpc/aio/_call.py) 2\n"
        "main (dlrfeed/cli.py);read (dlrfeed/feed/client.py);_receive_message (cygrpc) 1\n"
        "main (dlrfeed/cli.py);loads (json/decoder.py) 1\n"
    )
    profile = summarise_profile(raw)
    assert profile["samples"] == 10
    assert dict(profile["categories"])["asyncpg"] == pytest.approx(60.0)
    grpc_share = dict(profile["categories"])["gRPC (grpcio's aio and cygrpc)"]
    assert grpc_share == pytest.approx(30.0)
    assert profile["self"][0] == ("execute (asyncpg/connection.py)", pytest.approx(60.0))
    assert ("ingest (dlrfeed/store/store.py)", pytest.approx(60.0)) in profile["inclusive"]


def test_missed_latency_target_names_commit_time_and_cpu() -> None:
    """A p99 above 250 ms is reported not met, with the commit and CPU figures."""
    results = _results()
    results["latency"] |= {
        "ledger_p99_ms": 300.0,
        "commit_p50_ms": 20.0,
        "commit_p99_ms": 90.0,
        "daemon_cpu_percent": 60,
    }
    report = render_report(results)
    assert "| 51,000 | 120.0 | 300.0 **not met** | 400.0 |" in report
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "Batch linger + commit p99 + ack linger = 190 ms" in walls
    assert "60 % of a core" in walls


def test_cpu_per_receipt_table_and_the_machine_bound_of_a_missed_ratio() -> None:
    """Where each receipt's CPU goes, per process; a missed ratio is set against the CPU bound
    (the slower ceiling's CPU per receipt over the end-to-end run's, at equal use of the cores)."""
    results = _results()
    results["cpu_us_per_receipt"] = {
        "pull 1x2": {
            "feed": {"fakegw": 10.0, "postgres": 0.0, "bench": 5.0, "cores_busy": 1.2},
            "store": {"fakegw": 0.0, "postgres": 40.0, "bench": 30.0, "cores_busy": 1.9},
            "e2e": {
                "fakegw": 10.0,
                "postgres": 40.0,
                "bench": 2.0,
                "daemon": 45.0,
                "cores_busy": 1.8,
            },
        }
    }
    report = render_report(results)
    assert "| `pull 1x2` | (b) store | 0 | 30 | 40 | 70 | 1.90 |" in report
    assert "| `pull 1x2` | (c) dlrfeed | 10 | 45 | 40 | 97 | 1.80 |" in report
    walls = report.split("### What stops the targets not met", 1)[1]
    # The store ceiling (10,000/s) is the slower one: 70 µs against 97 µs end to end.
    assert "can reach only about 0.72" in walls


def _daemon_cpu(us: float) -> dict[str, dict[str, float]]:
    return {
        "feed": {"fakegw": 10.0, "postgres": 0.0, "bench": 20.0, "cores_busy": 1.5},
        "store": {"fakegw": 0.0, "postgres": 30.0, "bench": 20.0, "cores_busy": 1.5},
        "e2e": {"fakegw": 10.0, "postgres": 30.0, "daemon": us, "cores_busy": 1.6},
    }


def test_subscribe_against_pull_and_what_a_second_process_gives() -> None:
    """Subscribe's rate and daemon CPU per receipt beside Pull's of the same shape, with no
    target and where its extra CPU goes; and each mode's 2-process configuration against its
    1-process one."""
    results = _results()
    results["configurations"]["subscribe 2x2"] = _figures([1.0] * 3, [1.0] * 3, [9_000] * 3)
    results["configurations"]["pull 2x2"] = _figures([1.0] * 3, [1.0] * 3, [10_000] * 3)
    results["cpu_us_per_receipt"] = {
        "subscribe 1x2": _daemon_cpu(30.0),
        "pull 1x2": _daemon_cpu(24.0),
        "subscribe 2x2": _daemon_cpu(45.0),
        "pull 2x2": _daemon_cpu(30.0),
    }
    report = render_report(results)
    section = report.split("## Subscribe against Pull", 1)[1].split("\n## ", 1)[0]
    # 1x2: 6,000 / 5,000 and 30 / 24; 2x2: 9,000 / 10,000 and 45 / 30: figures, no verdicts.
    assert "| `subscribe 1x2` | 1.20 (1.18-1.25) | 30 / 24 = 1.25 |" in section
    assert "| `subscribe 2x2` | 0.90 (0.90-0.90) | 45 / 30 = 1.50 |" in section
    assert "Subscribe is read by grpcio, a thread per stream" in section
    assert "| pull | `pull 1x2` → `pull 2x2` | 5,000 → 10,000 | 2.00 | 24 → 30 |" in section
    assert "| subscribe | `subscribe 1x2` → `subscribe 2x2` | 6,000 → 9,000 | 1.50 |" in section
    # Where Subscribe's CPU goes stays as explanation: 45 + 10 + 30 µs against 30 + 10 + 30,
    # both 1.6 cores busy.
    assert "`subscribe 2x2` runs at 0.90 of `pull 2x2`'s rate at 1.50 x its" in section
    assert "85 µs in all against 70" in section
    assert "it can reach about 0.82 of Pull's rate" in section
    assert "grpcio receives and wakes a thread once per message" in section
    assert "HTTP/2" not in report
    glance = report.split("## Targets at a glance", 1)[1].split("\n### ", 1)[0]
    assert (
        "- Subscribe against Pull, fakegw sharing the cores (reported, no target): "
        "`subscribe 1x2` rate 1.20, daemon CPU 1.25; `subscribe 2x2` rate 0.90, daemon CPU 1.50"
        in glance
    )
    # No `auto` measured, no `auto` target shown at a glance; Subscribe's figures are no wall.
    assert "`auto` against Pull" not in glance
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "`pull 1x2` reaches 0.50 of min(a, b)" in walls
    assert "subscribe 2x2" not in walls
    assert "of `pull 1x2`'s rate" not in walls


def _with_auto(e2e: float) -> dict[str, Any]:
    """The synthetic results with `auto 1x2` at `e2e` receipts/s end to end (`pull 1x2`: 5,000)."""
    results = _results()
    # min(a, b) = 6,000: c / min(a, b) ≥ 0.70 for either rate the tests give it.
    results["configurations"]["auto 1x2"] = _figures(
        [5_000, 6_000, 7_000], [5_500, 6_500, 7_500], [e2e - 100, e2e, e2e + 100]
    )
    results["cpu_us_per_receipt"] = {
        "subscribe 1x2": _daemon_cpu(30.0),
        "pull 1x2": _daemon_cpu(24.0),
        "auto 1x2": _daemon_cpu(25.0),
    }
    return results


def test_auto_at_095_of_pull_meets_its_target() -> None:
    """`auto` at 0.96 of Pull's rate: met in its table and at a glance, with no wall."""
    report = render_report(_with_auto(4_800))
    section = report.split("## Subscribe against Pull", 1)[1].split("\n## ", 1)[0]
    header = "| c / c of pull, median (min-max) of the repetitions (target for `auto` ≥ 0.95) |"
    assert header in section
    assert "must reach 0.95 of it" in section
    assert "| `auto 1x2` | 0.96 (0.89-1.18) met | 25 / 24 = 1.04 |" in section
    assert "| `subscribe 1x2` | 1.20 (1.18-1.25) | 30 / 24 = 1.25 |" in section
    glance = report.split("## Targets at a glance", 1)[1].split("\n### ", 1)[0]
    line = "- `auto` against Pull, fakegw sharing the cores: `auto 1x2` rate 0.96 (met, ≥ 0.95)"
    assert line in glance
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "`auto 1x2` reaches" not in walls


def test_auto_below_095_of_pull_is_not_met_and_explained() -> None:
    """`auto` at 0.90 of Pull's rate: not met in its table and at a glance, and its wall says
    what it pays on Subscribe before its switch, with this run's CPU figures."""
    report = render_report(_with_auto(4_500))
    section = report.split("## Subscribe against Pull", 1)[1].split("\n## ", 1)[0]
    assert "| `auto 1x2` | 0.90 (0.84-1.10) **not met** | 25 / 24 = 1.04 |" in section
    glance = report.split("## Targets at a glance", 1)[1].split("\n### ", 1)[0]
    assert "`auto 1x2` rate 0.90 (**not met**, ≥ 0.95)" in glance
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "- `auto 1x2` reaches 0.90 of `pull 1x2`'s rate (target ≥ 0.95) at 1.04 x its" in walls
    # 25 + 10 + 30 µs against 24 + 10 + 30, both 1.6 cores busy: 64 / 65.
    assert "65 µs in all against 64" in walls
    assert "it can reach about 0.98 of Pull's rate" in walls
    assert "grpcio receives and wakes a thread once per message" in walls


def test_auto_against_pull_is_the_median_of_the_ratios_within_each_repetition() -> None:
    """Each repetition measures both: its ratio leaves out the machine's drift between
    repetitions, which the ratio of the two medians (4,600 / 5,000 = 0.92) keeps."""
    results = _with_auto(4_800)
    results["configurations"]["auto 1x2"]["e2e"] = _runs([3_900, 4_600, 5_300])
    report = render_report(results)
    section = report.split("## Subscribe against Pull", 1)[1].split("\n## ", 1)[0]
    # 3,900 / 4,000 = 0.975, 4,600 / 5,000 = 0.92, 5,300 / 5,500 = 0.964: the median 0.964.
    assert "| `auto 1x2` | 0.96 (0.92-0.97) met | 25 / 24 = 1.04 |" in section
    assert "the median of the ratios within each repetition" in section


def test_make_bench_keeps_the_hand_written_last_section() -> None:
    """The section measured by hand survives a new report, at its end, word for word."""
    kept = "## Measured by hand\n\nCandidate A against B: 1.10.\n"
    previous = render_report(_results(), kept)
    assert previous.endswith(kept)
    assert hand_written_section(previous) == kept
    assert render_report(_results(), hand_written_section(previous)) == previous
    assert hand_written_section(render_report(_results())) == ""


def _apart(*names: str) -> dict[str, Any]:
    """fakegw on CPU 0, the consumer on CPU 1, with these of the measured configurations."""
    measured = {
        "subscribe 1x2": {
            "e2e": _runs([16_000, 17_000, 17_500]),
            "cpu": {"fakegw": 19.0, "postgres": 26.0, "daemon": 28.0, "cores_busy": 1.3},
        },
        "auto 1x2": {
            "e2e": _runs([15_000, 16_000, 16_500]),
            "cpu": {"fakegw": 9.0, "postgres": 26.0, "daemon": 27.0, "cores_busy": 1.1},
        },
        "pull 1x2": {
            "e2e": _runs([17_000, 17_500, 18_000]),
            "cpu": {"fakegw": 8.0, "postgres": 26.0, "daemon": 27.0, "cores_busy": 1.1},
        },
    }
    return {
        "gateway_cpus": [0],
        "consumer_cpus": [1],
        "configurations": {name: measured[name] for name in names},
    }


def test_subscribe_against_pull_with_the_gateway_apart() -> None:
    """The production-shaped measurement gets its own table, a line at a glance per placement,
    and a sentence in the explanation of a Subscribe configuration's CPU beside it; Subscribe's
    ratios carry no verdict."""
    results = _results()
    results["cpu_us_per_receipt"] = {
        "subscribe 1x2": _daemon_cpu(31.0),
        "pull 1x2": _daemon_cpu(30.0),
    }
    results["gateway_apart"] = _apart("subscribe 1x2", "pull 1x2")
    report = render_report(results)
    section = report.split("## Subscribe against Pull, the gateway on a CPU of its own", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert "pinned to CPU 0 and PostgreSQL and the daemon to CPU 1 for" in section
    # Per repetition 16,000 / 17,000, 17,000 / 17,500, 17,500 / 18,000: 0.94, 0.97, 0.97;
    # 28 / 27 = 1.04.
    row = "| `subscribe 1x2` | 17,000 (16,000-17,500) | 0.97 (0.94-0.97) | 28 | 1.04 | 19 | 26 |"
    assert f"{row} 1.30 |" in section
    assert "| `pull 1x2` | 17,500 (17,000-18,000) |  | 27 |  | 8 | 26 | 1.10 |" in section
    glance = report.split("## Targets at a glance", 1)[1]
    # Sharing the cores: 6,000 / 5,000 = 1.20 and 31 / 30 = 1.03.
    assert "fakegw sharing the cores (reported, no target): `subscribe 1x2` rate 1.20" in glance
    assert (
        "a CPU of its own (reported, no target): `subscribe 1x2` rate 0.97, daemon CPU 1.04"
        in glance
    )
    explained = report.split("## Subscribe against Pull", 1)[1].split("\n## ", 1)[0]
    assert "`subscribe 1x2` runs at 1.20 of `pull 1x2`'s rate" in explained
    assert "it reaches 0.97 of Pull's rate at 1.04 x its daemon CPU." in explained
    results["configurations"]["subscribe 1x2"]["e2e"] = _runs([3_000, 4_000, 4_500])
    walls = render_report(results).split("### What stops the targets not met", 1)[1]
    assert "of `pull 1x2`'s rate" not in walls


def test_auto_with_the_gateway_apart_has_its_target_in_both_placements() -> None:
    """`auto` measured with the gateway apart too: its verdict in that table and a line at a
    glance for each placement; a miss there is named in its wall."""
    results = _with_auto(4_800)
    results["gateway_apart"] = _apart("subscribe 1x2", "auto 1x2", "pull 1x2")
    report = render_report(results)
    section = report.split("## Subscribe against Pull, the gateway on a CPU of its own", 1)[1]
    section = section.split("\n## ", 1)[0]
    # Per repetition 0.88, 0.91, 0.92: the median 0.91; 27 / 27 = 1.00.
    row = "| `auto 1x2` | 16,000 (15,000-16,500) | 0.91 (0.88-0.92) **not met** | 27 | 1.00 |"
    assert row in section
    assert "| `subscribe 1x2` | 17,000 (16,000-17,500) | 0.97 (0.94-0.97) | 28 | 1.04 |" in section
    glance = report.split("## Targets at a glance", 1)[1]
    assert "- `auto` against Pull, fakegw sharing the cores: `auto 1x2` rate 0.96 (met" in glance
    assert (
        "- `auto` against Pull, the gateway on a CPU of its own: `auto 1x2` rate 0.91 "
        "(**not met**, ≥ 0.95)" in glance
    )
    results = _with_auto(4_500)
    results["gateway_apart"] = _apart("auto 1x2", "pull 1x2")
    walls = render_report(results).split("### What stops the targets not met", 1)[1]
    assert "`auto 1x2` reaches 0.90 of `pull 1x2`'s rate" in walls
    assert "it reaches 0.91 of Pull's rate at 1.00 x its daemon CPU." in walls


def test_naive_and_rss_targets() -> None:
    """c / d below 25 is not met, with the rate 25x needs; peak RSS is held to 70 MB for the
    backlogs up to 1 M (a larger one is shown without a verdict) and flat."""
    results = _results()
    results["naive"] = summary([240.0, 250.0, 300.0])
    results["backlogs"] = [
        {"backlog": 10_000, "acked": 10_000, "drained": True, "seconds": 2.0, "peak_rss_mb": 64.0},
        {
            "backlog": 1_000_000,
            "acked": 1_000_000,
            "drained": True,
            "seconds": 30.0,
            "peak_rss_mb": 69.0,
        },
        {
            "backlog": 2_000_000,
            "acked": 900_000,
            "drained": False,
            "seconds": 35.0,
            "peak_rss_mb": 72.0,
        },
    ]
    report = render_report(results)
    # 6,000 / 250 = 24.0; 5,000 / 250 = 20.0.
    assert "6,000 (5,000-6,500) | 0.75 met | 24.0 **not met** |" in report
    assert "| peak RSS MB (target ≤ 70 up to 1,000,000) |" in report
    assert "| 1,000,000 | 1,000,000 | 30.0 | 69.0 met |" in report
    assert "| 2,000,000 | 900,000 (time-bounded) | 35.0 | 72.0 |" in report
    assert "(met, ≤ 70 MB up to 1,000,000 and flat)" in report
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "c / d below 25 (`subscribe 1x2` 24.0x, `pull 1x2` 20.0x)" in walls
    assert "25x needs ≥ 6,250/s end to end" in walls
    assert "peak RSS" not in walls
    results["backlogs"][1]["peak_rss_mb"] = 71.0  # flat still (≤ 1.15 x 64), but above 70
    report = render_report(results)
    assert "| 1,000,000 | 1,000,000 | 30.0 | 71.0 **not met** |" in report
    assert "(**not met**, ≤ 70 MB up to 1,000,000 and flat)" in report
    walls = report.split("### What stops the targets not met", 1)[1]
    assert "- peak RSS 64.0-72.0 MB (target ≤ 70 MB up to 1,000,000 waiting, and flat)" in walls


def test_the_gateway_apart_names_every_consumer_cpu() -> None:
    """On a larger machine the consumer gets every CPU but the gateway's, and the text says so."""
    results = _results()
    results["gateway_apart"] = {
        "gateway_cpus": [0],
        "consumer_cpus": [1, 2, 3],
        "configurations": {
            "pull 1x2": {
                "e2e": _runs([17_000, 17_500, 18_000]),
                "cpu": {"fakegw": 8.0, "postgres": 26.0, "daemon": 27.0, "cores_busy": 1.1},
            },
        },
    }
    report = render_report(results)
    assert "pinned to CPU 0 and PostgreSQL and the daemon to CPUs 1, 2, 3 for" in report


def test_the_latency_run_reads_receipts_by_mode_from_the_daemon_metrics() -> None:
    text = (
        "# TYPE dlrfeed_receipts_received_total counter\n"
        'dlrfeed_receipts_received_total{mode="subscribe"} 8470.0\n'
        'dlrfeed_receipts_received_total{mode="pull"} 1.60587e+05\n'
        'dlrfeed_receipts_acked_total{mode="pull"} 7.0\n'
    )
    assert received_by_mode(text) == {"subscribe": 8470.0, "pull": 160587.0}
    assert latency_id("lat1-", 255) == "lat1-" + "0" * 22 + "ff"


def test_store_ingest_against_the_write_floor_in_its_section_and_at_a_glance() -> None:
    """Both writers' rates and CPU, the ratio of the rates, with no verdict."""
    side = {"server_cpu_us": 10.0, "client_cpu_us": 4.0, "wal_bytes": 520.0}
    results = _results() | {
        "write_floor": {
            "receipts": 20_000,
            "messages": 9_480,
            "batch_size": 500,
            "repetitions": 3,
            "median": {
                "store": side | {"receipts_per_s": 12_000.0, "server_cpu_us": 55.0},
                "floor": side | {"receipts_per_s": 96_000.0},
            },
            "rate_ratio": 0.125,
            "rate_ratios": [0.13, 0.125, 0.11],
        }
    }
    report = render_report(results)
    section = report.split("## Store.ingest against the write floor", 1)[1].split("\n## ", 1)[0]
    assert "| `Store.ingest` | 12,000 | 55.0 | 4.0 | 520 |" in section
    assert "| write floor | 96,000 | 10.0 | 4.0 | 520 |" in section
    assert "**0.12** of the floor's rate (repetitions: 0.13, 0.12, 0.11)" in section
    assert "PostgreSQL CPU per receipt 5.5 x the floor's" in section
    assert "59.0 against 14.0 µs per receipt" in section
    assert "- `Store.ingest` at 0.12 of the write floor's rate (reported, no target" in report
    assert "write floor" not in render_report(_results())
