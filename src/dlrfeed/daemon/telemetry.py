"""What one daemon process tells its operator: Prometheus counters fed by the pipeline's
events, `/healthz`, the periodic `summary` log, the systemd watchdog and STATUS line.

One source of truth per counter: receipts, outcomes and batches are counted once, in the
Prometheus counters of `DaemonMetrics`; the Acker, the readers and the gate keep their own plain
totals, which Prometheus reads at scrape time. The summary and the STATUS line read the same
counters (`DaemonMetrics.totals`), never a tally of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.feed.reader import Mode

from .metrics import DaemonMetrics, RouteFigures
from .sdnotify import SystemdNotifier

if TYPE_CHECKING:
    from dlrfeed.store.store import IngestResult

    from .pipeline import Pipeline, PipelineStore

log = structlog.get_logger("dlrfeed.daemon")

# Outcomes that open an investigation-queue item (docs/spec/interfaces.md §4, exception kinds).
EXCEPTION_OUTCOMES = (
    Outcome.CONFLICT,
    Outcome.UNCORRELATED,
    Outcome.UNRECOGNIZED,
    Outcome.UNEXPECTED_LEVEL,  # a `malformed` exception (F4)
    Outcome.UNSTORABLE,
)

LEASE_WARNING_FRACTION = 0.5
"""Warn when a receipt's receive→ack latency passes this fraction of the lease (F6)."""

LEASE_WARNING_EVERY_SECONDS = 10.0
"""At most one `ack_latency_near_lease` warning this often: one slow spell, one line."""


QUALITY_DUTY = 0.02
"""The largest share of the time the route gauges' computation may take (ingest first)."""


class Telemetry:
    """The pipeline's observers (`pipeline.Observers`) and the operator's views of it."""

    def __init__(
        self,
        metrics: DaemonMetrics,
        *,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self._lease = lease_seconds
        self._clock = clock
        self._pipeline: Pipeline | None = None
        self._last_lease_warning = float("-inf")
        # Resolved once: `labels()` costs microseconds, and Subscribe counts every receipt.
        self._received_by_mode = {
            mode: metrics.received.labels(mode=mode.value) for mode in (Mode.SUBSCRIBE, Mode.PULL)
        }

    def watch(self, pipeline: Pipeline) -> None:
        """Read the pipeline's gauges and component totals at scrape time."""
        self._pipeline = pipeline
        self.metrics.track(
            in_flight=lambda: float(pipeline.in_flight()),
            store_up=lambda: 1.0 if pipeline.gate.is_up else 0.0,
            counters=lambda: component_counters(pipeline),
            backlogged=lambda: float(sum(1 for b in pipeline.batchers if b.backlogged)),
        )
        self.metrics.readers_configured.set(len(pipeline.readers))

    # -- observers (called by the pipeline) --------------------------------------------------
    def reader_state(self, reader: str, mode: Mode | None) -> None:
        self._refresh_readers_up()
        if mode is None:
            log.debug("reader_down", reader=reader)
        else:
            log.info("reader_up", reader=reader, mode=mode.value)

    def received(self, mode: Mode, count: int) -> None:
        self._received_by_mode[mode].inc(count)

    def committed(self, batch: Sequence[Receipt], result: IngestResult, seconds: float) -> None:
        m = self.metrics
        m.batches.inc()
        m.commit_seconds.observe(seconds)
        counts: Mapping[Outcome, int] = result.counts
        for outcome, count in counts.items():
            m.outcomes.labels(outcome=outcome.value).inc(count)
        # Receptions written: an unstorable receipt is kept as exception evidence instead (C8).
        m.stored.inc(len(batch) - counts.get(Outcome.UNSTORABLE, 0))
        m.repeats.inc(counts.get(Outcome.REPEAT, 0))
        m.conflicts.inc(counts.get(Outcome.CONFLICT, 0))
        m.exceptions.inc(sum(counts.get(outcome, 0) for outcome in EXCEPTION_OUTCOMES))
        m.delivery_count.observe_many(r.delivery_count for r in batch)

    def acked(self, received_at: Sequence[float], acked_at: float) -> None:
        latencies = [acked_at - t for t in received_at]
        self.metrics.receive_to_ack.observe_many(latencies)
        worst = max(latencies)
        lease = self._lease
        if lease and worst >= LEASE_WARNING_FRACTION * lease:
            now = self._clock()
            if now - self._last_lease_warning >= LEASE_WARNING_EVERY_SECONDS:
                self._last_lease_warning = now
                # F6: past the lease the gateway redelivers; the store sees repeats (C1).
                log.warning("ack_latency_near_lease", latency_s=round(worst, 3), lease_s=lease)

    def _refresh_readers_up(self) -> None:
        counts = {Mode.SUBSCRIBE: 0, Mode.PULL: 0}
        for reader in self._pipeline.readers if self._pipeline else ():
            if reader.mode is not None:
                counts[reader.mode] += 1
        for mode, count in counts.items():
            self.metrics.readers_up.labels(mode=mode.value).set(count)

    # -- the operator's views ---------------------------------------------------------------
    async def health(self, store: PipelineStore) -> tuple[bool, str]:
        """/healthz: ready only when every reader is up and the database answers."""
        pipeline = self._pipeline
        readers = pipeline.readers if pipeline else []
        down = [r.name for r in readers if r.mode is None]
        if not readers or down:
            return False, f"readers down: {', '.join(down) or 'none started'}"
        if pipeline is None or not pipeline.gate.is_up:
            return False, "store unavailable"
        try:
            async with asyncio.timeout(2.0):
                await store.ping()
        except (StoreUnavailableError, TimeoutError):
            return False, "store not answering"
        modes = ",".join(sorted(r.mode.value for r in readers if r.mode is not None))
        return True, f"ok readers={len(readers)} modes={modes}"

    async def summaries(self, interval: float) -> None:
        """Log a `summary` every `interval` seconds, from the same counters as /metrics."""
        pipeline = self._pipeline
        assert pipeline is not None, "watch() first"
        last_stored = 0.0
        last_at = self._clock()
        while True:
            await asyncio.sleep(interval)
            totals = self.metrics.totals
            acks = pipeline.acker.stats
            now = self._clock()
            log.info(
                "summary",
                stored=totals.stored,
                per_s=round((totals.stored - last_stored) / max(now - last_at, 1e-9), 1),
                acked=acks.tokens_acked,
                already_gone=acks.already_gone,
                repeats=totals.repeats,
                conflicts=totals.conflicts,
                exceptions=totals.exceptions,
                in_flight=pipeline.in_flight(),
                readers={r.name: (r.mode.value if r.mode else "down") for r in pipeline.readers},
                store_up=pipeline.gate.is_up,
            )
            last_stored, last_at = totals.stored, now

    async def route_gauges(
        self, compute: Callable[[], Awaitable[Sequence[RouteFigures]]], interval: float
    ) -> None:
        """The route quality gauges (C6), computed now and every `interval` seconds - or
        less often, so that they never take more than QUALITY_DUTY of the time (a day of a
        busy store's traffic takes a while to read, and the ingest shares the server). A
        computation that fails keeps the last figures with one warning: the gauges are a report
        beside the ingest, and nothing about them may stop it (a refused login or privilege is
        logged as an error, and the next interval tries again)."""
        while True:
            started = self._clock()
            try:
                self.metrics.route_quality.update(await compute())
            except StoreUnavailableError as exc:
                log.warning("route_quality_unavailable", error=str(exc))
            except Exception as exc:  # a report's failure never stops the ingest
                log.exception("route_quality_failed", error=str(exc))
            took = self._clock() - started
            await asyncio.sleep(max(interval - took, took * (1 / QUALITY_DUTY - 1)))

    async def watchdog(self, notifier: SystemdNotifier, interval: float) -> None:
        """WATCHDOG=1 while the event loop turns. A database outage does not stop the pings:
        restarting cannot cure it, and the daemon recovers by itself (no crash loop)."""
        while True:
            notifier.notify(WATCHDOG="1", STATUS=self.status_line())
            await asyncio.sleep(interval)

    def status_line(self) -> str:
        """systemd's STATUS=: stored, repeats, in flight, store state."""
        totals = self.metrics.totals
        pipeline = self._pipeline
        store = "up" if pipeline is None or pipeline.gate.is_up else "DOWN"
        in_flight = pipeline.in_flight() if pipeline else 0
        return (
            f"stored={totals.stored} repeats={totals.repeats} in_flight={in_flight} store={store}"
        )


def component_counters(pipeline: Pipeline) -> dict[str, float]:
    """The counters whose one source is a component's own total (`CALLBACK_COUNTERS`)."""
    acks = pipeline.acker.stats
    return {
        "acks_tokens": acks.tokens_acked,
        "acks_already_gone": acks.already_gone,
        "ack_calls": acks.ack_calls,
        "ack_retries": acks.ack_retries,
        "acks_given_up": acks.tokens_given_up,
        "reader_reconnects": sum(r.reconnects for r in pipeline.readers),
        "store_outages": pipeline.gate.outages,
    }
