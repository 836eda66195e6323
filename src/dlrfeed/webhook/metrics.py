"""Prometheus metrics of `dlrfeed webhook`, in a registry of their own.

Named like the daemon's (`dlrfeed_` prefix) with `webhook` in each name, so one Prometheus can
scrape both and the alert rules tell them apart (monitoring/).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dlrfeed.daemon.metrics import NAMESPACE
from dlrfeed.domain.receipt import Receipt

if TYPE_CHECKING:
    from dlrfeed.store.store import IngestResult


class WebhookMetrics:
    """Every metric `dlrfeed webhook` exports; names are part of the operator's contract."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "webhook_requests",
            "HTTP callbacks answered, by status code",
            ["code"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.outcomes = Counter(
            "webhook_receipts_outcomes",
            "Callback receipts committed to the store, by store outcome (P14-P18)",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.unreadable = Counter(
            "webhook_unreadable",
            "Callbacks that could not be read as a receipt, kept raw as evidence (C8)",
            namespace=NAMESPACE,
            registry=r,
        )
        self.commits = Counter(
            "webhook_commits", "Ingest transactions committed", namespace=NAMESPACE, registry=r
        )
        self.commit_seconds = Histogram(
            "webhook_commit_seconds",
            "Seconds per Store.ingest transaction of callbacks",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.batch_receipts = Histogram(
            "webhook_commit_receipts",
            "Receipts per commit: concurrent callbacks sharing one transaction",
            namespace=NAMESPACE,
            registry=r,
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
        )
        self.answer_seconds = Histogram(
            "webhook_answer_seconds",
            "Seconds from a callback's body read to its answer (the commit included)",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.store_up = Gauge(
            "webhook_store_up",
            "1 when the store takes callbacks; 0 while they are answered 503",
            namespace=NAMESPACE,
            registry=r,
        )
        self.store_up.set(1)

    def committed(self, batch: Sequence[Receipt], result: IngestResult, seconds: float) -> None:
        """One commit of callbacks (CallbackIntake's observer)."""
        self.commits.inc()
        self.commit_seconds.observe(seconds)
        self.batch_receipts.observe(len(batch))
        for outcome, count in result.counts.items():
            self.outcomes.labels(outcome=outcome.value).inc(count)
