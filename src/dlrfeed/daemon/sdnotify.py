"""sd_notify without a dependency: one datagram to `$NOTIFY_SOCKET` (systemd's protocol).

The protocol is a single `sendto()` of `KEY=VALUE` lines to an AF_UNIX datagram socket whose
path is in `NOTIFY_SOCKET` (a leading `@` means the abstract namespace). Eight lines do not
justify a package; outside systemd (no `NOTIFY_SOCKET`) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


class SystemdNotifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING to systemd when run as a Type=notify unit."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        watchdog_usec = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if watchdog_usec.isdigit() and (not watchdog_pid or watchdog_pid == str(os.getpid())):
            # Ping at half the interval, as sd_watchdog_enabled(3) recommends.
            self.watchdog_interval = int(watchdog_usec) / 2_000_000

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, **fields: str) -> None:
        """Send one state message, e.g. `notify(READY="1", STATUS="reading")`."""
        if not self._address:
            return
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(payload, self._address)
            except OSError:
                # systemd gone (e.g. during shutdown): a notification is best effort.
                return
