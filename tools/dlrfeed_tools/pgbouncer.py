"""A throwaway PgBouncer on a free loopback port in front of a throwaway PostgreSQL (pgcluster).

PgBouncer refuses to run as root, so when we are root it runs as the `postgres` system user, like
the clusters of `dlrfeed_tools.pgcluster`. Every database name is forwarded to the backend
(`*`), in
the pool mode asked for (transaction by default: the mode that breaks named prepared statements
and session state, and the one production poolers use). Used by the tests and for trying
`dlrfeed --database-pooler` by hand; production points dlrfeed at a real PgBouncer.

    python scripts/pgbouncer.py start DIR --backend-port N [--port N] [--mode transaction]
    python scripts/pgbouncer.py stop DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dlrfeed_tools.pgcluster import free_port, give_to_server_user

_RUN_AS_USER = "postgres"
_ADMIN_USER = "postgres"


def pgbouncer_binary() -> Path:
    """The pgbouncer executable (Debian installs it in /usr/sbin, often not on PATH)."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found is None:
        raise RuntimeError("pgbouncer not found: run scripts/ensure-system-packages.sh")
    return Path(found)


@dataclass
class PgBouncer:
    """One PgBouncer in `root` (its ini, auth file, socket, log and pid file beside each other).

    `users` are the role names clients may log in as (trust authentication, loopback only).
    """

    root: Path
    port: int
    backend_port: int
    pool_mode: str = "transaction"
    pool_size: int = 20
    users: tuple[str, ...] = ("postgres",)

    @property
    def ini(self) -> Path:
        return self.root / "pgbouncer.ini"

    @property
    def logfile(self) -> Path:
        return self.root / "pgbouncer.log"

    @property
    def pidfile(self) -> Path:
        return self.root / "pgbouncer.pid"

    def dsn_for(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def _write_config(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        auth_file = self.root / "userlist.txt"
        auth_file.write_text("".join(f'"{user}" ""\n' for user in self.users))
        self.ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.backend_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = trust\n"
            f"auth_file = {auth_file}\n"
            f"admin_users = {_ADMIN_USER}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {self.logfile}\n"
            f"pidfile = {self.pidfile}\n"
            # asyncpg names no startup parameter PgBouncer does not know, but psql and
            # drivers configured by hand may; they must not be refused.
            "ignore_startup_parameters = extra_float_digits,search_path\n"
        )
        give_to_server_user(self.root, self.ini, auth_file)

    def start(self, timeout: float = 30.0) -> None:
        """Write the config, start PgBouncer as a daemon and wait until it accepts clients."""
        self._write_config()
        args = [str(pgbouncer_binary()), "-d", str(self.ini)]
        if os.geteuid() == 0:
            args = ["runuser", "-u", _RUN_AS_USER, "--", *args]
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"pgbouncer failed: {proc.stderr.strip() or proc.stdout.strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._pid() is not None and self._accepts():
                return
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not accept connections on port {self.port}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def _pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.pidfile.read_text().strip())
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop PgBouncer (SIGINT: a safe shutdown) and wait for it; quiet if it is not running."""
        pid = self._pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start PgBouncer in ROOT, print a DSN through it")
    start.add_argument("root", type=Path)
    start.add_argument("--backend-port", type=int, required=True)
    start.add_argument("--port", type=int, default=0)
    start.add_argument(
        "--mode", choices=["session", "transaction", "statement"], default="transaction"
    )
    stop = sub.add_parser("stop", help="stop the PgBouncer in ROOT")
    stop.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if args.command == "start":
        bouncer = PgBouncer(root, args.port or free_port(), args.backend_port, args.mode)
        bouncer.start()
        print(bouncer.dsn_for("postgres"))
        return 0
    PgBouncer(root, 0, 0).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
