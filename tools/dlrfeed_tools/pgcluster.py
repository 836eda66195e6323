"""A throwaway PostgreSQL cluster on a free loopback port, for tests, `make run` and benchmarks.

PostgreSQL refuses to run as root, so when we are root the cluster is owned by and run as the
`postgres` system user (created by Debian's package) through `runuser`. Nothing here is used by
the daemon itself: production points `dlrfeed` at a real server with `--database-url`.

    python scripts/pgcluster.py start DIR [--port N] [--fsync]   # prints the DSN
    python scripts/pgcluster.py stop DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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


def scratch_directory(name: str) -> Path:
    """A new directory for a server run as the server user (a cluster, a pooler), outside
    pytest's temporary root: every pytest that starts as the same user resets that root to
    0700, which would cut a running server off from its files (it then fails, PANIC, mid-run).
    Whoever made it removes it (`PgCluster.destroy`, `ReplicatedPair.destroy`, ...)."""
    return Path(tempfile.mkdtemp(prefix=f"dlrfeed-{name}-"))


def give_to_server_user(directory: Path, *owned: Path) -> None:
    """When we are root, make `directory` (and `owned`) the server user's and open the path
    down to it for traversal: PostgreSQL and PgBouncer refuse to run as root, so they run as
    that user and must reach their files."""
    if os.geteuid() != 0:
        return
    owner = pwd.getpwnam(_RUN_AS_USER)
    for parent in [directory, *directory.parents]:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o011)
    for path in (directory, *owned):
        os.chown(path, owner.pw_uid, owner.pw_gid)


@dataclass
class PgCluster:
    """One cluster in `root` (data in root/data, socket and log beside it)."""

    root: Path
    port: int
    fsync: bool = False
    settings: tuple[str, ...] = ()
    """Extra `name=value` server settings, after (and so over) the defaults of `start`."""

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
        give_to_server_user(self.root, self.datadir)
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

    def _own_root(self) -> None:
        """Create `root` and make it the cluster owner's, reachable down from `/`."""
        self.root.mkdir(parents=True, exist_ok=True)
        give_to_server_user(self.root)

    def init_standby_of(self, primary: PgCluster, slot: str) -> None:
        """A streaming standby of the running `primary`: pg_basebackup -R through a new
        physical replication slot `slot`. Start it with `cluster_name` set in `settings`: the
        standby reports that name to the primary (for synchronous_standby_names)."""
        self._own_root()
        self._run(
            [
                str(server_bindir() / "pg_basebackup"),
                "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                "-D", str(self.datadir), "-R", "-C", "-S", slot, "-X", "stream",
                "--no-sync", "-c", "fast",
            ]
        )  # fmt: skip

    def promote(self) -> None:
        """pg_ctl promote: a standby becomes a primary; returns once it accepts writes."""
        self._run([str(server_bindir() / "pg_ctl"), "-D", str(self.datadir), "-w", "promote"])

    def kill9(self) -> None:
        """SIGKILL the postmaster and every process of the cluster at once, as a crash of its
        host would: frozen first (SIGSTOP), so that none sends more WAL while the others die."""
        pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        processes = [pid, *map(int, children)]
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process, signum)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)

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
            *(f"-c {setting}" for setting in self.settings),
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


@dataclass
class ReplicatedPair:
    """A primary and its streaming standby (two clusters under `root`), for failover drills.

    The standby is made by pg_basebackup -R through a replication slot and connects as
    `standby1`. With `synchronous`, the primary names it in synchronous_standby_names and
    commits with synchronous_commit=on: a commit returns once the standby has flushed it.
    Without, commits wait for the primary's own WAL flush only (synchronous_commit=local), as a
    typical asynchronous setup does. Set it up with `start`, break it with `kill9_primary`,
    fail over with `promote_standby`.
    """

    root: Path
    synchronous: bool
    standby_name: str = "standby1"
    primary: PgCluster = field(init=False)
    standby: PgCluster = field(init=False)

    def __post_init__(self) -> None:
        commit = "on" if self.synchronous else "local"
        self.primary = PgCluster(
            self.root / "primary", free_port(), settings=(f"synchronous_commit={commit}",)
        )
        self.standby = PgCluster(
            self.root / "standby",
            free_port(),
            settings=(f"cluster_name={self.standby_name}", f"synchronous_commit={commit}"),
        )

    def url(self, database: str) -> str:
        """A multi-host URL that finds whichever of the two accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{database}?target_session_attrs=read-write"
        )

    async def start(self, within_s: float = 60.0) -> None:
        """Start the primary, clone and start the standby, and wait until it streams (and,
        when synchronous, until the primary counts it as its synchronous standby)."""
        await asyncio.to_thread(self.primary.init)
        await asyncio.to_thread(self.primary.start)
        await asyncio.to_thread(self.standby.init_standby_of, self.primary, self.standby_name)
        await asyncio.to_thread(self.standby.start)
        conn = await asyncpg.connect(self.primary.dsn)
        try:
            if self.synchronous:
                # Only now: a base backup taken after this would carry the setting into the
                # standby, whose commits would wait, once promoted, for a standby it lacks.
                await conn.execute(
                    f"ALTER SYSTEM SET synchronous_standby_names = '{self.standby_name}'"
                )
                await conn.execute("SELECT pg_reload_conf()")
            wanted = "sync" if self.synchronous else "async"
            deadline = time.monotonic() + within_s
            while (
                await conn.fetchval(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
                    self.standby_name,
                )
                != wanted
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not become {wanted} in {within_s} s")
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    async def cut_replication(self) -> int:
        """Cut the standby off, as a network fault between the two would: its WAL receiver is
        frozen (SIGSTOP, so it cannot reconnect) and the primary's WAL sender to it ended. The
        standby keeps only what reached it; the primary streams to no one (asynchronous:
        commits go on; synchronous: commits wait). Returns the receiver's pid for
        `resume_standby`."""
        standby = await asyncpg.connect(self.standby.dsn)
        try:
            receiver = int(await standby.fetchval("SELECT pid FROM pg_stat_wal_receiver"))
        finally:
            await standby.close()
        os.kill(receiver, signal.SIGSTOP)
        primary = await asyncpg.connect(self.primary.dsn)
        try:
            await primary.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_replication"
                " WHERE application_name = $1",
                self.standby_name,
            )
        finally:
            await primary.close()
        return receiver

    @staticmethod
    def resume_standby(receiver: int) -> None:
        """Let the WAL receiver frozen by `cut_replication` run again."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(receiver, signal.SIGCONT)

    async def kill9_primary(self) -> None:
        await asyncio.to_thread(self.primary.kill9)

    async def promote_standby(self) -> None:
        await asyncio.to_thread(self.standby.promote)

    async def destroy(self) -> None:
        for cluster in (self.standby, self.primary):
            await asyncio.to_thread(cluster.destroy)
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie left to an init that does not reap it has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def start_on_a_free_port(root: Path, *, fsync: bool = False, attempts: int = 5) -> PgCluster:
    """init and start a cluster in `root` on a free loopback port. `free_port` can only say
    what is free now: when another process binds the port before the server does, the start
    is tried again on another port (up to `attempts` times) instead of failing."""
    for _ in range(attempts):
        cluster = PgCluster(root, free_port(), fsync=fsync)
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


@contextlib.contextmanager
def throwaway_cluster(prefix: str, *, fsync: bool = True) -> Iterator[PgCluster]:
    """A started cluster in a temporary directory named after `prefix`, destroyed on exit:
    what a benchmark measures on (fsync on by default, as production runs)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        cluster = start_on_a_free_port(Path(root), fsync=fsync)
        try:
            yield cluster
        finally:
            cluster.destroy()


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
