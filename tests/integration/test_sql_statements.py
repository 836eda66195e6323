"""Every SQL statement of dlrfeed against a real migrated database, and the store's dealings
with what sits between it and PostgreSQL (a transaction pooler, an unknown pooler)."""

from __future__ import annotations

import asyncio
import shutil
import struct
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.config import Pooler
from dlrfeed.errors import ConfigError, FatalError
from dlrfeed.store import retention
from dlrfeed.store.replay import WAITING_RECEPTIONS
from dlrfeed.store.retention import RetentionPolicy, maintain
from dlrfeed.store.server import behind_transaction_pooler
from dlrfeed.store.sql import STATEMENTS
from dlrfeed.store.transactions import write_transaction
from dlrfeed_tools.pgbouncer import PgBouncer
from dlrfeed_tools.pgcluster import PgCluster, free_port, scratch_directory
from dlrfeed_tools.retention_support import plan_of

# A day partition that exists in every migrated database, for the statements that name one: of
# the change log, the only table whose partitions unread_by reads; of the evidence for the
# statement that reads a day of it for its archive.
_EXISTING_PARTITION = "status_changes_default"
_EXISTING_PARTITION_OF = {
    "archived_receptions": "receptions_default",
    "reception_rows": "reception_rows",
}


async def test_every_statement_prepares_against_the_migrated_schema(database_url: str) -> None:
    """A typo in any statement (a column, a table, a type, a parameter the server cannot
    type) fails here, not in production: each is parsed and typed by the server (PREPARE,
    nothing executed), in a transaction rolled back after."""
    conn = await asyncpg.connect(database_url)
    failures: dict[str, str] = {}
    try:
        for name, query in sorted(STATEMENTS.items()):
            if query.identifiers:
                partition = _EXISTING_PARTITION_OF.get(name, _EXISTING_PARTITION)
                query = query.naming(**dict.fromkeys(query.identifiers, partition))
            transaction = conn.transaction()
            await transaction.start()
            try:
                statement = await conn.prepare(query.text)
                if len(statement.get_parameters()) != len(query.parameters):
                    failures[name] = f"server sees {len(statement.get_parameters())} parameters"
            except asyncpg.PostgresError as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"
            finally:
                await transaction.rollback()
    finally:
        await conn.close()
    assert not failures, failures


@pytest.fixture(scope="module")
def bouncer(pg_cluster: PgCluster) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode with one server connection per database and user, so
    every client transaction runs on that one server session."""
    pooler = PgBouncer(
        scratch_directory("pgbouncer-sql"), free_port(), pg_cluster.port, pool_size=1
    )
    pooler.start()
    try:
        yield pooler
    finally:
        pooler.stop()
        shutil.rmtree(pooler.root, ignore_errors=True)


async def test_maintain_through_a_transaction_pooler_leaves_no_lock_timeout_behind(
    bouncer: PgBouncer, database_url: str
) -> None:
    """`maintain`'s lock timeout is local to the transactions it guards: the server session
    that PgBouncer hands to the next client has the server's own lock_timeout (0), not ours."""
    pooled = bouncer.dsn_for(database_url.rsplit("/", 1)[1])
    later = datetime.now(UTC) + timedelta(days=30)  # days with no partition yet: DDL runs
    report = await maintain(pooled, RetentionPolicy(days_ahead=2), now=later)
    assert report.created  # the guarded transactions really ran
    other_client = await asyncpg.connect(pooled, statement_cache_size=0)
    try:
        assert await other_client.fetchval("SHOW lock_timeout") == "0"
    finally:
        await other_client.close()


async def _uses_jit(conn: asyncpg.Connection) -> bool:
    """Whether the server compiled a plain statement with JIT (EXPLAIN ANALYZE says so)."""
    plan = await conn.fetch("EXPLAIN ANALYZE SELECT sum(x) FROM generate_series(1, 10) x")
    return any(line[0].startswith("JIT:") for line in plan)


async def test_the_write_transactions_plan_without_jit_and_leave_the_session_as_it_was(
    database_url: str,
) -> None:
    """Every statement a threshold of zero would compile is compiled outside, not inside."""
    conn = await asyncpg.connect(database_url)
    try:
        if not await conn.fetchval("SELECT pg_jit_available()"):
            pytest.skip("this PostgreSQL has no JIT provider (llvmjit) installed")
        await conn.execute("SET jit = on; SET jit_above_cost = 0")
        assert await _uses_jit(conn)
        async with write_transaction(conn):
            assert await conn.fetchval("SHOW jit") == "off"
            assert not await _uses_jit(conn)
            async with write_transaction(conn):  # a savepoint inside one, as the C8 bisect
                assert not await _uses_jit(conn)
        assert await conn.fetchval("SHOW jit") == "on"
        assert await _uses_jit(conn)
    finally:
        await conn.close()


async def test_the_write_transactions_probe_a_table_of_few_rows_by_its_key(
    database_url: str, db: asyncpg.Connection
) -> None:
    """A table whose live rows stay few (dlr.event_rows, the waiting room of events) looks
    cheaper to scan than to probe; inside a write transaction its key is probed all the same,
    and the session's own setting comes back after."""
    probe = "EXPLAIN SELECT id FROM dlr.event_rows WHERE login = 'a' AND message_id = 'b'"
    await db.execute("ANALYZE dlr.event_rows")
    conn = await asyncpg.connect(database_url)
    try:
        outside = "\n".join(r[0] for r in await conn.fetch(probe))
        async with write_transaction(conn):
            inside = "\n".join(r[0] for r in await conn.fetch(probe))
        after = "\n".join(r[0] for r in await conn.fetch(probe))
    finally:
        await conn.close()
    assert "Seq Scan" in outside
    assert "Seq Scan" not in inside
    assert "events_login_message_id_level_key" in inside
    assert after == outside


async def test_late_correlation_probes_each_events_receptions_whatever_the_estimates(
    database_url: str,
) -> None:
    """The receptions of the waiting events are read by their day's key, one probe per event:
    with estimates that favour a hash (here enable_nestloop off, in production a day partition
    growing faster than autovacuum analyzes it), no day of receptions is read whole."""
    waiting = WAITING_RECEPTIONS
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SET enable_nestloop = off")
        async with write_transaction(conn):
            plan = await plan_of(
                conn, waiting.text, *waiting.bind(login="acme", correlation_ids=["m-1", "m-2"])
            )
    finally:
        await conn.close()
    scans = [line for line in plan.splitlines() if " on receptions_" in line]
    assert scans, plan
    assert "Hash" not in plan, plan
    conditions = plan.count("Index Cond: (event_id = ")
    assert conditions == len(scans), plan


async def test_through_a_transaction_pooler_no_jit_setting_is_left_behind(
    bouncer: PgBouncer, database_url: str
) -> None:
    """The server session PgBouncer hands to the next client has the server's own jit."""
    pooled = bouncer.dsn_for(database_url.rsplit("/", 1)[1])
    writer = await asyncpg.connect(pooled, statement_cache_size=0)
    other_client = await asyncpg.connect(pooled, statement_cache_size=0)
    try:
        server_default = await other_client.fetchval("SHOW jit")
        async with write_transaction(writer):
            assert await writer.fetchval("SHOW jit") == "off"
        assert await other_client.fetchval("SHOW jit") == server_default
    finally:
        await writer.close()
        await other_client.close()


async def test_maintain_waits_for_a_held_table_only_as_long_as_its_lock_timeout(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another transaction holds dlr.reception_rows, creating a day partition gives up
    after the lock timeout (one attempt here) in one line, instead of queueing forever."""
    monkeypatch.setattr(retention, "_LOCK_ATTEMPTS", 1)
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE dlr.reception_rows IN ACCESS SHARE MODE")
            later = datetime.now(UTC) + timedelta(days=60)
            with pytest.raises(FatalError, match=r"dlr\.reception_rows stayed locked"):
                async with asyncio.timeout(60):  # a generous bound; the timeout is 2 s
                    await maintain(database_url, RetentionPolicy(days_ahead=2), now=later)
    finally:
        await holder.close()


@pytest.fixture
async def unknown_pooler() -> AsyncIterator[str]:
    """A server on loopback that accepts any login but announces a server_version that is
    neither PostgreSQL's nor PgBouncer's, as an unfamiliar pooler might; the URL to reach it."""

    def message(kind: bytes, body: bytes) -> bytes:
        return kind + struct.pack("!I", len(body) + 4) + body

    answer = (
        message(b"R", struct.pack("!I", 0))  # AuthenticationOk
        + message(b"S", b"server_version\x00odd-pooler\x00")
        + message(b"Z", b"I")  # ReadyForQuery
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)  # the startup packet
        writer.write(answer)
        await writer.drain()
        await reader.read(4096)  # until the client goes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"postgresql://dlrfeed@127.0.0.1:{port}/dlr?sslmode=disable"
    finally:
        server.close()


async def test_an_unrecognised_pooler_answer_is_one_config_error(unknown_pooler: str) -> None:
    with pytest.raises(ConfigError, match="neither PgBouncer nor PostgreSQL") as raised:
        await behind_transaction_pooler(unknown_pooler, Pooler.AUTO)
    assert "\n" not in str(raised.value)
    assert "--database-pooler" in str(raised.value)


async def test_a_command_facing_an_unrecognised_pooler_exits_78_in_one_line(
    unknown_pooler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command runs its own event loop, in a thread, while this one serves the fake server.
    code = await asyncio.to_thread(main, ["stats", "--database-url", unknown_pooler])
    assert code == 78
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "neither PgBouncer nor PostgreSQL" in err
