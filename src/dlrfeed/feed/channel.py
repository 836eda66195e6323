"""The gRPC channels to the gateway: TLS or plaintext, message-size limits, keepalive.

One `grpc.aio` channel per process carries every Pull and the Acker's calls, and one HTTP/2
connection of dlrfeed.feed.http2 every reader's Subscribe stream.
Certificates are read here, at start-up, so that a missing or unreadable file is a
configuration error with one clear line, not a failed handshake later.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from dlrfeed.config import host_port
from dlrfeed.errors import ConfigError
from dlrfeed.feed.http2 import StreamChannel

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""A Pull of 1000 receipts, some carrying megabyte fields (C8), must still fit in one message."""

KEEPALIVE_SECONDS = 300.0
"""A keepalive ping every 5 min finds a silently dead connection under an idle Subscribe
stream; not more often, or a default server answers GOAWAY "too_many_pings"."""
KEEPALIVE_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS towards the gateway: system roots unless `ca_file`; mTLS when a client pair is given."""

    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None
    """Overrides the name checked against the server certificate (default: the target host)."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """The channel credentials for `tls`; raises ConfigError for unreadable or half-given files."""
    if (tls.client_cert is None) != (tls.client_key is None):
        raise ConfigError("--client-cert and --client-key must be given together (mTLS)")
    root = _read(tls.ca_file, "--ca-file") if tls.ca_file else None
    key = _read(tls.client_key, "--client-key") if tls.client_key else None
    cert = _read(tls.client_cert, "--client-cert") if tls.client_cert else None
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=cert
    )


def _options(max_message_bytes: int) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_SECONDS * 1000)),
        # Reconnect backoff is ours (FeedReader); keep the channel's own short.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 5_000),
    ]


def open_channel(
    target: str,
    tls: TlsSettings | None,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.aio.Channel:
    """A `grpc.aio` channel to `target` (HOST:PORT); must be called inside the running loop."""
    options = _options(max_message_bytes)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(target, channel_credentials(tls), options=options)


def open_stream_channel(target: str, tls: TlsSettings | None) -> StreamChannel:
    """The HTTP/2 connection that carries every reader's Subscribe stream (read on the event
    loop by dlrfeed.feed.http2), with the same TLS and keepalive as `open_channel`; opened at
    the first call.

    Why not grpcio here: grpcio pays a receive operation, a completion and a thread wake-up per
    stream message, in the daemon and — through its small, probe-grown flow-control window —
    in the gateway too, where a Pull pays once per response (docs/benchmarks.md, "Measured by
    hand").
    """
    host, port = host_port(target)
    # hpack logs every header it encodes at DEBUG, the Authorization header (the login's
    # password) among them: never let a debug set-up of the standard logging print it.
    logging.getLogger("hpack").setLevel(logging.INFO)
    return StreamChannel(
        host,
        port,
        ssl_context=ssl_context(tls) if tls is not None else None,
        server_name=tls.server_name if tls is not None else None,
        keepalive_seconds=KEEPALIVE_SECONDS,
        keepalive_timeout=KEEPALIVE_TIMEOUT_SECONDS,
    )


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """The client TLS context of `tls` (HTTP/2 by ALPN); raises ConfigError like
    `channel_credentials` for unreadable or half-given files."""
    channel_credentials(tls)  # the same checks, the same one-line errors
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        if tls.client_cert is not None and tls.client_key is not None:
            context.load_cert_chain(tls.client_cert, tls.client_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load the TLS files (--ca-file, --client-cert/--client-key): {exc}"
        ) from exc
    context.set_alpn_protocols(["h2"])
    return context
