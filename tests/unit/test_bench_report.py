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
    return {"feed": summary(feed), "store": summary(store), "e2e": summary(e2e)}


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
        # subscribe: c = 6,000 vs min(a, b) = 8,000 -> 0.75 (met); vs naive 250 -> 24 (met)
        # pull: c = 5,000 vs min(a, b) = 10,000 -> 0.50 (not met); vs naive -> 20 (met)
        "configurations": {
            "subscribe 1x2": _figures(
                [9_000, 10_000, 11_000], [7_000, 8_000, 9_000], [5_000, 6_000, 6_500]
            ),
            "pull 1x2": _figures(
                [60_000, 70_000, 80_000], [9_000, 10_000, 12_000], [4_000, 5_000, 5_500]
            ),
        },
        "naive": summary([240.0, 250.0, 300.0]),
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
                "peak_rss_mb": 130.0,
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
    assert "6,000 (5,000-6,500) | 0.75 met | 24.0 met |" in report
    assert "5,000 (4,000-5,500) | 0.50 **not met** | 20.0 met |" in report
    assert "| (d) naive consumer | | | 250 (240-300) | | 1 |" in report
    # 130 MB breaks both the 120 MB bound and flatness.
    assert "| 1,000,000 | 300,000 (time-bounded) | 35.0 | 130.0 **not met** |" in report
    assert "60.0-130.0 MB): **not met**" in report
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
    """Subscribe's rate and daemon CPU per receipt against Pull's of the same shape, with
    verdicts; and each mode's 2-process configuration against its 1-process one."""
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
    # 1x2: 6,000 / 5,000 and 30 / 24; 2x2: 9,000 / 10,000 and 45 / 30.
    assert "| `subscribe 1x2` | 1.20 met | 30 / 24 = 1.25 met |" in section
    assert "| `subscribe 2x2` | 0.90 met | 45 / 30 = 1.50 **not met** |" in section
    assert "| pull | `pull 1x2` → `pull 2x2` | 5,000 → 10,000 | 2.00 | 24 → 30 |" in section
    assert "| subscribe | `subscribe 1x2` → `subscribe 2x2` | 6,000 → 9,000 | 1.50 |" in section
    walls = report.split("### What stops the targets not met", 1)[1]
    # 2x2 misses its CPU target: 45 + 10 + 30 µs against 30 + 10 + 30, both 1.6 cores busy.
    assert "`subscribe 2x2` reaches 0.90 of `pull 2x2`'s rate at 1.50 x its" in walls
    assert "85 µs in all against 70" in walls
    assert "Subscribe can reach about 0.82 of Pull's rate" in walls
    assert "of `pull 1x2`'s rate" not in walls  # 1x2 meets both


def test_make_bench_keeps_the_hand_written_last_section() -> None:
    """The section measured by hand survives a new report, at its end, word for word."""
    kept = "## Measured by hand\n\nCandidate A against B: 1.10.\n"
    previous = render_report(_results(), kept)
    assert previous.endswith(kept)
    assert hand_written_section(previous) == kept
    assert render_report(_results(), hand_written_section(previous)) == previous
    assert hand_written_section(render_report(_results())) == ""


def test_subscribe_against_pull_with_the_gateway_apart() -> None:
    """The production-shaped measurement gets its own table, a line at a glance per placement,
    and a sentence in the wall of a Subscribe configuration missing its targets beside it."""
    results = _results()
    results["cpu_us_per_receipt"] = {
        "subscribe 1x2": _daemon_cpu(31.0),
        "pull 1x2": _daemon_cpu(30.0),
    }
    results["gateway_apart"] = {
        "gateway_cpus": [0],
        "consumer_cpus": [1],
        "configurations": {
            "subscribe 1x2": {
                "e2e": summary([16_000, 17_000, 17_500]),
                "cpu": {"fakegw": 19.0, "postgres": 26.0, "daemon": 28.0, "cores_busy": 1.3},
            },
            "pull 1x2": {
                "e2e": summary([17_000, 17_500, 18_000]),
                "cpu": {"fakegw": 8.0, "postgres": 26.0, "daemon": 27.0, "cores_busy": 1.1},
            },
        },
    }
    report = render_report(results)
    section = report.split("## Subscribe against Pull, the gateway on a CPU of its own", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert "pinned to CPU 0 and PostgreSQL and the daemon to CPU 1 for" in section
    # 17,000 / 17,500 = 0.97; 28 / 27 = 1.04.
    assert (
        "| `subscribe 1x2` | 17,000 (16,000-17,500) | 0.97 met | 28 | 1.04 met | 19 | 26 | 1.30 |"
        in section
    )
    assert "| `pull 1x2` | 17,500 (17,000-18,000) |  | 27 |  | 8 | 26 | 1.10 |" in section
    glance = report.split("## Targets at a glance", 1)[1]
    # Sharing the cores: 6,000 / 5,000 = 1.20 and 31 / 30 = 1.03.
    assert "fakegw sharing the cores: `subscribe 1x2` rate 1.20 (met, ≥ 0.85)" in glance
    assert "a CPU of its own: `subscribe 1x2` rate 0.97 (met, ≥ 0.85), daemon CPU 1.04" in glance
    results["configurations"]["subscribe 1x2"]["e2e"] = summary([3_000, 4_000, 4_500])
    walls = render_report(results).split("### What stops the targets not met", 1)[1]
    assert "`subscribe 1x2` reaches 0.80 of `pull 1x2`'s rate" in walls
    assert "With the gateway on a CPU of its own" in walls
    assert "it reaches 0.97 of Pull's rate at 1.04 x its daemon CPU." in walls


def test_the_gateway_apart_names_every_consumer_cpu() -> None:
    """On a larger machine the consumer gets every CPU but the gateway's, and the text says so."""
    results = _results()
    results["gateway_apart"] = {
        "gateway_cpus": [0],
        "consumer_cpus": [1, 2, 3],
        "configurations": {
            "pull 1x2": {
                "e2e": summary([17_000, 17_500, 18_000]),
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
