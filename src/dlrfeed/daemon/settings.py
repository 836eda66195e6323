"""The daemon's settings: the `dlrfeed run` options, validated once, plus the password.

The argparse parser built by `add_run_arguments` is the settings model (flag > DLRFEED_* env >
TOML > default, see dlrfeed.config). `DaemonSettings.from_args` checks what argparse cannot —
combinations that would stall a stream at its window (F11), limits of the feed (F9, F10) — and
reads the password, which is never an option: `--password-file`, `DLRFEED_PASSWORD`, or the
systemd credential `$CREDENTIALS_DIRECTORY/password`. Every error is one line naming the fix.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dlrfeed.config import (
    Pooler,
    add_database_pooler,
    add_integration_options,
    add_logging_options,
    host_port,
    integration_options,
    non_negative_float,
    positive_int,
)
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.errors import ConfigError
from dlrfeed.feed.channel import TlsSettings
from dlrfeed.feed.client import MAX_ACK_TOKENS, MAX_PULL, MAX_PULL_WAIT_SECONDS
from dlrfeed.feed.reader import Mode, ReaderSettings
from dlrfeed.secret_option import refusing_action

GATEWAY_MAX_WINDOW = 1000  # F11: a larger window is silently capped by the gateway
REDACTED = "<redacted>"


REFUSED_ON_ARGV = (
    "refused: the password is never accepted on the command line (ps, shell history); use "
    "--password-file FILE, DLRFEED_PASSWORD or the systemd credential `password`"
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every `dlrfeed run` option (also used by `dlrfeed check-config`)."""
    parser.allow_abbrev = False  # no `--pass` → --password-file guessing
    feed = parser.add_argument_group("gateway")
    feed.add_argument("--gateway", metavar="HOST:PORT", help="the gateway's ReceiptFeed address")
    feed.add_argument("--login", metavar="NAME", help="the gateway login whose feed to drain")
    feed.add_argument(
        "--password-file",
        metavar="FILE",
        help="file holding the login's password (else DLRFEED_PASSWORD, else "
        "$CREDENTIALS_DIRECTORY/password); never accepted on the command line",
    )
    feed.add_argument(
        "--password",
        action=refusing_action(REFUSED_ON_ARGV),
        nargs="?",
        metavar="-",
        help=REFUSED_ON_ARGV,
    )
    feed.add_argument("--tls", action="store_true", help="TLS to the gateway (system roots)")
    feed.add_argument("--ca-file", metavar="FILE", help="PEM CA bundle instead of system roots")
    feed.add_argument("--client-cert", metavar="FILE", help="PEM client certificate (mTLS)")
    feed.add_argument("--client-key", metavar="FILE", help="PEM client private key (mTLS)")
    feed.add_argument(
        "--tls-server-name", metavar="NAME", help="name to verify in the server certificate"
    )
    feed.add_argument(
        "--max-message-mb",
        type=positive_int,
        default=64,
        help="largest Pull response accepted (a Subscribe message is one receipt, any size)",
    )
    store = parser.add_argument_group("store")
    store.add_argument("--database-url", metavar="URL", help="PostgreSQL URL (libpq style)")
    store.add_argument(
        "--db-pool-size",
        type=positive_int,
        default=None,
        help="connections per process (default: streams + 1)",
    )
    add_database_pooler(store)
    store.add_argument(
        "--require-synchronous-commit",
        action="store_true",
        help="refuse to start unless each commit waits for a synchronous standby "
        "(synchronous_commit on/remote_write/remote_apply, synchronous_standby_names set, "
        "a sync standby connected), so no acked receipt can be lost in a failover",
    )
    work = parser.add_argument_group("workers")
    work.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.AUTO.value,
        help="subscribe, pull, or auto: Subscribe when caught up, Pull to drain a backlog, "
        "Pull while Subscribe is unimplemented or failing",
    )
    work.add_argument("--streams", type=positive_int, default=2, help="readers per process")
    work.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="worker processes under one supervisor that restarts a dead one",
    )
    work.add_argument(
        "--batch-size", type=positive_int, default=500, help="receipts per store transaction"
    )
    work.add_argument(
        "--linger-ms",
        type=non_negative_float,
        default=50.0,
        help="longest a partial batch waits before it is stored",
    )
    work.add_argument(
        "--ack-batch",
        type=positive_int,
        default=500,
        help=f"tokens per Ack call (at most {MAX_ACK_TOKENS})",
    )
    work.add_argument(
        "--ack-linger-ms",
        type=non_negative_float,
        default=50.0,
        help="longest a partial Ack waits",
    )
    work.add_argument(
        "--window",
        type=positive_int,
        default=GATEWAY_MAX_WINDOW,
        help="Subscribe window: unacked receipts a stream may hold (F11)",
    )
    work.add_argument(
        "--lease-seconds",
        type=non_negative_float,
        default=120.0,
        help="the gateway's lease (F6): acks are retried while it may run; latency warns near it",
    )
    work.add_argument(
        "--pull-wait-seconds",
        type=int,
        default=MAX_PULL_WAIT_SECONDS,
        help="Pull long-poll wait (F10, at most 20)",
    )
    work.add_argument(
        "--max-reopens",
        type=positive_int,
        default=5,
        help="at most this many stream/pull reopens per reader per 10 s",
    )
    work.add_argument(
        "--auto-cooldown",
        type=non_negative_float,
        default=60.0,
        help="auto mode: seconds on Pull before Subscribe is tried again after it failed",
    )
    work.add_argument(
        "--auto-pull-rate",
        type=non_negative_float,
        default=2000.0,
        help="auto mode: receipts/s per Subscribe stream (over 0.5 s) that move it to Pull",
    )
    work.add_argument(
        "--release-after",
        type=non_negative_float,
        default=60.0,
        help="seconds of database outage after which Subscribe streams close so the gateway "
        "releases their receipts (F7); Pull readers keep what they pulled",
    )
    work.add_argument(
        "--shutdown-timeout",
        type=non_negative_float,
        default=30.0,
        help="seconds a clean stop may take (commit batch in hand, flush acks, close)",
    )
    add_integration_options(parser)
    obs = parser.add_argument_group("observability")
    obs.add_argument("--metrics", metavar="HOST:PORT", help="serve /metrics and /healthz here")
    add_logging_options(obs, debug_help="debug adds one event per batch and per Ack")
    obs.add_argument(
        "--summary-interval",
        type=non_negative_float,
        default=30.0,
        help="seconds between `summary` log events (0 = none)",
    )
    obs.add_argument(
        "--quality-interval",
        type=non_negative_float,
        default=300.0,
        help="with --metrics: seconds between computations of the route gauges "
        "(dlrfeed_route_*: `dlrfeed quality --by route` over the last 24 h; 0 = none)",
    )
    obs.add_argument(
        "--quality-routes",
        type=positive_int,
        default=20,
        help="the route gauges name the N busiest routes; the others are one series, "
        'route="(other)" (bounded cardinality)',
    )


def redact_url(url: str) -> str:
    """A database URL with any password replaced, safe for logs and check-config."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", f":{REDACTED}@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _read_secret(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"{what} {path} is empty")
    return secret


def exposed_mode(path: Path) -> int | None:
    """The permission bits of a secret file when its group or others may read or write it
    (docs/security.md: it should be 0600 or 0400, owned by the service user), else None."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    return mode if mode & 0o077 else None


def resolve_password(password_file: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """(password, where it came from): --password-file, DLRFEED_PASSWORD, systemd credential."""
    if password_file:
        return _read_secret(Path(password_file), "--password-file"), f"file {password_file}"
    if environ.get("DLRFEED_PASSWORD"):
        return environ["DLRFEED_PASSWORD"], "env DLRFEED_PASSWORD"
    credentials = environ.get("CREDENTIALS_DIRECTORY")
    if credentials and (Path(credentials) / "password").exists():
        path = Path(credentials) / "password"
        return _read_secret(path, "systemd credential"), "systemd credential password"
    raise ConfigError(
        "no gateway password: give --password-file FILE, DLRFEED_PASSWORD, or the systemd "
        "credential `password` (LoadCredential=password:FILE)"
    )


@dataclass(frozen=True)
class DaemonSettings:
    """Everything `dlrfeed run` needs, validated; `password` never reaches a log or repr."""

    gateway: str
    login: str
    database_url: str
    password: str = field(repr=False)
    password_source: str
    tls: TlsSettings | None
    mode: Mode
    streams: int
    processes: int
    batch_size: int
    linger: float
    ack_batch: int
    ack_linger: float
    window: int
    lease_seconds: float
    release_after: float
    shutdown_timeout: float
    metrics: tuple[str, int] | None
    log_level: str
    log_format: str
    summary_interval: float
    db_pool_size: int
    max_message_bytes: int
    reader: ReaderSettings
    password_file_mode: int | None = None
    """Set when the --password-file is open to group/others: the daemon warns at start."""
    integration: IntegrationOptions = field(default_factory=IntegrationOptions)
    """The integration-specific rules the store applies (P18; off by default)."""
    database_pooler: Pooler = Pooler.AUTO
    require_synchronous_commit: bool = False
    quality_interval: float = 300.0
    """Seconds between computations of the route quality gauges (0: none; C6)."""
    quality_routes: int = 20
    """The routes the gauges name, the busiest first; the others are one series."""

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> DaemonSettings:
        """Validate the parsed options; raises ConfigError with one line saying what to fix."""
        env = os.environ if environ is None else environ
        for option, value in (
            ("--gateway", args.gateway),
            ("--login", args.login),
            ("--database-url", args.database_url),
        ):
            if not value:
                raise ConfigError(f"{option} is required (or {_env_of(option)})")
        try:
            host_port(args.gateway)
            metrics = host_port(args.metrics) if args.metrics else None
        except ValueError as exc:
            raise ConfigError(f"--gateway/--metrics: {exc}") from None
        check_window(args.batch_size, args.ack_batch, args.window)
        if not 0 <= args.pull_wait_seconds <= MAX_PULL_WAIT_SECONDS:
            raise ConfigError(f"--pull-wait-seconds must be 0..{MAX_PULL_WAIT_SECONDS} (F10)")
        if args.lease_seconds and args.release_after >= args.lease_seconds:
            raise ConfigError(
                f"--release-after {args.release_after:g} must be shorter than the lease "
                f"({args.lease_seconds:g} s, F6), or the receipts are redelivered anyway"
            )
        tls_wanted = args.tls or args.ca_file or args.client_cert or args.client_key
        tls = (
            TlsSettings(
                ca_file=Path(args.ca_file) if args.ca_file else None,
                client_cert=Path(args.client_cert) if args.client_cert else None,
                client_key=Path(args.client_key) if args.client_key else None,
                server_name=args.tls_server_name,
            )
            if tls_wanted
            else None
        )
        if tls is not None and (tls.client_cert is None) != (tls.client_key is None):
            raise ConfigError("--client-cert and --client-key must be given together (mTLS)")
        if getattr(args, "_sources", {}).get("password") == "config":
            raise ConfigError(
                "the config file sets `password`: keep it in a --password-file, "
                "DLRFEED_PASSWORD or the systemd credential `password`"
            )
        password, source = resolve_password(args.password_file, env)
        mode = Mode(args.mode)
        return cls(
            gateway=args.gateway,
            login=args.login,
            database_url=args.database_url,
            password=password,
            password_source=source,
            tls=tls,
            mode=mode,
            streams=args.streams,
            processes=args.processes,
            batch_size=args.batch_size,
            linger=args.linger_ms / 1000,
            ack_batch=args.ack_batch,
            ack_linger=args.ack_linger_ms / 1000,
            window=args.window,
            lease_seconds=args.lease_seconds,
            release_after=args.release_after,
            shutdown_timeout=args.shutdown_timeout,
            metrics=metrics,
            log_level=args.log_level,
            log_format=args.log_format,
            summary_interval=args.summary_interval,
            quality_interval=args.quality_interval,
            quality_routes=args.quality_routes,
            integration=integration_options(args),
            db_pool_size=args.db_pool_size or args.streams + 1,
            database_pooler=args.database_pooler,
            require_synchronous_commit=args.require_synchronous_commit,
            max_message_bytes=args.max_message_mb * 1024 * 1024,
            reader=ReaderSettings(
                mode=mode,
                window=args.window,
                pull_max=args.batch_size,
                pull_wait_seconds=args.pull_wait_seconds,
                max_reopens_per_10s=args.max_reopens,
                auto_cooldown=args.auto_cooldown,
                auto_pull_rate=args.auto_pull_rate,
            ),
            password_file_mode=exposed_mode(Path(args.password_file))
            if args.password_file
            else None,
        )


def _env_of(option: str) -> str:
    return "DLRFEED_" + option.lstrip("-").upper().replace("-", "_")


def check_window(batch_size: int, ack_batch: int, window: int) -> None:
    """Reject sizes that could stall a Subscribe stream at its window (F11).

    A stream pauses at `window` unacked receipts. Our receipts wait unacked in the batch in
    hand (up to `batch_size`) and then in the Acker (up to `ack_batch`); if both together can
    reach the window, the stream pauses until a linger timer fires, every time.
    """
    if ack_batch > MAX_ACK_TOKENS:
        raise ConfigError(f"--ack-batch {ack_batch} exceeds the Ack limit of {MAX_ACK_TOKENS} (F9)")
    if batch_size > MAX_PULL:
        raise ConfigError(f"--batch-size {batch_size} exceeds the Pull limit of {MAX_PULL} (F10)")
    if window > GATEWAY_MAX_WINDOW:
        raise ConfigError(
            f"--window {window} exceeds the gateway's maximum {GATEWAY_MAX_WINDOW} (F11): the "
            "gateway would cap it and streams could stall"
        )
    if batch_size + ack_batch > window:
        raise ConfigError(
            f"--batch-size {batch_size} + --ack-batch {ack_batch} exceeds --window {window}: "
            "a stream would stall at its window waiting for acks (F11); lower them or raise "
            "--window"
        )


def effective_configuration(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(option, value, source) for every `dlrfeed run` setting, secrets redacted."""
    sources: Mapping[str, str] = getattr(args, "_sources", {})
    rows: list[tuple[str, str, str]] = []
    for dest, source in sorted(sources.items()):
        value: Any = getattr(args, dest, None)
        if dest == "password":
            continue  # reported once, redacted, by the caller
        if dest == "database_url" and value:
            value = redact_url(str(value))
        rows.append(("--" + dest.replace("_", "-"), "" if value is None else str(value), source))
    return rows
