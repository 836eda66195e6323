"""A real Kannel (Debian's `kannel`: bearerbox + smsbox) on loopback, for the callback tests.

`running_kannel` writes one configuration into a fresh directory — bearerbox with one SMPP
link to the given SMSC port (`smsc = smpp`, transceiver mode), smsbox with a `sendsms-user` —
starts bearerbox, waits until its SMPP link is online, starts smsbox, waits until bearerbox
counts it connected and its sendsms port answers, and on exit stops both with SIGTERM (bearerbox
unbinds its SMPP link first). Kannel binds ports it is given, so they are picked free just
before it starts; should another process take one meanwhile, bearerbox or smsbox exits at
start and the run is retried on new ports. Kannel runs as whoever runs the tests (it does not
refuse root, nor need it: every port is above 1024, every file in the directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from dlrfeed_tools.pgcluster import free_port

SMSC_ID = "sim"
"""The smsc-id of the SMPP link: what Kannel's `%i` expands to."""
SENDSMS_USER = "dlrfeed"
SENDSMS_PASSWORD = "sendsms-pw"
ADMIN_PASSWORD = "admin-pw"
_STARTS = 3  # attempts, each on new ports (a port taken between picking and binding)
_READY_S = 60.0  # generous: two cores shared with other test runs


def kannel_binaries() -> tuple[Path, Path]:
    """(bearerbox, smsbox), from PATH or Debian's /usr/sbin."""
    found = []
    for name in ("bearerbox", "smsbox"):
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
        if path is None:
            raise FileNotFoundError(f"{name} not found: run scripts/ensure-system-packages.sh")
        found.append(Path(path))
    return found[0], found[1]


@dataclass(frozen=True, slots=True)
class Kannel:
    """A running Kannel: where to send and where it logs."""

    sendsms_url: str
    admin_url: str
    directory: Path

    async def send(
        self, client: httpx.AsyncClient, *, sender: str, to: str, text: str, dlr_url: str
    ) -> httpx.Response:
        """One message through smsbox's sendsms interface, asking for every report (31)."""
        return await client.get(
            self.sendsms_url,
            params={
                "username": SENDSMS_USER,
                "password": SENDSMS_PASSWORD,
                "from": sender,
                "to": to,
                "text": text,
                "dlr-mask": "31",
                "dlr-url": dlr_url,
            },
        )

    async def status(self, client: httpx.AsyncClient) -> str:
        """bearerbox's status page (status.txt)."""
        answer = await client.get(
            f"{self.admin_url}/status.txt", params={"password": ADMIN_PASSWORD}
        )
        answer.raise_for_status()
        return answer.text

    def smsbox_log(self) -> str:
        """smsbox's log so far."""
        path = self.directory / "smsbox.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """The tail of both boxes' logs, for a failure message."""
        return "\n".join(
            f"--- {name}\n{(self.directory / name).read_text(errors='replace')[-3000:]}"
            for name in ("bearerbox.log", "smsbox.log")
            if (self.directory / name).exists()
        )


def kannel_conf(
    directory: Path,
    smsc_port: int,
    ports: tuple[int, int, int],
    smsbox: Mapping[str, str],
) -> str:
    """The configuration the tests run (docs/webhook-formats.md shows its essentials): `ports`
    are bearerbox's admin and box ports and smsbox's sendsms port; `smsbox` adds settings to
    the smsbox group."""
    admin, boxes, sendsms = ports
    extra = "".join(f"{name} = {value}\n" for name, value in smsbox.items())
    return f"""\
group = core
admin-port = {admin}
admin-interface = 127.0.0.1
admin-password = {ADMIN_PASSWORD}
smsbox-port = {boxes}
smsbox-interface = 127.0.0.1
box-allow-ip = 127.0.0.1
dlr-storage = internal
log-file = "{directory}/bearerbox.log"
log-level = 0

group = smsc
smsc = smpp
smsc-id = {SMSC_ID}
host = 127.0.0.1
port = {smsc_port}
transceiver-mode = true
smsc-username = kannel
smsc-password = smpp-pw
system-type = ""
enquire-link-interval = 30
reconnect-delay = 1

group = smsbox
bearerbox-host = 127.0.0.1
bearerbox-port = {boxes}
sendsms-port = {sendsms}
sendsms-interface = 127.0.0.1
log-file = "{directory}/smsbox.log"
log-level = 0
{extra}
group = sendsms-user
username = {SENDSMS_USER}
password = {SENDSMS_PASSWORD}
"""


@contextlib.asynccontextmanager
async def running_kannel(
    smsc_port: int, directory: Path, smsbox: Mapping[str, str] | None = None
) -> AsyncIterator[Kannel]:
    """bearerbox and smsbox, configured in `directory`, linked to the SMSC at `smsc_port`;
    `smsbox` adds settings to smsbox's group (`http-request-retry`, ...)."""
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(_STARTS):
            admin, boxes, sendsms = free_port(), free_port(), free_port()
            conf = directory / "kannel.conf"
            conf.write_text(
                kannel_conf(directory, smsc_port, (admin, boxes, sendsms), smsbox or {})
            )
            kannel = Kannel(
                f"http://127.0.0.1:{sendsms}/cgi-bin/sendsms",
                f"http://127.0.0.1:{admin}",
                directory,
            )
            processes: list[asyncio.subprocess.Process] = []
            try:
                if await _start_boxes(kannel, conf, client, processes):
                    yield kannel
                    return
            finally:
                for process in reversed(processes):
                    await _stop(process)
    raise AssertionError(f"Kannel did not start, {_STARTS} times\n{kannel.logs()}")


async def _start_boxes(
    kannel: Kannel,
    conf: Path,
    client: httpx.AsyncClient,
    processes: list[asyncio.subprocess.Process],
) -> bool:
    """Start bearerbox, then smsbox once bearerbox takes boxes (it opens its smsbox port just
    before it starts its SMSC links, and smsbox gives up at once when it cannot connect).
    False if a box exited while starting: a port of its configuration was taken."""
    bearerbox, smsbox = kannel_binaries()
    processes.append(await _start(bearerbox, conf, kannel.directory / "bearerbox.out"))
    if not await _ready(processes, lambda: _link_online(kannel, client), "the SMPP link online"):
        return False
    processes.append(await _start(smsbox, conf, kannel.directory / "smsbox.out"))
    return await _ready(processes, lambda: _smsbox_ready(kannel, client), "smsbox connected")


async def _start(binary: Path, conf: Path, out: Path) -> asyncio.subprocess.Process:
    with out.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            str(binary), str(conf), stdout=log, stderr=log, start_new_session=True
        )


async def _ready(
    processes: list[asyncio.subprocess.Process],
    condition: Callable[[], Awaitable[bool]],
    what: str,
) -> bool:
    """True once `condition` holds; False if a box exited first (a port was taken)."""
    deadline = time.monotonic() + _READY_S
    while not await condition():
        if any(p.returncode is not None for p in processes):
            return False
        if time.monotonic() > deadline:
            raise AssertionError(f"Kannel: timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return True


async def _link_online(kannel: Kannel, client: httpx.AsyncClient) -> bool:
    try:
        status = await kannel.status(client)
    except httpx.HTTPError:
        return False
    return any(
        line.strip().startswith(f"{SMSC_ID}[") and "(online" in line for line in status.splitlines()
    )


async def _smsbox_ready(kannel: Kannel, client: httpx.AsyncClient) -> bool:
    try:
        status = await kannel.status(client)
        if "smsbox:" not in status.partition("Box connections:")[2]:
            return False
        await client.get(kannel.sendsms_url)  # any answer: smsbox serves sendsms
    except httpx.HTTPError:
        return False
    return True


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, as an operator stops Kannel; SIGKILL if it takes longer than a minute."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
