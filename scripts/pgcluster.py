"""A throwaway PostgreSQL cluster on a free loopback port, for tests, `make run` and benchmarks.

PostgreSQL refuses to run as root, so when we are root the cluster is owned by and run as the
`postgres` system user (created by Debian's package) through `runuser`. Nothing here is used by
the daemon itself: production points `dlrfeed` at a real server with `--database-url`.

    python scripts/pgcluster.py start DIR [--port N] [--fsync]   # prints the DSN
    python scripts/pgcluster.py stop DIR
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

_RUN_AS_USER = "postgres"


def server_bindir() -> Path:
    """The directory holding initdb/pg_ctl/postgres, newest major version first."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and (candidate / "initdb").exists():
            return candidate
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
        reverse=True,
    )
    if not versions:
        raise RuntimeError(
            "PostgreSQL server binaries not found: run scripts/ensure-system-packages.sh"
        )
    return Path(versions[0]).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgCluster:
    """One cluster in `root` (data in root/data, socket and log beside it)."""

    root: Path
    port: int
    fsync: bool = False

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", _RUN_AS_USER, "--", *args]
        return args

    def _run(self, args: list[str]) -> None:
        proc = subprocess.run(self._as_owner(args), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def init(self) -> None:
        """initdb, unless the data directory already holds a cluster."""
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.datadir / "PG_VERSION").exists():
            return
        self.datadir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(_RUN_AS_USER)
            # The owner must be able to reach the directory: open the path down to it.
            for parent in [self.root, *self.root.parents]:
                if parent == Path("/"):
                    break
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o011)
            for path in (self.root, self.datadir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self.datadir.chmod(0o700)
        bindir = server_bindir()
        self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        bindir = server_bindir()
        settings = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.root}",
            "-c max_connections=200",
            "-c shared_buffers=128MB",
            f"-c fsync={'on' if self.fsync else 'off'}",
            f"-c synchronous_commit={'on' if self.fsync else 'off'}",
            f"-c full_page_writes={'on' if self.fsync else 'off'}",
        ]
        self._run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                " ".join(settings),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL did not accept connections on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (mode: smart, fast or immediate); quiet if it is not running."""
        if not (self.datadir / "postmaster.pid").exists():
            return
        bindir = server_bindir()
        with contextlib.suppress(RuntimeError):
            self._run([str(bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    async def create_database(self, name: str, template: str | None = None) -> str:
        """CREATE DATABASE `name` (a copy of `template` when given); returns its DSN."""
        conn = await asyncpg.connect(self.dsn)
        try:
            copy = f" TEMPLATE {template}" if template else ""
            await conn.execute(f"CREATE DATABASE {name}{copy}")
        finally:
            await conn.close()
        return self.dsn_for(name)

    async def drop_database(self, name: str) -> None:
        """DROP DATABASE `name`, disconnecting whoever is still connected to it."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_on_a_free_port(root: Path, *, attempts: int = 5) -> PgCluster:
    """init and start a cluster in `root` on a free loopback port. `free_port` can only say
    what is free now: when another process binds the port before the server does, the start
    is tried again on another port (up to `attempts` times) instead of failing."""
    for _ in range(attempts):
        cluster = PgCluster(root, free_port())
        cluster.init()
        logged = cluster.logfile.stat().st_size if cluster.logfile.exists() else 0
        try:
            cluster.start()
        except RuntimeError:
            with cluster.logfile.open("rb") as log:
                log.seek(logged)
                if b"Address already in use" not in log.read():
                    raise
        else:
            return cluster
    raise RuntimeError(f"PostgreSQL found no free port in {attempts} tries")


def _port_file(root: Path) -> Path:
    return root / "port"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="init if needed, start, print the DSN")
    start.add_argument("root", type=Path)
    start.add_argument("--port", type=int, default=0)
    start.add_argument("--fsync", action="store_true", help="durable settings (benchmarks)")
    stop = sub.add_parser("stop", help="stop the cluster in ROOT")
    stop.add_argument("root", type=Path)
    args = parser.parse_args(argv)

    root: Path = args.root.resolve()
    if args.command == "start":
        port_file = _port_file(root)
        port = args.port or (int(port_file.read_text()) if port_file.exists() else free_port())
        cluster = PgCluster(root, port, fsync=args.fsync)
        cluster.init()
        port_file.write_text(str(port))
        cluster.start()
        print(cluster.dsn)
        return 0
    port_file = _port_file(root)
    if port_file.exists():
        PgCluster(root, int(port_file.read_text())).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
