"""F6: receive→ack latency per receipt, with a warning near the lease."""

from __future__ import annotations

import time

from structlog.testing import capture_logs

from dlrfeed.daemon.metrics import DaemonMetrics
from dlrfeed.daemon.telemetry import Telemetry


def test_latency_is_histogrammed_and_warns_near_the_lease() -> None:
    """Each acked receipt lands in dlrfeed_receive_to_ack_seconds; one at 70 s of a 120 s
    lease logs `ack_latency_near_lease` (rate-limited: once per 10 s of the telemetry's
    clock)."""
    clock = [100.0]
    metrics = DaemonMetrics()
    telemetry = Telemetry(metrics, lease_seconds=120.0, clock=lambda: clock[0])
    now = time.time()
    with capture_logs() as logs:
        telemetry.acked([now - 0.01, now - 0.02], now)
        assert logs == []
        telemetry.acked([now - 70.0], now)
        clock[0] += 9.9
        telemetry.acked([now - 80.0], now)
        clock[0] += 0.1
        telemetry.acked([now - 90.0], now)
    warnings = [e for e in logs if e["event"] == "ack_latency_near_lease"]
    assert [w["latency_s"] for w in warnings] == [70.0, 90.0]
    assert warnings[0]["lease_s"] == 120.0
    assert metrics.receive_to_ack.count == 5
