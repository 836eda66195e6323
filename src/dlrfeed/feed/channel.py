"""The gRPC channels to the gateway: TLS or plaintext, message-size limits, keepalive.

One `grpc.aio` channel per process carries every Pull and the Acker's calls, one synchronous
grpcio channel every reader's Subscribe stream; both have the same options and credentials.
Compression, proxies (`grpc_proxy`, `https_proxy`), TLS and keepalive are grpcio's.
Certificates are read and parsed here, at start-up, so that a missing or unreadable file is a
configuration error with one clear line, not a failed handshake later.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import grpc.experimental

from dlrfeed.errors import ConfigError

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""A Pull of 1000 receipts, some carrying megabyte fields (C8), must still fit in one message."""

KEEPALIVE_SECONDS = 300.0
"""A keepalive ping every 5 min finds a silently dead connection under an idle Subscribe
stream; not more often, or a default server answers GOAWAY "too_many_pings". grpcio times the
next ping from the last one's answer, so two never arrive closer than this."""
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
    _check_pem(tls)
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=cert
    )


def _options(max_message_bytes: int) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_SECONDS * 1000)),
        # An idle stream sends no data: without this grpcio stops pinging after two pings.
        ("grpc.http2.max_pings_without_data", 0),
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


def open_stream_channel(
    target: str,
    tls: TlsSettings | None,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A synchronous channel to `target` for the Subscribe streams, each read by a thread of its
    own (`dlrfeed.feed.client.SubscribeStream`); the same options and TLS as `open_channel`.

    `SingleThreadedUnaryStream` has the reading thread take each message off its call's own
    completion queue, with no thread in between. Why not grpc.aio here: it resolves a future on
    the event loop per stream message, woken from its poller thread; a thread per stream wakes
    the loop once per group of messages (docs/daemon.md, "Subscribe on grpcio").
    """
    options = _options(max_message_bytes)
    options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, channel_credentials(tls), options=options)


def _check_pem(tls: TlsSettings) -> None:
    """Parse the PEM files as TLS will: grpcio takes any bytes and fails only at the handshake,
    on every call, where a wrong file is a configuration error."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if tls.ca_file is not None:
            context.load_verify_locations(cafile=tls.ca_file)
        if tls.client_cert is not None and tls.client_key is not None:
            context.load_cert_chain(tls.client_cert, tls.client_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load the TLS files (--ca-file, --client-cert/--client-key): {exc}"
        ) from exc
