"""The local demo behind `make run`: PostgreSQL, fakegw, traffic, `dlrfeed run` and `dlrfeed
webhook`, one live view.

Starts, in order, a throwaway PostgreSQL cluster (data kept in DATA_DIR/postgres between runs),
`dlrfeed migrate`, `fakegw serve` (queue in DATA_DIR/fakegw.sqlite), `dlrfeed run` (2 streams,
metrics on a free port), `dlrfeed webhook` (the callback path: a share of the messages is sent
with its address as `dlr_url`, so fakegw POSTs their receipts there instead of queueing them)
and the traffic simulator (`dlrfeed_tools.traffic`), then redraws one view of the flow each
second until Ctrl-C or `--duration`. Stopping is ordered — traffic, then the daemon and the
receiver (SIGTERM, wait: they commit and ack or answer what they hold), then fakegw (callbacks
not yet answered stay in its store for the next run), then PostgreSQL — and
every child runs in its own process group, which is killed on every exit path. A summary from
`dlrfeed stats --json` and the commands to explore the data follow.

    python scripts/demo.py [--duration 60] [--data-dir .run] [--rate 200] [--anomaly-rate 0.04]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from dlrfeed_tools.demo_view import LiveView, Sample, http_get, render_summary, scrape_metrics
from dlrfeed_tools.local_login import LOGIN, PASSWORD
from dlrfeed_tools.paths import REPO
from dlrfeed_tools.pgcluster import PgCluster, free_port
from dlrfeed_tools.ports import logged_metrics_address
from fakegw.admin_client import SyncAdminClient

_STOP_TIMEOUT_SECONDS = 10.0


class DemoError(Exception):
    """A component failed to start or stopped by itself; the message names its log."""


class StopSignalError(Exception):
    """Ctrl-C or SIGTERM: stop everything in order."""


def _request_stop(_signum: int, _frame: object) -> None:
    raise StopSignalError


def _venv_command(name: str) -> str:
    """A console script of the project's venv (beside this interpreter), else from PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


@dataclass
class Child:
    """A child process in a process group of its own, so one signal reaches all it started."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    log_offset: int = 0  # where this run's output starts in the (appended) log

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log: Path, env: dict[str, str]) -> Child:
        with log.open("ab") as out:
            offset = out.tell()
            out.write(f"\n--- {datetime.now(UTC).isoformat()} {shlex.join(argv)}\n".encode())
            out.flush()
            process = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=REPO, start_new_session=True,
            )  # fmt: skip
        return cls(name, process, log, offset)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = _STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM the leader (it stops what it started, as in production), wait up to
        `timeout`, then SIGKILL the whole group: whatever is left, on every path. Returns the
        exit code, or None when it had to be killed."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self._signal_group(signal.SIGKILL)
        if code is None:
            self.process.wait()
        return code

    def _signal_group(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def tail(self, lines: int = 15) -> str:
        """The exit status and the last lines this run wrote to the log, for an error message."""
        with self.log.open("rb") as stream:
            stream.seek(self.log_offset)
            text = stream.read().decode(errors="replace").splitlines()
        code = self.process.poll()
        status = "running" if code is None else f"exit {code}" if code >= 0 else f"signal {-code}"
        return "\n".join([f"({status}; log {self.log})", *text[-lines:]])


@dataclass
class Layout:
    """Where a demo keeps its data (survives runs) and logs."""

    root: Path

    @property
    def postgres(self) -> Path:
        return self.root / "postgres"

    @property
    def fakegw_store(self) -> Path:
        return self.root / "fakegw.sqlite"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def _wait_for(what: str, ready: Any, child: Child, timeout: float) -> Any:
    """Poll `ready()` until it returns something truthy; DemoError if the child dies or time
    runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        if not child.alive():
            raise DemoError(f"{child.name} exited while {what}:\n{child.tail()}")
        time.sleep(0.1)
    raise DemoError(f"{child.name}: timed out {what} ({child.log})")


def _listening_target(log: Path, offset: int) -> str | None:
    """The `{"event": "listening"}` line fakegw prints once it serves (after `offset`)."""
    with log.open("rb") as stream:
        stream.seek(offset)
        for line in stream:
            if line.startswith(b'{"event": "listening"'):
                return str(json.loads(line)["target"])
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As PostgreSQL binds: connections of the last run in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _last_json_line(log: Path, offset: int) -> dict[str, Any]:
    """The traffic simulator's latest totals line written after `offset` (this run's)."""
    try:
        with log.open("rb") as stream:
            stream.seek(max(offset, log.stat().st_size - 4096))
            lines = stream.read().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if line.startswith(b'{"event": "traffic"'):
            value: dict[str, Any] = json.loads(line)
            return value
    return {}


# -- the run ------------------------------------------------------------------------------------


class Demo:
    """Owns the children and the cluster; `stop_all()` is safe to call on any exit path."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.layout = Layout(args.data_dir.resolve())
        self.cluster: PgCluster | None = None
        self.children: dict[str, Child] = {}
        self.database_url = ""
        self.gateway = ""
        self.metrics = ""
        self.webhook_url = ""
        self.traffic_log_offset = -1
        self.left_in_gateway: int | None = None
        self.run_started = datetime.now(UTC)
        self.env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD, "FAKEGW_PASSWORD": PASSWORD}
        self.env.pop("NOTIFY_SOCKET", None)  # the daemon is not a systemd unit here

    def say(self, text: str) -> None:
        print(text, flush=True)

    def start_postgres(self) -> None:
        """Init (first run) and start the cluster; the port is kept in postgres/port, as
        `scripts/pgcluster.py start` does, so the database URL stays the same between runs."""
        root = self.layout.postgres
        root.mkdir(parents=True, exist_ok=True)
        port_file = root / "port"
        port = int(port_file.read_text()) if port_file.exists() else free_port()
        cluster = PgCluster(root, port)
        cluster.stop("immediate")  # a cluster left running by a killed demo
        if not _port_free(port):
            port = free_port()  # taken by something else since the last run: a new URL
            cluster = PgCluster(root, port)
        try:
            cluster.init()
            port_file.write_text(str(port))
            self.cluster = cluster
            cluster.start()
        except RuntimeError as exc:
            raise DemoError(f"PostgreSQL: {exc} (log {cluster.logfile})") from exc
        self.database_url = cluster.dsn

    def run_command(self, *argv: str) -> str:
        """A short command to completion; DemoError with its output if it fails."""
        proc = subprocess.run(
            list(argv), env=self.env, cwd=REPO, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise DemoError(f"{shlex.join(argv)} failed:\n{proc.stderr or proc.stdout}")
        return proc.stdout

    def start_fakegw(self) -> None:
        log = self.layout.logs / "fakegw.log"
        offset = log.stat().st_size if log.exists() else 0
        child = Child.start(
            "fakegw",
            [
                _venv_command("fakegw"), "serve", "--listen", "127.0.0.1:0",
                "--login", f"{LOGIN}:{PASSWORD}", "--store", str(self.layout.fakegw_store),
                "--dlr-deadline-seconds", str(self.args.dlr_deadline_seconds),
                "--ledger-max-records", "100000",
            ],
            log, self.env,
        )  # fmt: skip
        self.children["fakegw"] = child
        self.gateway = _wait_for(
            "starting", lambda: _listening_target(log, offset), child, timeout=30
        )

    def start_daemon(self) -> None:
        log = self.layout.logs / "dlrfeed.log"
        child = Child.start(
            "dlrfeed",
            [
                _venv_command("dlrfeed"), "run", "--gateway", self.gateway, "--login", LOGIN,
                "--database-url", self.database_url, "--streams", str(self.args.streams),
                "--metrics", "127.0.0.1:0", "--log-format", "json",
            ],
            log, self.env,
        )  # fmt: skip
        self.children["dlrfeed"] = child
        host, port = _wait_for(
            "starting", lambda: logged_metrics_address(log, child.log_offset), child, timeout=30
        )
        self.metrics = f"{host}:{port}"
        _wait_for(
            "becoming healthy", lambda: http_get(self.metrics, "/healthz", 1) is not None, child, 30
        )

    def start_webhook(self) -> None:
        """The callback receiver on a free port; its URL is the dlr_url the traffic sends."""
        port, metrics = free_port(), f"127.0.0.1:{free_port()}"
        child = Child.start(
            "webhook",
            [
                _venv_command("dlrfeed"), "webhook", "--listen", f"127.0.0.1:{port}",
                "--login", LOGIN, "--database-url", self.database_url, "--metrics", metrics,
                "--log-format", "json",
            ],
            self.layout.logs / "webhook.log", self.env,
        )  # fmt: skip
        self.children["webhook"] = child
        self.webhook_url = f"http://127.0.0.1:{port}/dlr"
        _wait_for("becoming healthy", lambda: http_get(metrics, "/healthz", 1), child, 30)

    def start_traffic(self) -> None:
        self.children["traffic"] = traffic = Child.start(
            "traffic",
            [
                sys.executable, "-m", "dlrfeed_tools.traffic", "--target", self.gateway,
                "--login", LOGIN, "--database-url", self.database_url,
                "--rate", str(self.args.rate), "--anomaly-rate", str(self.args.anomaly_rate),
                "--webhook-url", self.webhook_url, "--webhook-rate", str(self.args.webhook_rate),
                "--lying-route-rate", str(self.args.lying_route_rate),
            ],
            self.layout.logs / "traffic.log", self.env,
        )  # fmt: skip
        self.traffic_log_offset = traffic.log_offset

    def traffic_totals(self) -> dict[str, Any]:
        """The simulator's latest totals line of this run (empty before its first)."""
        return _last_json_line(self.layout.logs / "traffic.log", self.traffic_log_offset)

    def watch(self) -> None:
        """Redraw the view each `--refresh` seconds until the duration ends (or Ctrl-C)."""
        view = LiveView(sys.stdout, self.args.tty, plain_every=max(self.args.refresh, 5.0))
        deadline = time.monotonic() + self.args.duration if self.args.duration else None
        with (
            SyncAdminClient(self.gateway, LOGIN, PASSWORD, timeout=2) as admin,
            asyncio.Runner() as runner,
        ):
            conn = runner.run(asyncpg.connect(self.database_url))
            try:
                while deadline is None or time.monotonic() < deadline:
                    for child in self.children.values():
                        if not child.alive():
                            raise DemoError(f"{child.name} stopped by itself:\n{child.tail()}")
                    sample = Sample(at=time.monotonic())
                    scrape_metrics(self.metrics, sample)
                    with contextlib.suppress(Exception):
                        stats = admin.stats()
                        sample.backlog, sample.in_flight = stats["queued"], stats["in_flight"]
                        sample.acked = stats["acked"]
                        sample.callbacks_answered = stats["callbacks_delivered"]
                        sample.callbacks_pending = stats["callbacks_pending"]
                    sample.open_exceptions = runner.run(
                        conn.fetchval(
                            "SELECT count(*) FROM dlr.exceptions WHERE resolved_at IS NULL"
                        )
                    )
                    sample.by_callback = runner.run(
                        conn.fetchval(
                            "SELECT count(*) FROM dlr.receptions"
                            " WHERE channel = 'webhook' AND received_at >= $1",
                            self.run_started,
                        )
                    )
                    view.show(sample, self.traffic_totals())
                    pause = self.args.refresh - (time.monotonic() - sample.at)
                    if deadline is not None:
                        pause = min(pause, deadline - time.monotonic())
                    time.sleep(max(0.0, pause))
            finally:
                with contextlib.suppress(Exception):  # the loop may have been interrupted
                    runner.run(conn.close())

    def stop_children(self) -> dict[str, int | None]:
        """Traffic first (no new receipts), then the daemon (it commits and acks what it holds),
        then the gateway. Exit codes by name (None = had to be killed)."""
        codes: dict[str, int | None] = {}
        for name, timeout in (
            ("traffic", 10.0),
            ("dlrfeed", 40.0),
            ("webhook", 40.0),
            ("fakegw", 10.0),
        ):
            child = self.children.pop(name, None)
            if child is None:
                continue
            if name == "fakegw" and child.alive():
                self.left_in_gateway = self._gateway_queue()
            codes[name] = child.stop(timeout)
        for child in self.children.values():  # anything else, should a step be added
            child.stop()
        self.children.clear()
        return codes

    def _gateway_queue(self) -> int | None:
        """Receipts still queued or leased at the gateway: F1 keeps them for the next run."""
        try:
            with SyncAdminClient(self.gateway, LOGIN, PASSWORD, timeout=2) as admin:
                stats = admin.stats()
        except grpc.RpcError:
            return None
        return int(stats["queued"]) + int(stats["in_flight"])

    def stop_postgres(self) -> None:
        if self.cluster is not None:
            self.cluster.stop("fast")
            self.cluster = None

    async def example_message(self) -> str | None:
        """A message of this run worth showing: conflicts, repeats and progress first."""
        conn = await asyncpg.connect(self.database_url)
        try:
            value = await conn.fetchval(
                """
                SELECT message_id FROM dlr.message_status
                WHERE login = $1 AND updated_at >= $2
                ORDER BY conflicts > 0 DESC, repeats > 0 DESC, progress_events DESC
                LIMIT 1
                """,
                LOGIN,
                self.run_started,
            )
        finally:
            await conn.close()
        return None if value is None else str(value)


def _short_path(path: Path) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def explore_hint(demo: Demo, message_id: str | None) -> list[str]:
    """How to look at the data afterwards: restart the cluster, then the operator commands."""
    url = demo.database_url
    rel = _short_path(demo.layout.postgres)
    dlrfeed = _short_path(Path(_venv_command("dlrfeed")))
    python = _short_path(Path(sys.executable))
    show = message_id or "MESSAGE_ID"
    return [
        "",
        f"Explore (PostgreSQL is stopped; its data stays in {rel}):",
        f"  {python} scripts/pgcluster.py start {rel}",
        f"  {dlrfeed} show {show} --database-url {url}",
        f"  {dlrfeed} stats --database-url {url}",
        f"  {dlrfeed} exceptions --database-url {url}",
        f"  {dlrfeed} quality --by route --database-url {url}",
        f"  {python} scripts/pgcluster.py stop {rel}",
        f"Logs: {_short_path(demo.layout.logs)}/ (fakegw, dlrfeed, webhook, traffic)",
    ]


def run(args: argparse.Namespace) -> int:
    """Start everything, watch, stop everything in order; 0 on a clean run, 1 on a failure."""
    demo = Demo(args)
    demo.layout.logs.mkdir(parents=True, exist_ok=True)
    # SIGHUP too: a closed terminal must stop the demo in order, not orphan its children.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _request_stop)
    failure: str | None = None
    codes: dict[str, int | None] = {}
    stats: dict[str, Any] | None = None
    message_id: str | None = None
    try:
        demo.say(f"data directory {demo.layout.root}")
        demo.start_postgres()
        demo.say(f"postgres   {demo.database_url}")
        demo.run_command(_venv_command("dlrfeed"), "migrate", "--database-url", demo.database_url)
        demo.start_fakegw()
        demo.say(f"fakegw     {demo.gateway} (store {demo.layout.fakegw_store})")
        demo.start_daemon()
        demo.say(f"dlrfeed    2 streams, metrics http://{demo.metrics}/metrics")
        demo.start_webhook()
        demo.say(f"webhook    {demo.webhook_url} (dlrfeed webhook: receipts by HTTP callback)")
        demo.start_traffic()
        demo.say(
            f"traffic    {args.rate:g} messages/s, anomaly rate {args.anomaly_rate:g}, "
            f"{args.webhook_rate:.0%} of them sent with dlr_url, {args.lying_route_rate:.0%} "
            "through a route that fakes DELIVRD\n"
        )
        demo.watch()
    except StopSignalError:
        pass
    except DemoError as exc:
        failure = str(exc)
    finally:
        # A second Ctrl-C must not abort the ordered stop half-way.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            demo.say("\nstopping: traffic, dlrfeed, webhook, fakegw, postgres ...")
        codes = demo.stop_children()
        if failure is None and demo.database_url:
            try:
                stats = json.loads(
                    demo.run_command(
                        _venv_command("dlrfeed"), "stats", "--json",
                        "--database-url", demo.database_url,
                    )
                )  # fmt: skip
                message_id = asyncio.run(demo.example_message())
            except (DemoError, OSError, asyncpg.PostgresError) as exc:
                failure = f"could not read the summary: {exc}"
        demo.stop_postgres()
    if failure is not None:
        print(f"\ndemo failed: {failure}\nlogs: {demo.layout.logs}", file=sys.stderr)
        return 1
    if codes.get("dlrfeed") not in (0, None):
        failure = f"dlrfeed exited {codes['dlrfeed']} (see {demo.layout.logs}/dlrfeed.log)"
    traffic = demo.traffic_totals() if demo.traffic_log_offset >= 0 else {}
    assert stats is not None
    print(
        "\n".join(
            render_summary(stats, traffic, codes, demo.left_in_gateway)
            + explore_hint(demo, message_id)
        )
    )
    if failure is not None:
        print(f"\ndemo failed: {failure}", file=sys.stderr)
        return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's options (`make run DURATION=60` passes --duration)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--duration", type=float, default=0.0, help="seconds to run (0 = until Ctrl-C)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=REPO / ".run", help="kept between runs (make clean)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="messages sent per second")
    parser.add_argument(
        "--anomaly-rate", type=float, default=0.04, help="see scripts/traffic.py --help"
    )
    parser.add_argument("--streams", type=int, default=2, help="dlrfeed run --streams")
    parser.add_argument(
        "--lying-route-rate",
        type=float,
        default=0.1,
        help="messages sent through the route whose DELIVRDs are fake (the summary names it)",
    )
    parser.add_argument(
        "--webhook-rate",
        type=float,
        default=0.2,
        help="messages sent with the receiver's address as dlr_url (their receipts by callback)",
    )
    parser.add_argument(
        "--dlr-deadline-seconds",
        type=float,
        default=60.0,
        help="fakegw's receipt deadline: withheld results become UNKNOWN after it (F3)",
    )
    parser.add_argument("--refresh", type=float, default=1.0, help="seconds between frames")
    parser.add_argument(
        "--plain", action="store_true", help="periodic lines even on a terminal (no redraw)"
    )
    args = parser.parse_args(argv)
    args.tty = sys.stdout.isatty() and not args.plain and os.environ.get("TERM") != "dumb"
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
