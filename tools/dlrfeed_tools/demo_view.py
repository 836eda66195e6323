"""What the local demo shows: one view of the flow, redrawn each second (or a plain line when the
output is not a terminal), from the daemon's metrics, fakegw's stats and the store; and the
summary at the end (`dlrfeed stats --json`). The demo itself (`dlrfeed_tools.demo`) starts
and stops the processes.
"""

from __future__ import annotations

import collections
import http.client
import time
from dataclasses import dataclass
from typing import IO, Any

from prometheus_client.parser import text_string_to_metric_families

from dlrfeed_tools.metrics import histogram_quantile, histogram_window

_P99_WINDOW_SECONDS = 10.0


def http_get(host_port: str, path: str, timeout: float) -> bytes | None:
    """The body of a 200 answer from the daemon's HTTP endpoint, else None (not up yet)."""
    host, _, port = host_port.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except OSError:
        return None
    finally:
        connection.close()
    return body if response.status == 200 else None


# -- the live view ------------------------------------------------------------------------------


@dataclass
class Sample:
    """One scrape of the daemon, the gateway and the store."""

    at: float
    received: float = 0.0
    stored: float = 0.0
    repeats: float = 0.0
    conflicts: float = 0.0
    exceptions_opened: float = 0.0
    ack_buckets: tuple[tuple[float, float], ...] = ()  # (upper bound, cumulative count)
    backlog: int | None = None
    in_flight: int | None = None
    acked: int | None = None
    callbacks_answered: int | None = None
    callbacks_pending: int | None = None
    by_callback: int | None = None
    open_exceptions: int | None = None


def scrape_metrics(host_port: str, sample: Sample) -> None:
    """Fill `sample` from the daemon's /metrics (names from dlrfeed/daemon/metrics.py)."""
    body = http_get(host_port, "/metrics", timeout=2)
    if body is None:
        return
    text = body.decode()
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "dlrfeed_receipts_received_total":
                sample.received += s.value
            elif s.name == "dlrfeed_receipts_stored_total":
                sample.stored = s.value
            elif s.name == "dlrfeed_receipts_repeats_total":
                sample.repeats = s.value
            elif s.name == "dlrfeed_receipts_conflicts_total":
                sample.conflicts = s.value
            elif s.name == "dlrfeed_receipts_exceptions_total":
                sample.exceptions_opened = s.value
            elif s.name == "dlrfeed_receive_to_ack_seconds_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    sample.ack_buckets = tuple(sorted(buckets))


def _count(value: float | int | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


class LiveView:
    """Renders samples: an ANSI redraw in place on a terminal, a plain line otherwise."""

    def __init__(self, out: IO[str], tty: bool, plain_every: float) -> None:
        self.out = out
        self.tty = tty
        self.plain_every = plain_every
        self.drawn_lines = 0
        self.last_plain = 0.0
        self.history: collections.deque[Sample] = collections.deque()
        self.started = time.monotonic()

    def show(self, sample: Sample, traffic: dict[str, Any]) -> None:
        """Add a sample and redraw (or print a line when due)."""
        self.history.append(sample)
        while len(self.history) > 2 and sample.at - self.history[1].at >= _P99_WINDOW_SECONDS:
            self.history.popleft()
        rate = self._rate(sample)
        # Over the window only: "-" while nothing was acked in it (idle or just started).
        window = histogram_window(sample.ack_buckets, self.history[0].ack_buckets)
        p99 = histogram_quantile(0.99, window)
        elapsed = sample.at - self.started
        if self.tty:
            self._redraw(self.frame(sample, traffic, rate, p99, elapsed))
        elif sample.at - self.last_plain >= self.plain_every:
            self.last_plain = sample.at
            self.out.write(self.plain_line(sample, traffic, rate, p99, elapsed) + "\n")
            self.out.flush()

    def _rate(self, sample: Sample) -> float | None:
        """Receipts received per second over the last few seconds."""
        if len(self.history) < 2:
            return None
        earlier = list(self.history)[:-1]
        base = next((s for s in earlier if sample.at - s.at <= 3.0), earlier[-1])
        span = sample.at - base.at
        return (sample.received - base.received) / span if span > 0 else None

    @staticmethod
    def frame(
        s: Sample, traffic: dict[str, Any], rate: float | None, p99: float | None, elapsed: float
    ) -> list[str]:
        """The lines of one frame."""
        minutes, seconds = divmod(int(elapsed), 60)
        return [
            f"dlrfeed demo — {minutes:02d}:{seconds:02d} elapsed — Ctrl-C stops everything",
            "",
            f"  traffic     sent {_count(traffic.get('messages'))} messages"
            f"  ({_count(traffic.get('receipts_reported'))} receipts reported, "
            f"{_count(traffic.get('unknown_ids_injected'))} unknown ids, "
            f"{_count(traffic.get('late_submissions'))} late submissions)",
            f"  gateway     backlog {_count(s.backlog):>8}   in flight {_count(s.in_flight):>7}"
            f"   acked {_count(s.acked)}",
            f"  callbacks   answered 2xx {_count(s.callbacks_answered):>6}"
            f"   waiting {_count(s.callbacks_pending):>6}"
            f"   stored by callback {_count(s.by_callback)} (dlrfeed webhook)",
            f"  dlrfeed     receipts/s {_count(rate):>5}   stored {_count(s.stored):>9}"
            f"   repeats {_count(s.repeats)}   conflicts {_count(s.conflicts)}",
            f"  store       open exceptions {_count(s.open_exceptions)}"
            f"   (opened by this run {_count(s.exceptions_opened)})",
            f"  latency     receive→ack p99 {_seconds(p99)}"
            f" (last {_P99_WINDOW_SECONDS:.0f} s, from dlrfeed_receive_to_ack_seconds)",
        ]

    @staticmethod
    def plain_line(
        s: Sample, traffic: dict[str, Any], rate: float | None, p99: float | None, elapsed: float
    ) -> str:
        """One line for logs and pipes."""
        return (
            f"[{elapsed:5.0f}s] sent={traffic.get('messages', 0)} receipts/s={_count(rate)} "
            f"stored={_count(s.stored)} repeats={_count(s.repeats)} "
            f"conflicts={_count(s.conflicts)} open_exceptions={_count(s.open_exceptions)} "
            f"backlog={_count(s.backlog)} in_flight={_count(s.in_flight)} "
            f"callbacks_answered={_count(s.callbacks_answered)} "
            f"stored_by_callback={_count(s.by_callback)} "
            f"receive_ack_p99={_seconds(p99)}"
        )

    def _redraw(self, lines: list[str]) -> None:
        # Move up over the previous frame and rewrite it line by line (\x1b[K clears the rest).
        up = f"\x1b[{self.drawn_lines}F" if self.drawn_lines else ""
        self.out.write(up + "".join(f"{line}\x1b[K\n" for line in lines))
        self.out.flush()
        self.drawn_lines = len(lines)


def render_summary(
    stats: dict[str, Any],
    traffic: dict[str, Any],
    codes: dict[str, int | None],
    left_in_gateway: int | None,
) -> list[str]:
    """The end-of-run summary: statuses, repeats, conflicts, exceptions (all runs in DATA_DIR)."""
    network = stats["reported_by_network"]
    lines = [
        "",
        "Summary (dlrfeed stats --json; every run kept in the data directory)",
        f"  this run: {traffic.get('messages', 0):,} messages sent, "
        f"{traffic.get('receipts_reported', 0):,} receipts reported, "
        f"{traffic.get('unknown_ids_injected', 0):,} unknown ids injected; "
        "stopped: "
        + ", ".join(f"{n} exit {c if c is not None else 'killed'}" for n, c in codes.items()),
        f"  left in the gateway's durable queue for the next run: {_count(left_in_gateway)}",
        f"  messages recorded {stats['submitted']['recorded']:,}, "
        f"without any receipt yet {stats['submitted']['without_any_status']:,}",
        "  final status reported by the network:",
    ]
    lines += [f"    {status:<14} {n:>9,}" for status, n in sorted(network["final"].items())]
    lines.append("  still in progress:")
    lines += [f"    {status:<14} {n:>9,}" for status, n in sorted(network["progress"].items())]
    lines += [
        f"  receptions stored {stats['receptions']['total']:,} ("
        + ", ".join(
            f"{n:,} by {channel}"
            for channel, n in sorted(stats["receptions"]["by_channel"].items())
        )
        + f"), logical events {stats['events']:,}",
        f"  repeats {stats['repeats']['deliveries']:,}, "
        f"conflicting deliveries {stats['conflicts']['deliveries']:,}, "
        f"uncorrelated receptions {stats['uncorrelated']['receptions']:,}",
        "  exceptions by kind (open / total):",
    ]
    lines += [
        f"    {kind:<14} {v['open']:>7,} / {v['total']:,}"
        for kind, v in sorted(stats["exceptions"].items())
    ]
    return lines + quality_summary(stats["quality"])


def quality_summary(quality: dict[str, Any]) -> list[str]:
    """C6 per route: the network's DELIVRD beside the sender's verifications, and the routes
    whose receipts the verifications contradict, named (dlrfeed quality for the detail)."""
    lines = [
        f"  verified by the sender: {quality['verifications']['recorded']:,} verifications "
        "(OTP codes entered); per route, DELIVRD by the network / verified:",
    ]
    lines += [
        f"    {route:<14} {g['delivered']:>9,} / {g['verified']:,}"
        + (f"   SUSPICIOUS: {', '.join(g['signals'])}" if g["suspicious"] else "")
        for route, g in sorted(quality["routes"].items())
    ]
    lying = quality["suspicious_routes"]
    lines.append(
        f"  lying route{'s' if len(lying) > 1 else ''}: {', '.join(lying)} - DELIVRD that no "
        "verification backs (dlrfeed quality --by route)"
        if lying
        else "  no suspicious route (too few messages yet, or none lies)"
    )
    return lines
