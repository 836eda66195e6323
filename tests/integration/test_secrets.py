"""Secrets: the gateway password reaches the gateway and nothing else (docs/security.md).

A real `dlrfeed run` process with the password in a file: the password (and its base64 form in
the authorization header) never shows in its argv, environment, process title, logs or metrics,
nor in the one-line error of a refused login; `--password` on the command line is refused
without echoing the value; a password file open to group/others draws `password_file_exposed`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dlrfeed_tools.daemon_harness import LOGIN, drained, receipt_bodies, run_args, wait_until
from dlrfeed_tools.ports import logged_metrics_address
from fakegw.server import FakeGateway

REPO = Path(__file__).resolve().parents[2]
SECRET = "Gw-pa55-7f3Kq9zT"  # distinctive, so a leak anywhere is found by plain search
WRONG = "Wr0ng-pa55-Lm4Xc2"


def _needles(password: str) -> list[bytes]:
    """Every form in which `password` could leak: plain and inside the Basic credential."""
    basic = base64.b64encode(f"{LOGIN}:{password}".encode()).decode()
    return [password.encode(), basic.encode(), basic[:16].encode()]


def _password_file(tmp_path: Path, password: str, mode: int) -> Path:
    path = tmp_path / "gateway-password"
    path.write_text(password + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


async def _spawn(log: Path, *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLRFEED_", "CREDENTIALS"))}
    env.pop("NOTIFY_SOCKET", None)
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dlrfeed.cli", *args, env=env, stdout=out, stderr=out, cwd=REPO
        )


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback http
        body: bytes = response.read()
    return body


def _events(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_password_is_in_no_argv_title_environment_log_or_metric(
    database_url: str, tmp_path: Path
) -> None:
    """A working daemon (it drains real receipts): every place an observer can look is clean;
    the 0644 password file is reported by `password_file_exposed`."""
    password_file = _password_file(tmp_path, SECRET, 0o644)
    log = tmp_path / "daemon.log"
    gateway = FakeGateway({LOGIN: SECRET})
    async with gateway.running():
        await gateway.inject(LOGIN, receipt_bodies(40))
        process = await _spawn(
            log,
            *run_args(gateway.target, database_url),
            "--password-file",
            str(password_file),
            "--metrics",
            "127.0.0.1:0",
        )
        try:
            await wait_until(lambda: drained(gateway), 30, "the daemon draining the queue")

            async def metrics_listening() -> bool:
                return logged_metrics_address(log) is not None

            await wait_until(metrics_listening, 30, "the daemon to serve its metrics")
            address = logged_metrics_address(log)
            assert address is not None
            metrics_url = f"http://{address[0]}:{address[1]}"
            proc = Path(f"/proc/{process.pid}")
            looked_at = {
                "argv": (proc / "cmdline").read_bytes(),
                "environ": (proc / "environ").read_bytes(),
                "title": (proc / "comm").read_bytes() + (proc / "status").read_bytes()[:200],
                "metrics": await asyncio.to_thread(_get, f"{metrics_url}/metrics"),
                "healthz": await asyncio.to_thread(_get, f"{metrics_url}/healthz"),
            }
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 20) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    looked_at["logs"] = log.read_bytes()
    assert b"dlrfeed_" in looked_at["metrics"]  # the scrape really returned the metrics
    for where, content in looked_at.items():
        for needle in _needles(SECRET):
            assert needle not in content, f"the password leaks into {where}"
    exposed = [e for e in _events(log) if e["event"] == "password_file_exposed"]
    assert len(exposed) == 1
    assert exposed[0]["mode"] == "0644"
    assert exposed[0]["level"] == "warning"


async def test_a_refused_login_exits_with_one_line_that_holds_no_password(
    database_url: str, tmp_path: Path
) -> None:
    """UNAUTHENTICATED is fatal: non-zero exit, one clear line, no password in it; a 0600 file
    draws no exposure warning."""
    password_file = _password_file(tmp_path, WRONG, 0o600)
    log = tmp_path / "daemon.log"
    async with FakeGateway({LOGIN: SECRET}).running() as gateway:
        process = await _spawn(
            log, *run_args(gateway.target, database_url), "--password-file", str(password_file)
        )
        code = await asyncio.wait_for(process.wait(), 30)
    output = log.read_bytes()
    assert code != 0
    assert b"refused the login" in output
    for needle in _needles(WRONG) + _needles(SECRET):
        assert needle not in output
    assert all(e["event"] != "password_file_exposed" for e in _events(log))


@pytest.mark.parametrize("form", [["--password", SECRET], [f"--password={SECRET}"]])
async def test_password_on_the_command_line_is_refused_without_echo(
    database_url: str, tmp_path: Path, form: list[str]
) -> None:
    """No `--password` flag exists (argv is world-readable in /proc and ps): refused, and the
    refusal does not repeat the value."""
    log = tmp_path / "cli.log"
    process = await _spawn(log, *run_args("127.0.0.1:1", database_url), *form)
    code = await asyncio.wait_for(process.wait(), 30)
    output = log.read_bytes()
    assert code != 0
    assert b"never accepted on the command line" in output
    assert SECRET.encode() not in output
