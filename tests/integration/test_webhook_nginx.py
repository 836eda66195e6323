"""The reverse proxy docs/webhook.md recommends, run for real: nginx with the documented
configuration terminates TLS in front of `dlrfeed webhook`, and a callback posted over HTTPS is
stored with the caller's address beside the proxy's; an oversized one still reaches dlrfeed."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from dlrfeed_tools.pgcluster import free_port
from support.webhook_harness import SECRET, running_webhook, webhook_settings

DOCUMENTED = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "nginx-dlrfeed-webhook.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (the test's client trusts exactly it)."""
    cert, key = directory / "fullchain.pem", directory / "privkey.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def nginx_in_front(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """nginx running the documented server block, with only its marked values replaced: the
    certificate, the public port, the upstream port. Yields (certificate, https port, the port
    dlrfeed must listen on)."""
    cert, key = _certificate(tmp_path)
    public, upstream = free_port(), free_port()
    server_block = (
        DOCUMENTED.read_text()
        .replace("listen 443 ssl;", f"listen 127.0.0.1:{public} ssl;")
        .replace("server_name dlr.example.net;", "server_name localhost;")
        .replace("/etc/ssl/dlrfeed/fullchain.pem", str(cert))
        .replace("/etc/ssl/dlrfeed/privkey.pem", str(key))
        .replace("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream};")
        .replace("/var/log/nginx/error.log", f"{tmp_path}/error.log")
    )
    (tmp_path / "dlrfeed-webhook.conf").write_text(server_block)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)  # nginx's workers drop to `nobody` when the master runs as root
    (tmp_path / "nginx.conf").write_text(
        f"""
        daemon off;
        pid {tmp_path}/nginx.pid;
        error_log {tmp_path}/error.log warn;
        events {{ worker_connections 64; }}
        http {{
            access_log off;
            client_body_temp_path {scratch}/body;
            proxy_temp_path {scratch}/proxy;
            fastcgi_temp_path {scratch}/fastcgi;
            uwsgi_temp_path {scratch}/uwsgi;
            scgi_temp_path {scratch}/scgi;
            include {tmp_path}/dlrfeed-webhook.conf;
        }}
        """
    )
    command = [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]
    subprocess.run([*command, "-t"], check=True, capture_output=True)  # the syntax, as `nginx -t`
    with subprocess.Popen(command) as process:
        try:
            yield cert, public, upstream
        finally:
            process.terminate()


async def test_callbacks_through_the_documented_nginx_are_stored_with_both_addresses(
    database_url: str,
    db: asyncpg.Connection,
    nginx_in_front: tuple[Path, int, int],
    tmp_path: Path,
) -> None:
    cert, public, upstream = nginx_in_front
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    settings = webhook_settings(
        database_url, "--listen", f"127.0.0.1:{upstream}", "--secret-file", str(secret_file)
    )
    callback = json.dumps({"id": "via-nginx", "level": 2, "stat": "DELIVRD"}).encode()
    oversized = json.dumps({"id": "big", "text": "x" * (70 * 1024)}).encode()
    async with (
        running_webhook(settings),
        httpx.AsyncClient(
            verify=ssl.create_default_context(cafile=cert),
            base_url=f"https://localhost:{public}",
            headers={"Authorization": f"Bearer {SECRET}"},
        ) as client,
    ):
        for _ in range(100):  # nginx binds its port just after it starts
            try:
                answer = await client.post("/dlr", content=callback)
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.05)
        assert answer.status_code == 200
        assert answer.json() == {"outcome": "uncorrelated"}
        too_big = await client.post("/", content=oversized)
        assert too_big.status_code == 413
        assert (await client.post("/elsewhere", content=callback)).status_code == 404
        # The path secret, for gateways without headers: through its own location.
        in_path = json.dumps({"id": "path-secret", "level": 2, "stat": "DELIVRD"}).encode()
        answer = await client.post(f"/dlr/{SECRET}", content=in_path, headers={"Authorization": ""})
        assert answer.status_code == 200
    (payload, peer), *_ = await db.fetch("SELECT payload, peer FROM dlr.receptions ORDER BY id")
    assert bytes(payload) == callback
    assert peer.startswith("127.0.0.1:")
    assert peer.endswith(" for 127.0.0.1")  # the caller's address, as nginx forwarded it
    evidence = await db.fetchval("SELECT evidence FROM dlr.exceptions WHERE kind = 'unstorable'")
    assert bytes(evidence) == oversized[: 64 * 1024]


async def test_nginx_logs_no_secret_from_the_path_when_dlrfeed_is_down(
    nginx_in_front: tuple[Path, int, int], tmp_path: Path
) -> None:
    """With dlrfeed down, a callback to /dlr/SECRET is a 502 that nginx's error log does not
    quote (the line would hold the secret); one to /dlr is logged as usual."""
    cert, public, _ = nginx_in_front
    async with httpx.AsyncClient(
        verify=ssl.create_default_context(cafile=cert), base_url=f"https://localhost:{public}"
    ) as client:
        for _ in range(100):  # nginx binds its port just after it starts
            try:
                in_path = await client.post(f"/dlr/{SECRET}", content=b"{}")
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.05)
        in_header = await client.post("/dlr", content=b"{}")
    assert (in_path.status_code, in_header.status_code) == (502, 502)
    log = (tmp_path / "error.log").read_text()
    assert "connect() failed" in log, "the /dlr failure is logged"
    assert SECRET not in log
