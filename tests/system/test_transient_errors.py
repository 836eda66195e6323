"""Transient database errors never end `dlrfeed run` or `dlrfeed webhook` (docs/postgresql.md,
"Transient errors: retried, never fatal"); fatal ones still end them in one line.

Each transient SQLSTATE class is induced for real on a PostgreSQL of this module's own (it is
crashed and restarted too) while a real `dlrfeed run` process drains fakegw and a real
`dlrfeed webhook` process takes fakegw's callbacks, both logged in as a role that is not a
superuser (so that connection limits apply). Each process must log the class it met and stay
up; once the fault clears, every receipt is stored once and applied once, fakegw's queue is
acked, and every callback was answered 2xx (after 503 + Retry-After while the fault lasted).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import migrate
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    PASSWORD,
    drained,
    receipt_bodies,
    run_args,
    running_gateway,
    wait_until,
)
from dlrfeed_tools.pgcluster import PgCluster, scratch_directory, start_on_a_free_port
from fakegw.callbacks import CallbackSettings
from fakegw.server import FakeGateway
from support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
APP_ROLE = "dlrfeed_app"  # owns the schema; not a superuser
TEMPLATE = "transient_template"
RUN, WEBHOOK = "dlrfeed-run", "dlrfeed-webhook"  # application_name of each process's sessions
FEED_RECEIPTS = 40  # 20 messages, a progress and a result each
CALLBACKS = 4
WITHIN_S = 45.0  # generous: both cores may be busy with other work
# fakegw as a patient gateway that never gives a callback up; it retries at most 0.2 s apart
# (sooner than the receiver's Retry-After of 1 s, to keep the test short).
PATIENT = CallbackSettings(attempts=1000, backoff_seconds=0.1, max_backoff_seconds=0.2)
_databases = itertools.count(1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A cluster of this module's own: its faults (crash, restart, read-only, connection
    limits) reach no other test's server."""
    cluster = start_on_a_free_port(scratch_directory("transient"))
    try:
        asyncio.run(_template(cluster))
        yield cluster
    finally:
        cluster.destroy()


async def _template(cluster: PgCluster) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN")
        await conn.execute(f"CREATE DATABASE {TEMPLATE} OWNER {APP_ROLE}")
    finally:
        await conn.close()
    await migrate(f"postgresql://{APP_ROLE}@127.0.0.1:{cluster.port}/{TEMPLATE}")


@dataclass
class Service:
    """One dlrfeed process and its JSON log; `handed_back` is the event it logs when a commit
    failed and its receipts wait for a retry (the daemon's batch, the receiver's 503s)."""

    name: str
    process: Process
    log: Path
    handed_back: str

    def events(self) -> list[dict[str, Any]]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def met(self, events: set[str], markers: tuple[str, ...]) -> bool:
        """Whether one of `events` was logged with an error that names one of `markers`."""
        return any(
            e["event"] in events and any(m in str(e.get("error")) for m in markers)
            for e in self.events()
        )

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@dataclass
class Rig:
    """The test's database, its superuser session, fakegw and the two processes."""

    cluster: PgCluster
    database: str
    gateway: FakeGateway
    tmp: Path
    proxy: TcpProxy | None = None
    admin: asyncpg.Connection | None = None
    services: list[Service] = field(default_factory=list)
    holding: asyncpg.transaction.Transaction | None = None
    stopping: asyncio.Task[None] | None = None

    @property
    def admin_dsn(self) -> str:
        return self.cluster.dsn_for(self.database)

    def app_dsn(self, application: str) -> str:
        port = self.proxy.port if self.proxy is not None else self.cluster.port
        return (
            f"postgresql://{APP_ROLE}@127.0.0.1:{port}/{self.database}"
            f"?application_name={application}"
        )

    async def connect_admin(self) -> asyncpg.Connection:
        """The superuser session on the test's database (again, after a crash or restart)."""

        async def connected() -> bool:
            try:
                self.admin = await asyncpg.connect(self.admin_dsn)
            except (OSError, asyncpg.PostgresError):
                return False
            return True

        await wait_until(connected, WITHIN_S, "PostgreSQL to take connections again")
        assert self.admin is not None
        return self.admin

    @property
    def db(self) -> asyncpg.Connection:
        assert self.admin is not None
        return self.admin

    async def hold_lock(self, *tables: str) -> None:
        """Lock `tables` in a transaction of the superuser session until `release_lock`."""
        self.holding = self.db.transaction()
        await self.holding.start()
        await self.db.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")

    async def release_lock(self) -> None:
        assert self.holding is not None
        await self.holding.rollback()
        self.holding = None

    async def waiting_on_locks(self) -> list[int]:
        """Backends of both processes waiting for a lock, once each process has one."""
        rows = await self.db.fetch(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND application_name = ANY($1::text[])",
            [RUN, WEBHOOK],
        )
        if {row["application_name"] for row in rows} != {RUN, WEBHOOK}:
            return []
        return [row["pid"] for row in rows]

    async def both_waiting_on_locks(self) -> list[int]:
        pids: list[int] = []

        async def waiting() -> bool:
            pids[:] = await self.waiting_on_locks()
            return bool(pids)

        await wait_until(waiting, WITHIN_S, "both processes to wait for the held lock")
        return pids

    async def terminate_sessions(self) -> None:
        """pg_terminate_backend every session of both processes."""
        await self.db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND usename = $1",
            APP_ROLE,
        )

    async def traffic(self, webhook_port: int) -> None:
        """Receipts for the daemon's feed and callbacks for the receiver, at once."""
        feed = receipt_bodies(FEED_RECEIPTS, prefix="f")
        url = f"http://127.0.0.1:{webhook_port}/dlr"
        hooks = [
            {"id": f"w{n}", "level": 2, "stat": "DELIVRD", "err": "000", "dlr_url": url}
            for n in range(CALLBACKS)
        ]
        await self.gateway.inject(LOGIN, [*feed, *hooks])


@dataclass(frozen=True)
class Fault:
    """One transient condition: set up before the processes start (`settings`), brought on
    (`induce`, then `strike` once traffic flows), what each process must meet (any one of
    `errors`: the client sees some conditions in more than one way), and its end."""

    name: str
    errors: tuple[str, ...]
    induce: Callable[[Rig], Awaitable[None]]
    clear: Callable[[Rig], Awaitable[None]]
    strike: Callable[[Rig], Awaitable[None]] | None = None
    settings: tuple[tuple[str, str], ...] = ()
    answered_503: bool = True
    through_proxy: bool = False


async def _lock_messages(rig: Rig) -> None:
    await rig.hold_lock("dlr.messages")  # the first table each ingest locks (P10)


async def _release(rig: Rig) -> None:
    await rig.release_lock()


async def _install_serialization_failure(rig: Rig) -> None:
    # The SQLSTATE is what matters: how the processes react to a serialization failure.
    await rig.db.execute(
        "CREATE FUNCTION public.serialization_failure() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'could not serialize access (induced by the test)'"
        " USING ERRCODE = '40001'; END$$;"
        " CREATE TRIGGER serialization_failure BEFORE INSERT ON dlr.reception_rows"
        " FOR EACH STATEMENT EXECUTE FUNCTION public.serialization_failure()"
    )


async def _remove_serialization_failure(rig: Rig) -> None:
    await rig.db.execute("DROP TRIGGER serialization_failure ON dlr.reception_rows")


async def _lock_receptions(rig: Rig) -> None:
    # Each ingest locks its messages first, then waits here for the receptions' table.
    await rig.hold_lock("dlr.reception_rows")
    await rig.db.execute("SET LOCAL deadlock_timeout = '60s'")  # the processes detect it


async def _close_the_cycle(rig: Rig) -> None:
    """Both ingests hold their messages and wait for our lock: asking for the messages now
    closes a real deadlock cycle, which each process's backend detects (40P01)."""
    await rig.both_waiting_on_locks()
    await rig.db.execute("LOCK TABLE dlr.messages IN ACCESS EXCLUSIVE MODE")


async def _limit_connections(rig: Rig) -> None:
    await rig.db.execute(f"ALTER DATABASE {rig.database} CONNECTION LIMIT 0")
    await rig.terminate_sessions()  # the pools must connect again


async def _unlimit_connections(rig: Rig) -> None:
    await rig.db.execute(f"ALTER DATABASE {rig.database} CONNECTION LIMIT -1")


async def _terminate_waiting(rig: Rig) -> None:
    await rig.db.execute(
        "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid",
        await rig.both_waiting_on_locks(),
    )


async def _crash_another_backend(rig: Rig) -> None:
    """kill -9 the lock holder's backend: the postmaster resets every session and recovers."""
    await rig.both_waiting_on_locks()
    pid = await rig.db.fetchval("SELECT pg_backend_pid()")
    os.kill(pid, signal.SIGKILL)
    rig.db.terminate()
    rig.holding = None
    rig.admin = None


async def _recovered(rig: Rig) -> None:
    await rig.connect_admin()


async def _reset_connections(rig: Rig) -> None:
    await rig.both_waiting_on_locks()
    assert rig.proxy is not None
    assert rig.proxy.reset_all() >= 2


async def _begin_smart_shutdown(rig: Rig) -> None:
    """`pg_ctl stop -m smart`: sessions in progress go on, new ones are refused (57P03)."""
    rig.stopping = asyncio.create_task(asyncio.to_thread(rig.cluster.stop, "smart"))

    async def refusing() -> bool:
        try:
            conn = await asyncpg.connect(rig.app_dsn("probe"))
        except asyncpg.CannotConnectNowError:
            return True
        await conn.close()
        return False

    await wait_until(refusing, WITHIN_S, "the server to refuse new sessions")
    await rig.terminate_sessions()


async def _restart(rig: Rig) -> None:
    """The last session ends, the server stops, the processes find nobody listening; then
    it starts again."""
    await rig.db.close()
    rig.admin = None
    assert rig.stopping is not None
    await rig.stopping
    for service in rig.services:
        await _met(service, {"store_still_unavailable"}, ("ConnectionRefusedError",))
    await asyncio.to_thread(rig.cluster.start)
    await rig.connect_admin()


async def _read_only(rig: Rig) -> None:
    await rig.db.execute(f"ALTER DATABASE {rig.database} SET default_transaction_read_only = on")
    await rig.terminate_sessions()  # new sessions start read-only


async def _writable(rig: Rig) -> None:
    await rig.db.execute(f"ALTER DATABASE {rig.database} RESET default_transaction_read_only")


# One row per transient class: what the test does, and what each process must log meeting it.
FAULTS = [
    Fault(
        "lock_timeout",
        errors=("SQLSTATE 55P03",),
        settings=(("lock_timeout", "100ms"),),  # on the role, as production often has it
        induce=_lock_messages,
        clear=_release,
    ),
    Fault(
        "statement_timeout",
        errors=("SQLSTATE 57014",),
        settings=(("statement_timeout", "300ms"),),
        induce=_lock_messages,
        clear=_release,
    ),
    Fault(
        "deadlock",
        errors=("SQLSTATE 40P01",),
        # Long enough for both processes to be waiting before our lock closes the cycle.
        settings=(("deadlock_timeout", "2s"),),
        induce=_lock_receptions,
        strike=_close_the_cycle,
        clear=_release,
        answered_503=False,  # retried in place at once: the callback waits, then 200
    ),
    Fault(
        "serialization_failure",
        errors=("SQLSTATE 40001",),
        induce=_install_serialization_failure,
        clear=_remove_serialization_failure,
    ),
    Fault(
        "too_many_connections",
        errors=("SQLSTATE 53300",),
        induce=_limit_connections,
        clear=_unlimit_connections,
    ),
    Fault(
        "admin_shutdown",
        # The server's goodbye, or a reset when it races ahead of the client's last bytes.
        errors=("SQLSTATE 57P01", "ConnectionResetError"),
        induce=_lock_messages,
        strike=_terminate_waiting,
        clear=_release,
    ),
    Fault(
        "crash_shutdown",
        # The connection ends mid-statement (the server says 57P02 only in a notice).
        errors=("SQLSTATE 08003", "ConnectionResetError"),
        induce=_lock_messages,
        strike=_crash_another_backend,
        clear=_recovered,
    ),
    Fault(
        "cannot_connect_now_then_restart",
        errors=("SQLSTATE 57P03",),
        induce=_begin_smart_shutdown,
        clear=_restart,
    ),
    Fault(
        "connection_reset",
        errors=("ConnectionResetError", "SQLSTATE 08003"),
        induce=_lock_messages,
        strike=_reset_connections,
        clear=_release,
        through_proxy=True,
    ),
    Fault(
        "read_only",
        errors=("SQLSTATE 25006",),
        induce=_read_only,
        clear=_writable,
    ),
]


@pytest.fixture(params=FAULTS, ids=[fault.name for fault in FAULTS])
def fault(request: pytest.FixtureRequest) -> Fault:
    return request.param  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def open_rig(
    cluster: PgCluster,
    tmp: Path,
    *,
    settings: tuple[tuple[str, str], ...] = (),
    through_proxy: bool = False,
) -> AsyncIterator[Rig]:
    """A fresh database with the role `settings`, fakegw, and whatever the test starts."""
    database = f"transient_{os.getpid()}_{next(_databases)}"
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute(f"CREATE DATABASE {database} TEMPLATE {TEMPLATE} OWNER {APP_ROLE}")
        for name, value in settings:
            await conn.execute(
                f"ALTER ROLE {APP_ROLE} IN DATABASE {database} SET {name} = '{value}'"
            )
    finally:
        await conn.close()
    async with running_gateway(callbacks=PATIENT) as gateway:
        rig = Rig(cluster, database, gateway, tmp)
        if through_proxy:
            rig.proxy = TcpProxy(cluster.port)
            await rig.proxy.start()
        try:
            await rig.connect_admin()
            yield rig
        finally:
            for service in rig.services:
                if service.alive:
                    service.process.kill()
                    await service.process.wait()
            if rig.admin is not None:
                await rig.admin.close()
            if rig.stopping is not None:  # a smart shutdown: ends with the last session
                await rig.stopping
                if not (cluster.datadir / "postmaster.pid").exists():
                    await asyncio.to_thread(cluster.start)  # for the next test
            if rig.proxy is not None:
                await rig.proxy.close()
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await cluster.drop_database(database)


@pytest.fixture
async def rig(cluster: PgCluster, fault: Fault, tmp_path: Path) -> AsyncIterator[Rig]:
    async with open_rig(
        cluster, tmp_path, settings=fault.settings, through_proxy=fault.through_proxy
    ) as rig:
        yield rig


async def _spawn(rig: Rig, name: str, handed_back: str, *args: str) -> Service:
    log = rig.tmp / f"{name}.log"
    env = {**os.environ, "DLRFEED_PASSWORD": PASSWORD}
    env.pop("NOTIFY_SOCKET", None)
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dlrfeed.cli", *args, env=env, stdout=out, stderr=out, cwd=REPO
        )
    return Service(name, process, log, handed_back)


async def _start(rig: Rig) -> int:
    """Both processes, once each is ready; the receiver's port."""
    daemon = await _spawn(
        rig, "run", "batch_retry",
        *run_args(rig.gateway.target, rig.app_dsn(RUN), "--mode", "subscribe"),
        "--database-pooler", "none",
    )  # fmt: skip
    webhook = await _spawn(
        rig, "webhook", "callbacks_not_stored",
        "webhook", "--listen", "127.0.0.1:0", "--login", LOGIN,
        "--database-url", rig.app_dsn(WEBHOOK), "--database-pooler", "none",
        "--retry-after", "1", "--log-format", "json",
    )  # fmt: skip
    rig.services[:] = [daemon, webhook]
    port: list[int] = []

    async def ready() -> bool:
        for service in rig.services:
            assert service.alive, f"{service.name} exited at start:\n{service.tail()}"
        if not any(e["event"] == "daemon_ready" for e in daemon.events()):
            return False
        port[:] = [int(e["port"]) for e in webhook.events() if e["event"] == "webhook_ready"]
        return bool(port)

    await wait_until(ready, WITHIN_S, "both processes to be ready")
    return port[0]


async def _met(service: Service, events: set[str], errors: tuple[str, ...]) -> None:
    """Wait until `service` has logged one of `events` for one of `errors`, alive all along."""

    async def met() -> bool:
        assert service.alive, f"{service.name} exited:\n{service.tail()}"
        return service.met(events, errors)

    await wait_until(met, WITHIN_S, f"{service.name} to log {events} for {errors}")


async def _record_submissions(rig: Rig) -> None:
    """The sending side recorded every message first, so each receipt is applied (P10)."""
    store = await Store.open(rig.app_dsn("sender"), pool_size=1)
    try:
        feed = {body["id"] for body in receipt_bodies(FEED_RECEIPTS, prefix="f")}
        ids = sorted(feed) + [f"w{n}" for n in range(CALLBACKS)]
        await store.record_submissions([Submission(LOGIN, i, "+34600000000") for i in ids])
    finally:
        await store.close()


async def test_a_transient_error_leaves_both_processes_up_and_loses_nothing(
    rig: Rig, fault: Fault
) -> None:
    await _record_submissions(rig)
    webhook_port = await _start(rig)
    await fault.induce(rig)
    await rig.traffic(webhook_port)
    if fault.strike is not None:
        await fault.strike(rig)
    for service in rig.services:
        # Retried in place (deadlocks), or handed back to be retried later (503s): in the
        # latter case the fault lasts until each process has failed a commit for it.
        event = service.handed_back if fault.answered_503 else "transaction_retry"
        await _met(service, {event}, fault.errors)
    await fault.clear(rig)

    async def all_done() -> bool:
        for service in rig.services:
            assert service.alive, f"{service.name} exited:\n{service.tail()}"
        stats = rig.gateway.stats(LOGIN)
        return await drained(rig.gateway) and stats["callbacks_pending"] == 0

    await wait_until(all_done, WITHIN_S, "every receipt to be acked and every callback answered")
    stats = rig.gateway.stats(LOGIN)
    assert stats["acked"] == FEED_RECEIPTS
    assert stats["callbacks_delivered"] == CALLBACKS
    assert (stats["callbacks_failed"], stats["callbacks_refused"]) == (0, 0)
    if fault.answered_503:
        assert stats["callbacks_retried"] > 0, "no callback was answered 503 during the fault"
    await _assert_stored_once(rig.db)
    for service in rig.services:
        service.process.send_signal(signal.SIGTERM)
    for service in rig.services:
        code = await asyncio.wait_for(service.process.wait(), WITHIN_S)
        assert code == 0, f"{service.name} exited {code}:\n{service.tail()}"


async def _assert_stored_once(db: asyncpg.Connection) -> None:
    """Every receipt has one reception and one event, applied once (no repeat, no conflict),
    and every message its final status."""
    receptions = await db.fetch(
        "SELECT message_id, level, channel, outcome FROM dlr.receptions ORDER BY 1, 2"
    )
    keys = [(r["message_id"], r["level"]) for r in receptions]
    assert len(keys) == len(set(keys)) == FEED_RECEIPTS + CALLBACKS, keys
    assert {r["channel"] for r in receptions if r["message_id"].startswith("w")} == {"webhook"}
    assert {r["outcome"] for r in receptions} <= {"applied", "late_progress"}
    counts = await db.fetch("SELECT times_received FROM dlr.events")
    assert [r["times_received"] for r in counts] == [1] * (FEED_RECEIPTS + CALLBACKS)
    statuses = await db.fetch("SELECT status, is_final FROM dlr.message_status")
    assert len(statuses) == FEED_RECEIPTS // 2 + CALLBACKS
    assert {(r["status"], r["is_final"]) for r in statuses} == {("DELIVERED", True)}
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0


async def test_a_fatal_error_still_ends_both_processes_in_one_line(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """Retrying cannot help a role that may not write (42501): both processes stop with one
    line naming it, exit 78 (systemd does not restart them), having acked nothing and answered
    no callback 2xx; nothing is stored."""
    async with open_rig(cluster, tmp_path) as rig:
        await _record_submissions(rig)
        webhook_port = await _start(rig)
        await rig.db.execute(f"REVOKE INSERT ON dlr.reception_rows FROM {APP_ROLE}")
        await rig.traffic(webhook_port)
        for service in rig.services:
            code = await asyncio.wait_for(service.process.wait(), WITHIN_S)
            text = service.log.read_text(errors="replace")
            assert code == 78, text[-3000:]
            reason = [line for line in text.splitlines() if line.startswith("dlrfeed: ")]
            assert len(reason) == 1, text[-3000:]
            assert reason[0].startswith(
                "dlrfeed: the database role may not write the batch (SQLSTATE 42501"
            )
            assert "Traceback" not in text
        stats = rig.gateway.stats(LOGIN)
        assert (stats["acked"], stats["callbacks_delivered"]) == (0, 0)
        assert await rig.db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
