"""F6 / issue 4 §3: receive→ack latency per receipt, with a warning near the lease."""

from __future__ import annotations

import time

from structlog.testing import capture_logs

from daemon_harness import settings_for
from dlrfeed.daemon.app import Daemon


def test_latency_is_histogrammed_and_warns_near_the_lease() -> None:
    """Each acked receipt lands in dlrfeed_receive_to_ack_seconds; one at 70 s of a 120 s
    lease logs `ack_latency_near_lease` (rate-limited: once per 10 s)."""
    daemon = Daemon(settings_for("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x"))
    now = time.time()
    with capture_logs() as logs:
        daemon._observe_acks([now - 0.01, now - 0.02], now)
        assert logs == []
        daemon._observe_acks([now - 70.0], now)
        daemon._observe_acks([now - 80.0], now)
    warnings = [e for e in logs if e["event"] == "ack_latency_near_lease"]
    assert len(warnings) == 1
    assert warnings[0]["lease_s"] == 120.0
    assert daemon.metrics.receive_to_ack.count == 4
