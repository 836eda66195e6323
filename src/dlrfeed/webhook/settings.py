"""The `dlrfeed webhook` options, validated once (flag > DLRFEED_* env > TOML > default).

Every error is one line naming the fix. The secret callers must present is never an option:
`--secret-file`, DLRFEED_WEBHOOK_SECRET, or the systemd credential `webhook-secret`; two lines
there are two secrets valid at once (a rotation: the new one, then the one being retired).
Without
one the receiver answers anybody, so it then binds only to a loopback address unless
`--allow-unauthenticated` says the network in front of it is trusted (docs/webhook.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dlrfeed.config import (
    Pooler,
    add_database_url,
    add_integration_options,
    add_logging_options,
    host_port,
    integration_options,
    positive_float,
    positive_int,
    required,
)
from dlrfeed.daemon.settings import exposed_mode
from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.errors import ConfigError
from dlrfeed.secret_option import SecretOption
from dlrfeed.webhook.formats import CallbackFormat

WEBHOOK_SECRET = SecretOption(
    "webhook secret",
    env="DLRFEED_WEBHOOK_SECRET",
    credential="webhook-secret",
)
DEFAULT_MAX_BODY_BYTES = 64 * 1024
MAX_SECRETS = 2  # the one in use and the one replacing it, during a rotation
# Descriptors kept back from --max-connections: the pool, the metrics server, logs, the listener.
_RESERVED_DESCRIPTORS = 64
_DEFAULT_MAX_CONNECTIONS = 4096


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every `dlrfeed webhook` option."""
    http = parser.add_argument_group("http")
    http.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8080",
        help="address the callbacks are posted to (POST / or /dlr)",
    )
    http.add_argument(
        "--login",
        metavar="NAME",
        help="the gateway login whose messages' callbacks arrive here (P10: ids are per login)",
    )
    WEBHOOK_SECRET.add_to(
        parser,
        "the secret callers present (a Bearer token, an HTTP Basic password, or the path "
        "/dlr/SECRET); a second line is a second secret valid at once, for a rotation",
    )
    http.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="without a secret, listen on a non-loopback address anyway (a trusted network)",
    )
    http.add_argument(
        "--format",
        choices=[f.value for f in CallbackFormat],
        default=CallbackFormat.GATEWAY.value,
        help="the callbacks' format: the gateway's JSON, Jasmin's or Kannel's "
        "(docs/webhook-formats.md)",
    )
    http.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger callbacks are refused with 413 (their first bytes kept as evidence)",
    )
    http.add_argument(
        "--retry-after",
        type=positive_int,
        default=5,
        metavar="SECONDS",
        help="the Retry-After of a 503 while PostgreSQL cannot take callbacks",
    )
    http.add_argument(
        "--header-timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="a connection whose request line and headers are not all in by then is closed "
        "(also the keep-alive: an idle connection is closed after it)",
    )
    http.add_argument(
        "--body-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="a body not all in by then is answered 408 and not stored (the caller sends it again)",
    )
    http.add_argument(
        "--max-connections",
        type=positive_int,
        metavar="N",
        help="connections open at once; more are answered 503 and closed (default: 4096, "
        "or fewer under the open-files limit: that limit less 64)",
    )
    http.add_argument(
        "--max-bodies-bytes",
        type=positive_int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="bytes of bodies being read at once, all requests together; a request that "
        "would pass it is answered 503 before its body is read",
    )
    http.add_argument(
        "--unreadable-per-minute",
        type=positive_int,
        default=60,
        metavar="N",
        help="investigations a caller's unreadable callbacks may open per minute (burst N); "
        "beyond, each one is kept as evidence of one open investigation of that caller",
    )
    http.add_argument(
        "--stalled-commit-seconds",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="/healthz answers unhealthy while a commit has taken longer than this",
    )
    http.add_argument("--metrics", metavar="HOST:PORT", help="serve /metrics and /healthz here")
    add_database_url(parser)
    store = parser.add_argument_group("store")
    store.add_argument(
        "--batch-size",
        type=positive_int,
        default=500,
        help="receipts per commit at most: concurrent callbacks share a commit",
    )
    store.add_argument(
        "--commits",
        type=positive_int,
        default=2,
        help="commits in flight at once (each holds a database connection)",
    )
    store.add_argument(
        "--require-synchronous-commit",
        action="store_true",
        help="refuse to start unless each commit waits for a synchronous standby",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in progress may take to be committed and answered",
    )
    add_logging_options(parser, debug_help="debug adds one event per commit")
    add_integration_options(parser)


@dataclass(frozen=True)
class WebhookSettings:
    """Everything `dlrfeed webhook` needs, validated; `secret` never reaches a log or repr."""

    listen: tuple[str, int]
    login: str
    database_url: str
    secrets: tuple[bytes, ...] = field(repr=False)
    """Every secret valid now: none (no secret set), one, or two during a rotation."""
    secret_source: str
    callback_format: CallbackFormat
    max_body_bytes: int
    retry_after: int
    batch_size: int
    commits: int
    shutdown_timeout: float
    metrics: tuple[str, int] | None
    log_level: str
    log_format: str
    integration: IntegrationOptions
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    max_connections: int = _DEFAULT_MAX_CONNECTIONS
    max_bodies_bytes: int = 64 * 1024 * 1024
    unreadable_per_minute: int = 60
    stalled_commit_seconds: float = 10.0
    database_pooler: Pooler = Pooler.AUTO
    require_synchronous_commit: bool = False
    secret_file_mode: int | None = None
    """Set when the --secret-file is open to group/others: the receiver warns at start."""

    @property
    def secret(self) -> bytes | None:
        """The first secret (the one in use), None without one."""
        return self.secrets[0] if self.secrets else None

    @property
    def db_pool_size(self) -> int:
        """One connection per commit in flight, and one for the gate's pings."""
        return self.commits + 1

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> WebhookSettings:
        """Validate the parsed options; raises ConfigError with one line saying what to fix."""
        env = os.environ if environ is None else environ
        if getattr(args, "_sources", {}).get("secret") == "config":
            raise ConfigError("the config file sets `secret`: keep it in a --secret-file")
        try:
            listen = host_port(args.listen)
            metrics = host_port(args.metrics) if args.metrics else None
        except ValueError as exc:
            raise ConfigError(f"--listen/--metrics: {exc}") from None
        found = WEBHOOK_SECRET.find(args.secret_file, env)
        secrets, source = (secret_lines(found[0]), found[1]) if found is not None else ((), "none")
        if not secrets and not args.allow_unauthenticated and not is_loopback(listen[0]):
            raise ConfigError(
                f"--listen {args.listen} is reachable from the network and no secret is set: "
                "give --secret-file FILE (or DLRFEED_WEBHOOK_SECRET), listen on 127.0.0.1, or "
                "pass --allow-unauthenticated"
            )
        return cls(
            listen=listen,
            login=required(args, "login"),
            database_url=required(args, "database_url"),
            secrets=secrets,
            secret_source=source,
            callback_format=CallbackFormat(args.format),
            max_body_bytes=args.max_body_bytes,
            retry_after=args.retry_after,
            batch_size=args.batch_size,
            commits=args.commits,
            shutdown_timeout=args.shutdown_timeout,
            metrics=metrics,
            log_level=args.log_level,
            log_format=args.log_format,
            integration=integration_options(args),
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_connections=max_connections(args.max_connections),
            max_bodies_bytes=args.max_bodies_bytes,
            unreadable_per_minute=args.unreadable_per_minute,
            stalled_commit_seconds=args.stalled_commit_seconds,
            database_pooler=args.database_pooler,
            require_synchronous_commit=args.require_synchronous_commit,
            secret_file_mode=exposed_mode(Path(args.secret_file)) if args.secret_file else None,
        )


def secret_lines(found: bytes) -> tuple[bytes, ...]:
    """The secrets of a secret source: one per non-empty line, at most MAX_SECRETS."""
    secrets = tuple(line.rstrip(b"\r") for line in found.split(b"\n") if line.strip())
    if len(secrets) > MAX_SECRETS:
        raise ConfigError(
            f"the webhook secret holds {len(secrets)} lines: give one secret, or two during "
            "a rotation (the new one and the one being retired)"
        )
    return secrets


def max_connections(given: int | None) -> int:
    """--max-connections, checked against the open-files limit (each connection is a
    descriptor); the default is 4096 or what the limit leaves."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = soft - _RESERVED_DESCRIPTORS if soft != resource.RLIM_INFINITY else 1 << 30
    if given is None:
        if room < 1:
            raise ConfigError(f"the open-files limit ({soft}) leaves no room for connections")
        return min(_DEFAULT_MAX_CONNECTIONS, room)
    if given > room:
        raise ConfigError(
            f"--max-connections {given} is over the open-files limit ({soft}) less "
            f"{_RESERVED_DESCRIPTORS}: raise LimitNOFILE (ulimit -n) or lower it"
        )
    return given


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (a name other than localhost is not trusted to)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
