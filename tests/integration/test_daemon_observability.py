"""Metrics, /healthz, sd_notify, fatal credentials (FD1), no secret anywhere."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed.daemon.sdnotify import SystemdNotifier
from dlrfeed.errors import AuthenticationError
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    drained,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.pgcluster import PgCluster
from fakegw.server import FakeGateway

METRIC_NAMES = [
    "dlrfeed_receipts_received_total",
    "dlrfeed_receipts_stored_total",
    "dlrfeed_receipts_repeats_total",
    "dlrfeed_receipts_conflicts_total",
    "dlrfeed_receipts_exceptions_total",
    "dlrfeed_acks_tokens_total",
    "dlrfeed_acks_already_gone_total",
    "dlrfeed_delivery_count_bucket",
    "dlrfeed_batch_commit_seconds_bucket",
    "dlrfeed_receive_to_ack_seconds_bucket",
    "dlrfeed_receipts_in_flight",
    'dlrfeed_readers_up{mode="subscribe"}',
]


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    status = int(response.split()[1])
    return status, response.split("\r\n\r\n", 1)[1]


def with_db_password(database_url: str) -> str:
    """The test cluster trusts every login, so a URL password is accepted and ignored."""
    return database_url.replace("postgres@", "postgres:dbsecret@", 1)


async def test_metrics_healthz_and_sd_notify_without_secrets(
    database_url: str, tmp_path: Path
) -> None:
    """/metrics carries the documented series, /healthz is ready with readers up and the DB
    answering, systemd gets READY/WATCHDOG/STOPPING, and neither the gateway password nor the
    database password appears in logs or metrics."""
    notify_path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(notify_path)
        systemd.setblocking(False)
        async with running_gateway() as gateway:
            await gateway.inject(LOGIN, receipt_bodies(500))
            settings = settings_for(
                gateway.target,
                with_db_password(database_url),
                "--metrics", "127.0.0.1:0", "--mode", "subscribe", "--log-level", "debug",
            )  # fmt: skip
            notifier = SystemdNotifier({"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "200000"})
            daemon = Daemon(settings, notifier=notifier)
            with capture_logs() as logs:
                task = asyncio.create_task(daemon.run(), name="daemon-under-test")
                await wait_until(lambda: drained(gateway), 30, "the drain")
                await asyncio.wait_for(daemon.ready.wait(), 5)

                async def healthy() -> bool:
                    return (await http_get(daemon.metrics_port, "/healthz"))[0] == 200

                await wait_until(healthy, 10, "/healthz to be ready")
                status, metrics = await http_get(daemon.metrics_port, "/metrics")
                assert status == 200
                assert (await http_get(daemon.metrics_port, "/nope"))[0] == 404
                bound_port = daemon.metrics_port
                daemon.stop()
                assert await asyncio.wait_for(task, 15) == 0
            datagrams = []
            while True:
                try:
                    datagrams.append(systemd.recv(4096).decode())
                except BlockingIOError:
                    break
    for name in METRIC_NAMES:
        assert name in metrics, name
    assert "dlrfeed_receipts_stored_total 500.0" in metrics
    assert "dlrfeed_acks_tokens_total 500.0" in metrics
    assert "dlrfeed_store_up 1.0" in metrics
    assert "dlrfeed_receive_to_ack_seconds_count 500.0" in metrics
    assert any(d.startswith("READY=1") for d in datagrams)
    assert any(d.startswith("WATCHDOG=1") for d in datagrams)
    assert any(d.startswith("STOPPING=1") for d in datagrams)
    everything = repr(logs) + metrics + "".join(datagrams)
    assert PASSWORD not in everything
    assert "dbsecret" not in everything
    events = {entry["event"] for entry in logs}
    assert {"daemon_starting", "daemon_ready", "reader_up", "batch_committed"} <= events
    # Asked for port 0: the port really bound is what both lines report.
    ready = next(entry for entry in logs if entry["event"] == "daemon_ready")
    listening = next(entry for entry in logs if entry["event"] == "metrics_listening")
    assert ready["metrics_port"] == listening["port"] == bound_port != 0
    assert {"shutdown_clean", "daemon_stopped"} <= events


async def test_healthz_is_not_ready_while_the_database_is_down(
    pg_cluster: PgCluster, database_url: str
) -> None:
    """/healthz answers 503 when the database does not answer."""
    async with running_gateway() as gateway:
        settings = settings_for(gateway.target, database_url, "--metrics", "127.0.0.1:0")
        daemon = Daemon(settings)
        task = asyncio.create_task(daemon.run(), name="daemon-under-test")
        await asyncio.wait_for(daemon.ready.wait(), 10)

        async def ready() -> bool:
            return (await http_get(daemon.metrics_port, "/healthz"))[0] == 200

        await wait_until(ready, 10, "ready")
        await asyncio.to_thread(pg_cluster.stop)
        try:
            status, body = await http_get(daemon.metrics_port, "/healthz")
        finally:
            await asyncio.to_thread(pg_cluster.start)
        assert status == 503
        assert "store" in body
        daemon.stop()
        assert await asyncio.wait_for(task, 15) == 0


async def test_wrong_password_is_fatal_with_one_line(database_url: str) -> None:
    """FD1: UNAUTHENTICATED stops the daemon (exit 77) with one line that names the fix and
    not the password."""
    gateway = FakeGateway({LOGIN: "another-password"})
    async with gateway.running():
        settings = settings_for(gateway.target, database_url)
        with capture_logs() as logs, pytest.raises(AuthenticationError) as caught:
            await asyncio.wait_for(Daemon(settings).run(), 15)
    message = str(caught.value)
    assert caught.value.exit_code == 77
    assert "\n" not in message
    assert "--login" in message
    assert PASSWORD not in message + repr(logs)
