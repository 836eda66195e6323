"""The route quality gauges (C6): bounded cardinality whatever routes the sender names."""

from __future__ import annotations

import asyncio

import pytest
import structlog.testing
from prometheus_client import generate_latest

from dlrfeed.daemon import telemetry
from dlrfeed.daemon.metrics import OTHER_ROUTES, DaemonMetrics, RouteFigures
from dlrfeed.domain.quality import DONE_AT_SUBMIT, SIGNALS, UNIFORM_LATENCY
from dlrfeed.errors import StoreUnavailableError


def _samples(metrics: DaemonMetrics, name: str) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for family in metrics.route_quality.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def test_the_busiest_routes_by_name_and_every_other_as_one_series() -> None:
    metrics = DaemonMetrics(quality_routes=3)
    assert _samples(metrics, "dlrfeed_route_suspicious") == {}  # nothing computed yet
    routes = [RouteFigures(f"r{n}", (), 0.1) for n in range(50)]
    routes[1] = RouteFigures("r1", (DONE_AT_SUBMIT,), 0.9)
    routes[40] = RouteFigures("r40", (UNIFORM_LATENCY,), 0.5)
    metrics.route_quality.update(routes)
    assert _samples(metrics, "dlrfeed_route_suspicious") == {
        ("r0",): 0.0,
        ("r1",): 1.0,
        ("r2",): 0.0,
        (OTHER_ROUTES,): 1.0,  # r40, among the others
    }
    signals = _samples(metrics, "dlrfeed_route_signal")
    assert len(signals) == 4 * len(SIGNALS)
    assert signals[("r1", DONE_AT_SUBMIT)] == 1.0
    assert signals[(OTHER_ROUTES, UNIFORM_LATENCY)] == 1.0
    assert signals[(OTHER_ROUTES, DONE_AT_SUBMIT)] == 0.0
    assert _samples(metrics, "dlrfeed_route_verification_gap")[(OTHER_ROUTES,)] == 0.5
    # A later computation replaces the series: a route gone is gone.
    metrics.route_quality.update([RouteFigures("r9", (), None)])
    assert _samples(metrics, "dlrfeed_route_suspicious") == {("r9",): 0.0}
    assert _samples(metrics, "dlrfeed_route_verification_gap") == {}
    assert b'dlrfeed_route_suspicious{route="r9"} 0.0' in generate_latest(metrics.registry)


async def test_the_gauges_take_at_most_their_duty_of_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ingest first: a computation that took 10 s waits 490 s (2 %), a quick one the interval;
    a store that does not answer keeps the last figures."""
    now = [0.0]
    waits: list[float] = []
    took = iter([10.0, 0.5])

    async def compute() -> list[RouteFigures]:
        now[0] += next(took)
        if len(waits) == 1:
            raise StoreUnavailableError("down")
        return [RouteFigures("r", (DONE_AT_SUBMIT,), 0.9)]

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise asyncio.CancelledError

    monkeypatch.setattr(asyncio, "sleep", sleep)  # the gauges' wait, never really waited
    metrics = DaemonMetrics()
    watcher = telemetry.Telemetry(metrics, lease_seconds=120, clock=lambda: now[0])
    with pytest.raises(asyncio.CancelledError):
        await watcher.route_gauges(compute, 300.0)
    assert waits == [pytest.approx(490.0), pytest.approx(299.5)]
    assert _samples(metrics, "dlrfeed_route_suspicious") == {("r",): 1.0}


async def test_a_failing_computation_keeps_the_last_figures_and_never_stops_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever a computation raises (a refused login, a bug), the gauges keep their figures
    and the next interval computes again: the report never ends the ingest beside it."""
    calls = [0]

    async def compute() -> list[RouteFigures]:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("password authentication failed")
        return [RouteFigures("r", (DONE_AT_SUBMIT,), 0.9)]

    async def sleep(_seconds: float) -> None:
        if calls[0] == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(asyncio, "sleep", sleep)
    metrics = DaemonMetrics()
    watcher = telemetry.Telemetry(metrics, lease_seconds=120, clock=lambda: 0.0)
    with structlog.testing.capture_logs() as logs, pytest.raises(asyncio.CancelledError):
        await watcher.route_gauges(compute, 300.0)
    assert calls[0] == 3
    assert [e["event"] for e in logs] == ["route_quality_failed"]
    assert _samples(metrics, "dlrfeed_route_suspicious") == {("r",): 1.0}
