"""TLS to the gateway — a private CA, mTLS, and a wrong CA as a clear fatal error.

Certificates are made by the openssl CLI for each test session (no test dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from dlrfeed.daemon.app import Daemon
from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import ConfigError, FeedUnavailableError
from dlrfeed.feed.channel import TlsSettings, open_channel, open_stream_channel
from dlrfeed.feed.client import FeedClient, FeedTlsError
from dlrfeed_tools.daemon_harness import LOGIN, PASSWORD, receipt_bodies, settings_for, wait_until
from fakegw.server import FakeGateway


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip


def _make_leaf(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    _make_ca(directory, "ca")
    _make_ca(directory, "wrong-ca")
    _make_leaf(directory, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _make_leaf(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        wrong_ca=directory / "wrong-ca.pem",
    )


@contextlib.asynccontextmanager
async def tls_gateway(pki: Pki, *, mtls: bool = False) -> AsyncIterator[FakeGateway]:
    credentials = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
        root_certificates=pki.ca.read_bytes() if mtls else None,
        require_client_auth=mtls,
    )
    gateway = FakeGateway({LOGIN: PASSWORD}, server_credentials=credentials)
    async with gateway.running() as running:
        yield running


async def _pull_and_ack(target: str, tls: TlsSettings) -> int:
    channel = open_channel(target, tls)
    try:
        client = FeedClient(channel, LOGIN, PASSWORD)
        await client.check_access()
        receipts = await client.pull(100, 1).receipts()
        outcome = await client.ack([r.ack_token for r in receipts])
        return outcome.acked
    finally:
        await channel.close(grace=None)


async def test_tls_with_private_ca(pki: Pki) -> None:
    """--tls --ca-file: the handshake verifies the gateway against the given CA."""
    async with tls_gateway(pki) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(10))
        assert await _pull_and_ack(gateway.target, TlsSettings(ca_file=pki.ca)) == 10


async def test_mtls_with_client_certificate(pki: Pki) -> None:
    """--client-cert/--client-key: a gateway that demands a client certificate accepts ours."""
    async with tls_gateway(pki, mtls=True) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(4))
        tls = TlsSettings(ca_file=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key)
        assert await _pull_and_ack(gateway.target, tls) == 4


async def test_mtls_without_client_certificate_is_refused(pki: Pki) -> None:
    """A gateway demanding mTLS refuses a client without a certificate. The client only sees
    the socket closed (the alert comes after its own handshake succeeded), so this stays a
    retryable feed error, logged by every reconnect — documented as a limit in docs/daemon.md."""
    async with tls_gateway(pki, mtls=True) as gateway:
        channel = open_channel(gateway.target, TlsSettings(ca_file=pki.ca))
        try:
            with pytest.raises((FeedTlsError, FeedUnavailableError)):
                await FeedClient(channel, LOGIN, PASSWORD).check_access()
        finally:
            await channel.close(grace=None)


async def test_daemon_without_client_certificate_names_mtls_while_it_waits(
    pki: Pki, database_url: str
) -> None:
    """Against a gateway that demands mTLS, a daemon with no client certificate cannot tell the
    refusal from a network drop, so it keeps waiting - and each retry says what to check."""
    async with tls_gateway(pki, mtls=True) as gateway:
        daemon = Daemon(
            settings_for(gateway.target, database_url, "--tls", "--ca-file", str(pki.ca))
        )
        with capture_logs() as logs:
            task = asyncio.create_task(daemon.run())

            async def waiting_with_hint() -> bool:
                return any(e["event"] == "startup_waiting" and "hint" in e for e in logs)

            await wait_until(waiting_with_hint, 20, "a start-up retry with the mTLS hint")
            daemon.stop()
            assert await asyncio.wait_for(task, 15) == 0
    hint = next(e["hint"] for e in logs if e["event"] == "startup_waiting" and "hint" in e)
    assert "--client-cert" in hint


async def test_wrong_ca_stops_the_daemon_with_one_clear_line(pki: Pki, database_url: str) -> None:
    """A wrong CA is a fatal configuration error (exit 78), said in one line that
    names the options to fix, without the password."""
    async with tls_gateway(pki) as gateway:
        settings = settings_for(
            gateway.target, database_url, "--tls", "--ca-file", str(pki.wrong_ca)
        )
        with pytest.raises(ConfigError) as caught:
            await Daemon(settings).run()
    message = str(caught.value)
    assert caught.value.exit_code == 78
    assert "\n" not in message
    assert "--ca-file" in message
    assert PASSWORD not in message


async def test_plaintext_client_against_tls_gateway_fails_without_leaking(pki: Pki) -> None:
    """A TLS gateway dialled without --tls: a feed error naming no secret."""
    async with tls_gateway(pki) as gateway:
        channel = open_channel(gateway.target, None)
        try:
            with pytest.raises((FeedTlsError, FeedUnavailableError)) as caught:
                await FeedClient(channel, LOGIN, PASSWORD).check_access(deadline_s=2)
        finally:
            await channel.close(grace=None)
    assert PASSWORD not in str(caught.value)


async def _subscribe_and_ack(target: str, tls: TlsSettings, expected: int) -> int:
    """Read `expected` receipts from a Subscribe stream over `tls`, ack them on the Pull/Ack
    channel, and return how many the gateway counted acked."""
    channel = open_channel(target, tls)
    stream_channel = open_stream_channel(target, tls)
    try:
        client = FeedClient(channel, LOGIN, PASSWORD, stream_channel=stream_channel)
        stream = client.subscribe(window=100)
        receipts: list[Receipt] = []
        try:
            while len(receipts) < expected:
                batch = await asyncio.wait_for(stream.read(), 10)
                assert batch is not None
                receipts.extend(batch)
        finally:
            stream.cancel()
        outcome = await client.ack([r.ack_token for r in receipts])
        return outcome.acked
    finally:
        stream_channel.close()
        await channel.close(grace=None)


async def test_subscribe_over_mtls_with_private_ca(pki: Pki) -> None:
    """The Subscribe streams have a channel of their own: the same CA, client
    pair and name checks as the Pull/Ack channel."""
    async with tls_gateway(pki, mtls=True) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(6))
        tls = TlsSettings(ca_file=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key)
        assert await _subscribe_and_ack(gateway.target, tls, 6) == 6


async def test_subscribe_checks_the_overridden_server_name(pki: Pki) -> None:
    """--tls-server-name replaces the dialled host in the certificate check: a name the
    certificate carries passes, another is a TLS error, not a retry that hides the cause."""
    async with tls_gateway(pki) as gateway:
        await gateway.inject(LOGIN, receipt_bodies(4))
        named = TlsSettings(ca_file=pki.ca, server_name="localhost")
        assert await _subscribe_and_ack(gateway.target, named, 4) == 4
        stream_channel = open_stream_channel(
            gateway.target, TlsSettings(ca_file=pki.ca, server_name="elsewhere.example")
        )
        client = FeedClient(
            open_channel(gateway.target, None), LOGIN, PASSWORD, stream_channel=stream_channel
        )
        stream = client.subscribe(window=10)
        try:
            with pytest.raises(FeedTlsError) as caught:
                await asyncio.wait_for(stream.read(), 10)
        finally:
            stream.cancel()
            stream_channel.close()
    assert PASSWORD not in str(caught.value)


async def test_subscribe_with_a_wrong_ca_is_a_tls_error(pki: Pki) -> None:
    async with tls_gateway(pki) as gateway:
        stream_channel = open_stream_channel(gateway.target, TlsSettings(ca_file=pki.wrong_ca))
        client = FeedClient(
            open_channel(gateway.target, None), LOGIN, PASSWORD, stream_channel=stream_channel
        )
        stream = client.subscribe(window=10)
        try:
            with pytest.raises(FeedTlsError):
                await asyncio.wait_for(stream.read(), 10)
        finally:
            stream.cancel()
            stream_channel.close()


def test_unreadable_tls_files_are_one_configuration_line(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-certificate.pem"
    bad.write_text("not PEM\n")
    with pytest.raises(ConfigError) as caught:
        open_stream_channel("127.0.0.1:1", TlsSettings(ca_file=bad))
    assert "\n" not in str(caught.value)
    assert "--ca-file" in str(caught.value)
