"""dlrfeed through a real PgBouncer in transaction pooling mode (scripts/pgbouncer.py).

PgBouncer's server pool is kept smaller than dlrfeed's client connections, so consecutive
transactions of one client really run on different server connections: what a session would
carry (named prepared statements, session advisory locks, SET) does not follow them.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import asyncpg.exceptions
import pytest

from dlrfeed.cli import main
from dlrfeed.config import Pooler
from dlrfeed.daemon.app import Daemon
from dlrfeed.relay import Relay, RelaySettings
from dlrfeed.store import Store, Submission
from dlrfeed.store.changes import load_cursor
from dlrfeed.store.migrate import available_migrations, current_version, expected_version
from dlrfeed.store.server import behind_transaction_pooler
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    assert_ledger_matches_store,
    receipt_bodies,
    run_until_drained,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.pgbouncer import PgBouncer
from dlrfeed_tools.pgcluster import PgCluster, free_port, scratch_directory, server_bindir
from dlrfeed_tools.retention_support import receipt
from dlrfeed_tools.webhook_receiver import Receiver, read_log

WRITER = "dlrfeed_bouncer_writer"  # a role that is no PgBouncer admin


@pytest.fixture(scope="module")
def bouncer(pg_cluster: PgCluster) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode with two server connections per database and user."""

    async def create_writer() -> None:
        conn = await asyncpg.connect(pg_cluster.dsn)
        try:
            await conn.execute(f"DROP ROLE IF EXISTS {WRITER}; CREATE ROLE {WRITER} LOGIN")
        finally:
            await conn.close()

    asyncio.run(create_writer())
    pooler = PgBouncer(
        scratch_directory("pgbouncer"),
        free_port(),
        pg_cluster.port,
        pool_size=2,
        users=("postgres", WRITER),
    )
    pooler.start()
    try:
        yield pooler
    finally:
        pooler.stop()
        shutil.rmtree(pooler.root, ignore_errors=True)


def through(bouncer: PgBouncer, database_url: str) -> str:
    """The same database, reached through the pooler."""
    return bouncer.dsn_for(database_url.rsplit("/", 1)[1])


def transactions_served(bouncer: PgBouncer, database: str) -> int:
    """PgBouncer's own count of the transactions it pooled for `database` (its admin console,
    which speaks only the simple query protocol: psql, not asyncpg)."""
    out = subprocess.run(
        [str(server_bindir() / "psql"), "--csv", "-c", "SHOW STATS", bouncer.dsn_for("pgbouncer")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(
        int(row["total_xact_count"])
        for row in csv.DictReader(io.StringIO(out))
        if row["database"] == database
    )


async def test_the_rig_breaks_named_prepared_statements(
    bouncer: PgBouncer, database_url: str
) -> None:
    """The failure a transaction pooler causes, reproduced: a statement cached on one server
    connection is executed on another ("prepared statement ... does not exist")."""
    dsn = through(bouncer, database_url)
    cached = await asyncpg.connect(dsn)  # asyncpg's default: named, cached statements
    holder = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        await cached.fetchval("SELECT count(*) FROM dlr.events")
        async with holder.transaction():  # pins the server connection that knows the statement
            await holder.fetchval("SELECT 1")
            with pytest.raises(asyncpg.exceptions.InvalidSQLStatementNameError):
                await cached.fetchval("SELECT count(*) FROM dlr.events")
    finally:
        await cached.close()
        await holder.close()


async def test_auto_recognises_pgbouncer_and_not_postgresql(
    bouncer: PgBouncer, database_url: str
) -> None:
    """`--database-pooler auto`: PgBouncer is recognised whether or not the role may use its
    admin console; PostgreSQL itself is not taken for a pooler; explicit choices are obeyed."""
    assert await behind_transaction_pooler(through(bouncer, database_url), Pooler.AUTO)
    writer = bouncer.dsn_for(database_url.rsplit("/", 1)[1], user=WRITER)
    assert await behind_transaction_pooler(writer, Pooler.AUTO)
    assert not await behind_transaction_pooler(database_url, Pooler.AUTO)
    assert await behind_transaction_pooler(database_url, Pooler.TRANSACTION)
    assert not await behind_transaction_pooler(through(bouncer, database_url), Pooler.NONE)


async def test_daemon_drains_through_pgbouncer(bouncer: PgBouncer, database_url: str) -> None:
    """`dlrfeed run` through transaction pooling with the default `auto`: four readers share
    two server connections, the sender records half the messages through the pooler while the
    daemon runs (late correlation takes transaction-scoped advisory locks), and everything
    enqueued is stored once, every ack after its commit."""
    dsn = through(bouncer, database_url)
    database = database_url.rsplit("/", 1)[1]
    before = transactions_served(bouncer, database)
    bodies = receipt_bodies(4000)
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, bodies)
        daemon = Daemon(settings_for(gateway.target, dsn, "--streams", "4", "--batch-size", "200"))
        store = await Store.open(dsn, pool_size=3)
        try:
            assert store.through_pooler
            message_ids = sorted({body["id"] for body in bodies})
            drain = asyncio.create_task(run_until_drained(daemon, gateway, within_s=90))
            for start in range(0, len(message_ids) // 2, 100):
                await store.record_submissions(
                    [Submission(LOGIN, m, "+34600000000") for m in message_ids[start : start + 100]]
                )
            assert await drain == 0
        finally:
            await store.close()
        await assert_ledger_matches_store(gateway, database_url)
    assert transactions_served(bouncer, database) - before > 4000 // 200
    conn = await asyncpg.connect(database_url)
    try:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM dlr.exceptions"
            " WHERE kind = 'uncorrelated' AND resolved_at IS NULL"
        )
        recorded_with_status = await conn.fetchval(
            "SELECT count(*) FROM dlr.messages JOIN dlr.message_status USING (login, message_id)"
        )
    finally:
        await conn.close()
    # Each recorded message got its status whether its receipts came before or after it.
    assert recorded_with_status == len(message_ids) // 2 // 100 * 100
    assert waiting == 2 * (len(message_ids) - recorded_with_status)


def test_operator_commands_through_pgbouncer(
    bouncer: PgBouncer, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """record-submissions, show, stats and exceptions work through the pooler (auto)."""
    dsn = through(bouncer, database_url)
    sent = tmp_path / "sent.jsonl"
    sent.write_text(
        "".join(
            json.dumps({"message_id": f"p{n}", "destination": "+34600000000", "login": LOGIN})
            + "\n"
            for n in range(50)
        )
    )
    assert main(["record-submissions", str(sent), "--database-url", dsn]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["recorded"] == 50
    for _ in range(3):  # again and again: each run lands on whichever server connection is free
        assert main(["show", "p7", "--database-url", dsn, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["reports"][0]["login"] == LOGIN
        assert main(["stats", "--database-url", dsn, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["submitted"]["recorded"] == 50
        assert main(["exceptions", "--database-url", dsn, "--json"]) == 0
        capsys.readouterr()


async def test_migrate_through_pgbouncer_needs_no_session(
    bouncer: PgBouncer, pg_cluster: PgCluster
) -> None:
    """`dlrfeed migrate` through transaction pooling: three at once on an empty database all
    succeed, and the schema ends at the expected version, each migration applied once."""
    name = "migrate_through_pooler"
    await pg_cluster.drop_database(name)
    await pg_cluster.create_database(name)
    dsn = bouncer.dsn_for(name)
    try:
        codes = await asyncio.gather(
            *(asyncio.to_thread(main, ["migrate", "--database-url", dsn]) for _ in range(3))
        )
        assert codes == [0, 0, 0]
        conn = await asyncpg.connect(pg_cluster.dsn_for(name))
        try:
            assert await current_version(conn) == expected_version()
            rows = await conn.fetchval("SELECT count(*) FROM dlr.schema_version")
        finally:
            await conn.close()
        assert rows == len(available_migrations())  # each once (numbers may skip)
    finally:
        await pg_cluster.drop_database(name)


async def test_changes_and_the_relay_through_pgbouncer(
    bouncer: PgBouncer,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`dlrfeed changes` (auto and --database-pooler transaction, with a durable cursor) and
    the relay read the change log through the pooler: every change once, in order, and the
    relay's cursor moves past what the endpoint acknowledged."""
    store = await Store.open(database_url, pool_size=1)
    try:
        ids = [f"c{n}" for n in range(30)]
        await store.record_submissions([Submission(LOGIN, m, "+34600000000") for m in ids])
        await store.ingest(LOGIN, [receipt(m, time.time()) for m in ids])
    finally:
        await store.close()
    dsn = through(bouncer, database_url)

    assert await asyncio.to_thread(main, ["changes", "--database-url", dsn, "--json"]) == 0
    every = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(c["message_id"] for c in every) == sorted(ids)
    pooled = ["changes", "--database-url", dsn, "--database-pooler", "transaction", "--json"]
    for limit in ("20", "20"):  # the durable cursor resumes where the first run stopped
        args = [*pooled, "--consumer", "billing", "--limit", limit]
        assert await asyncio.to_thread(main, args) == 0
    resumed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert resumed == every

    secret = b"through-the-pooler"
    receiver = Receiver(free_port(), secret, tmp_path / "received.jsonl", [], 1.0)
    serving = threading.Thread(target=receiver.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        relay = Relay(RelaySettings(database_url=dsn, url=url, secret=secret, batch_size=7))
        stop = asyncio.Event()
        running = asyncio.create_task(relay.run(stop), name="relay-through-pgbouncer")

        async def all_delivered() -> bool:
            return bool(relay.metrics.delivered._value.get() == len(ids))

        await wait_until(all_delivered, 60, "the relay to deliver through the pooler")
        stop.set()
        await asyncio.wait_for(running, 30)
    finally:
        receiver.shutdown()
        receiver.server_close()
    received = read_log(tmp_path / "received.jsonl")
    assert all(entry["signature_valid"] for entry in received)
    assert [c["position"] for e in received for c in e["changes"]] == [c["position"] for c in every]
    conn = await asyncpg.connect(database_url)
    try:
        assert await load_cursor(conn, "relay") == every[-1]["position"]
    finally:
        await conn.close()
