"""Push the status-change log to an HTTP endpoint as signed JSON, in order, at least once."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from dlrfeed.config import (
    add_database_url,
    add_logging_options,
    host_port,
    positive_float,
    positive_int,
    required,
)
from dlrfeed.daemon.http import MetricsServer
from dlrfeed.daemon.lifecycle import ping_watchdog
from dlrfeed.daemon.logsetup import configure_logging
from dlrfeed.daemon.sdnotify import SystemdNotifier
from dlrfeed.daemon.settings import exposed_mode
from dlrfeed.errors import ConfigError
from dlrfeed.relay import Relay, RelayMetrics, RelaySettings
from dlrfeed.secret_option import SecretOption

log = structlog.get_logger("dlrfeed.relay")

RELAY_SECRET = SecretOption(
    "relay secret",
    env="DLRFEED_RELAY_SECRET",
    credential="relay-secret",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--url, --secret-file, --consumer, --batch-size, --timeout, --metrics, logging."""
    parser.add_argument("--url", metavar="URL", help="the endpoint to POST changes to")
    RELAY_SECRET.add_to(parser, "the HMAC secret")
    add_database_url(parser)
    parser.add_argument(
        "--consumer",
        default="relay",
        metavar="NAME",
        help="the durable cursor this relay keeps (one per endpoint)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=100, help="changes per POST (at most)"
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=10.0, help="seconds per POST attempt"
    )
    parser.add_argument(
        "--retry-max",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="longest wait between two attempts of one batch (backoff from 0.5 s, jittered)",
    )
    parser.add_argument("--metrics", metavar="HOST:PORT", help="serve /metrics and /healthz here")
    add_logging_options(parser, debug_help="debug adds one event per delivered batch")


def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(f"--url: expected an http:// or https:// URL, got {url!r}")
    if parts.password is not None:
        raise ConfigError("--url: no credentials in the URL (they would reach logs)")
    return url


async def run(args: argparse.Namespace) -> int:
    """Validate, then relay until SIGTERM/SIGINT (exit 0), serving metrics when asked."""
    configure_logging(args.log_level, args.log_format)
    if getattr(args, "_sources", {}).get("secret") == "config":
        raise ConfigError("the config file sets `secret`: keep it in a --secret-file")
    url = _endpoint(required(args, "url"))
    secret, source = RELAY_SECRET.resolve(args.secret_file, os.environ)
    try:
        metrics_address = host_port(args.metrics) if args.metrics else None
    except ValueError as exc:
        raise ConfigError(f"--metrics: {exc}") from None
    if not args.consumer.strip():
        raise ConfigError("--consumer: the name must not be empty")
    settings = RelaySettings(
        database_url=required(args, "database_url"),
        url=url,
        secret=secret,
        consumer=args.consumer,
        batch_size=args.batch_size,
        timeout=args.timeout,
        retry_max=args.retry_max,
    )
    if args.secret_file and (mode := exposed_mode(Path(args.secret_file))) is not None:
        log.warning("secret_file_exposed", mode=oct(mode), fix="chmod 600")
    log.info("relay_secret", source=source)
    metrics = RelayMetrics()
    relay = Relay(settings, metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server: MetricsServer | None = None
    if metrics_address is not None:

        async def health() -> tuple[bool, str]:
            up = _is_up(metrics)
            return up, "relaying" if up else "cannot reach PostgreSQL"

        server = MetricsServer(metrics.registry, health)
        await server.start(*metrics_address)
    notifier = SystemdNotifier()
    notifier.notify(READY="1", STATUS=f"relaying to {urlsplit(url).hostname}")
    watchdog = asyncio.create_task(ping_watchdog(notifier, stop), name="watchdog")
    try:
        await relay.run(stop)
    finally:
        notifier.notify(STOPPING="1")
        watchdog.cancel()
        await asyncio.gather(watchdog, return_exceptions=True)
        if server is not None:
            await server.close()
    return 0


def _is_up(metrics: RelayMetrics) -> bool:
    return bool(metrics.up._value.get() == 1)  # prometheus_client has no public getter
