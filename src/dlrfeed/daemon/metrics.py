"""Prometheus metrics of one daemon process, in a registry of its own.

Per-receipt histograms (delivery_count, receive→ack latency) are fed in bulk: `BulkHistogram`
counts with `bisect` into plain lists, because `prometheus_client.Histogram.observe` takes a
lock and costs ~1.5 µs a call — too much on a path that carries 20,000 receipts a second.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dlrfeed.domain.quality import SIGNALS

NAMESPACE = "dlrfeed"


class BulkHistogram(Collector):
    """A histogram observed a batch at a time; exposed like `prometheus_client.Histogram`."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # last = +Inf
        self._sum = 0.0

    def observe_many(self, values: Iterable[float]) -> None:
        """Count every value (one bisect and one add per value, no lock: one event loop)."""
        counts = self._counts
        bounds = self._bounds
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self._sum += total

    def collect(self) -> Iterator[Metric]:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self._bounds, self._counts, strict=False):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        cumulative += self._counts[-1]
        buckets.append(("+Inf", cumulative))
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets, self._sum)
        yield family

    @property
    def count(self) -> int:
        return sum(self._counts)


@dataclass(frozen=True, slots=True)
class Totals:
    """The receipt counters at one moment, for the summary log and the systemd STATUS line
    (read from the Prometheus counters: one source of truth)."""

    stored: int = 0
    repeats: int = 0
    conflicts: int = 0
    exceptions: int = 0


CALLBACK_COUNTERS: dict[str, str] = {
    "acks_tokens": "Tokens acked (removed from the queue by our Ack)",
    "acks_already_gone": "Tokens answered already_gone (F9: done, not an error)",
    "ack_calls": "Ack calls that succeeded",
    "ack_retries": "Ack calls retried after a transient failure",
    "acks_given_up": "Tokens not acked within the lease (redelivered, then repeats)",
    "reader_reconnects": "Feed streams or Pull loops reopened after a failure",
    "store_outages": "Times the store became unavailable",
}


class CallbackCounters(Collector):
    """Counters whose values live in the components (`CALLBACK_COUNTERS`), read at scrape."""

    def __init__(self, read: Callable[[], Mapping[str, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        values = self._read()
        for name, documentation in CALLBACK_COUNTERS.items():
            yield CounterMetricFamily(
                f"{NAMESPACE}_{name}", documentation, value=values.get(name, 0)
            )


OTHER_ROUTES = "(other)"
"""The one series of the routes past the busiest `--quality-routes`."""


@dataclass(frozen=True, slots=True)
class RouteFigures:
    """What the gauges say of one route: its signals and its DELIVRD-minus-verified gap."""

    route: str
    signals: tuple[str, ...]
    gap: float | None


class RouteQuality(Collector):
    """Route quality gauges (C6, docs/quality.md), from the latest `dlrfeed quality --by route`
    the daemon computed: the `limit` busiest routes by name, every other as OTHER_ROUTES, so
    the series stay bounded whatever routes the sender invents. Empty until the first one."""

    def __init__(self, limit: int, signals: Sequence[str]) -> None:
        self._limit = limit
        self._signals = tuple(signals)
        self._routes: list[RouteFigures] = []

    def update(self, routes: Sequence[RouteFigures]) -> None:
        """Replace the figures by `routes`, the busiest first."""
        named = list(routes[: self._limit])
        others = routes[self._limit :]
        if others:
            fired = {s for r in others for s in r.signals}
            gaps = [r.gap for r in others if r.gap is not None]
            named.append(
                RouteFigures(
                    OTHER_ROUTES,
                    tuple(s for s in self._signals if s in fired),
                    max(gaps) if gaps else None,
                )
            )
        self._routes = named

    def collect(self) -> Iterator[Metric]:
        suspicious = GaugeMetricFamily(
            f"{NAMESPACE}_route_suspicious",
            "1 when a signal of docs/quality.md fired for the route over the last 24 h "
            "(DLRs the sender's verifications contradict), else 0",
            labels=["route"],
        )
        signal = GaugeMetricFamily(
            f"{NAMESPACE}_route_signal",
            "1 when this signal fired for the route over the last 24 h, else 0",
            labels=["route", "signal"],
        )
        gap = GaugeMetricFamily(
            f"{NAMESPACE}_route_verification_gap",
            "On verifiable traffic of the route, the DELIVRD rate minus the verification rate "
            "over the last 24 h",
            labels=["route"],
        )
        for r in self._routes:
            suspicious.add_metric([r.route], 1.0 if r.signals else 0.0)
            for name in self._signals:
                signal.add_metric([r.route, name], 1.0 if name in r.signals else 0.0)
            if r.gap is not None:
                gap.add_metric([r.route], r.gap)
        yield from (suspicious, signal, gap)


class DaemonMetrics:
    """Every metric `dlrfeed run` exports; names are part of the operator's contract."""

    def __init__(self, quality_routes: int = 20) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.route_quality = RouteQuality(quality_routes, SIGNALS)
        r.register(self.route_quality)

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labelnames=labels, namespace=NAMESPACE, registry=r)

        self.received = counter("receipts_received", "Receipts received from the feed", ["mode"])
        self.stored = counter("receipts_stored", "Receipts committed to the store (receptions)")
        self.repeats = counter("receipts_repeats", "Receipts recognised as repeats (P14, C1)")
        self.conflicts = counter("receipts_conflicts", "Receipts conflicting with their event")
        self.exceptions = counter("receipts_exceptions", "Exceptions opened by ingested receipts")
        self.outcomes = counter(
            "receipts_outcomes", "Ingested receipts by store outcome (P14-P18)", ["outcome"]
        )
        self.batches = counter("batches_committed", "Batches committed to the store")
        self.commit_seconds = Histogram(
            "batch_commit_seconds",
            "Seconds per Store.ingest transaction",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.delivery_count = BulkHistogram(
            f"{NAMESPACE}_delivery_count",
            "delivery_count of received receipts (> 1: possible repeat, F6)",
            (1, 2, 3, 5, 10, 20),
        )
        self.receive_to_ack = BulkHistogram(
            f"{NAMESPACE}_receive_to_ack_seconds",
            "Seconds from receiving a receipt to the Ack that removed it (lease: F6)",
            # Fine around 0.1-0.5 s, where the p99 receive→ack target (250 ms) sits; coarse
            # up to the lease (F6).
            (
                0.01,
                0.025,
                0.05,
                0.075,
                0.1,
                0.15,
                0.2,
                0.25,
                0.3,
                0.4,
                0.5,
                0.75,
                1,
                2.5,
                5,
                10,
                30,
                60,
                90,
                120,
            ),
        )
        r.register(self.delivery_count)
        r.register(self.receive_to_ack)
        self.in_flight = Gauge(
            "receipts_in_flight",
            "Receipts received and not yet acked",
            namespace=NAMESPACE,
            registry=r,
        )
        self.readers_up = Gauge(
            "readers_up",
            "Readers with an open stream or pull loop",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        )
        for mode in ("subscribe", "pull"):
            self.readers_up.labels(mode=mode).set(0)
        self.store_up = Gauge(
            "store_up", "1 when the store accepts writes", namespace=NAMESPACE, registry=r
        )
        self.readers_configured = Gauge(
            "readers_configured",
            "Readers this process runs (--streams); readers_up adds up to it when all are up",
            namespace=NAMESPACE,
            registry=r,
        )
        self.readers_backlogged = Gauge(
            "readers_backlogged",
            "Readers holding receipts whose last batches closed full: the gateway had more "
            "waiting (its backlog as the daemon sees it; kept while nothing commits)",
            namespace=NAMESPACE,
            registry=r,
        )

    @property
    def totals(self) -> Totals:
        """The receipt counters now, as integers."""
        return Totals(
            stored=counter_value(self.stored),
            repeats=counter_value(self.repeats),
            conflicts=counter_value(self.conflicts),
            exceptions=counter_value(self.exceptions),
        )

    def track(
        self,
        in_flight: Callable[[], float],
        store_up: Callable[[], float],
        counters: Callable[[], Mapping[str, float]],
        backlogged: Callable[[], float],
    ) -> None:
        """Read gauges and the Acker/reader/gate totals at scrape time: the components keep
        plain integers, and nothing is counted twice."""
        self.in_flight.set_function(in_flight)
        self.store_up.set_function(store_up)
        self.readers_backlogged.set_function(backlogged)
        self.registry.register(CallbackCounters(counters))


def counter_value(counter: Counter) -> int:
    """The current value of an unlabelled counter, read through its public `collect()`."""
    return int(
        sum(
            sample.value
            for family in counter.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        )
    )
