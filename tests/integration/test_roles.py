"""Least privilege: the roles of sql/roles.sql and the schema's grants, each proven by a login.

The documented procedure, end to end on a fresh database: a DBA runs sql/roles.sql, the schema
is migrated by a login of `dlrfeed_owner`, then logins of `dlrfeed_writer` (the daemon),
`dlrfeed_reader` (reports) and `dlrfeed_operator` (resolving exceptions) do their real work and
are refused everything else. The test cluster uses trust authentication, so logins need no
password here. P13: the reception log is evidence that its own writer cannot rewrite.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.domain.receipt import Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import ConfigError
from dlrfeed.feed.client import receipt_from_proto
from dlrfeed.store import Store, Submission, Verification, evidence
from dlrfeed.store.changes import load_cursor, read_changes, save_cursor
from dlrfeed.store.migrate import migrate
from dlrfeed.store.quality import Window, quality, raw_quality
from dlrfeed.store.reports import list_exceptions, message_reports, resolve_exception, statistics
from dlrfeed_tools.pgcluster import PgCluster
from gateway.receipts.v1 import feed_pb2

ROLES_SQL = Path(__file__).resolve().parents[2] / "sql" / "roles.sql"
TABLES = (
    "messages",
    "event_rows",  # the events' tables, behind the view dlr.events
    "message_events",
    "reception_rows",  # the receptions' table, behind the view dlr.receptions
    "statuses",  # the statuses' table, behind the view dlr.message_status
    "exceptions",
    "verifications",
    "schema_version",
)
LOGINS = {
    "t_owner": "dlrfeed_owner",
    "t_writer": "dlrfeed_writer",
    "t_reader": "dlrfeed_reader",
    "t_operator": "dlrfeed_operator",
}
_numbers = itertools.count(1)


@dataclass(frozen=True)
class RoleDatabase:
    """A database set up by the documented procedure, with one login DSN per role."""

    name: str
    superuser: str
    owner: str
    writer: str
    reader: str
    operator: str


def _dsn(cluster: PgCluster, user: str, database: str) -> str:
    return f"postgresql://{user}@127.0.0.1:{cluster.port}/{database}"


@pytest.fixture
async def roles_db(pg_cluster: PgCluster) -> AsyncIterator[RoleDatabase]:
    """An empty database: roles.sql run by the superuser, then migrated by the owner's login."""
    name = f"roles_{os.getpid()}_{next(_numbers)}"
    superuser = await pg_cluster.create_database(name)
    conn = await asyncpg.connect(superuser)
    try:
        await conn.execute(ROLES_SQL.read_text("utf-8"))
        for login, group in LOGINS.items():
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login)
            if not exists:
                await conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE {group}")
        # docs/security.md: the migrating login acts as the group, so the group owns the schema.
        await conn.execute("ALTER ROLE t_owner SET role = 'dlrfeed_owner'")
    finally:
        await conn.close()
    owner = _dsn(pg_cluster, "t_owner", name)
    await migrate(owner)
    yield RoleDatabase(
        name=name,
        superuser=superuser,
        owner=owner,
        writer=_dsn(pg_cluster, "t_writer", name),
        reader=_dsn(pg_cluster, "t_reader", name),
        operator=_dsn(pg_cluster, "t_operator", name),
    )
    await pg_cluster.drop_database(name)


def _receipt(message_id: str, level: int, stat: str, count: int = 1) -> feed_pb2.Receipt:
    return feed_pb2.Receipt(
        id=message_id,
        level=level,
        stat=stat,
        err="000",
        done_date="2611291200",
        ack_token=f"tok-{message_id}-{level}-{count}",
        delivery_count=count,
    )


def _domain(wire: feed_pb2.Receipt) -> Receipt:
    raw = wire.SerializeToString()
    return receipt_from_proto(feed_pb2.Receipt.FromString(raw), raw, time.time())


async def _refused(dsn: str, statement: str) -> str:
    """Run `statement` as the login of `dsn`; return the privilege error it must raise."""
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError) as caught:
            await conn.execute(statement)
    finally:
        await conn.close()
    return str(caught.value)


async def _seed(db: RoleDatabase) -> Store:
    """Real daemon work as the writer: submissions, a batch with every kind of outcome."""
    store = await Store.open(db.writer, pool_size=2)
    await store.check_schema()
    await store.record_submissions(
        [Submission(login="acme", message_id=m, destination="+34600000001") for m in ("m1", "m2")]
    )
    batch = [
        _domain(_receipt("m1", 1, "ENROUTE")),
        _domain(_receipt("m1", 2, "DELIVRD")),
        _domain(_receipt("m1", 2, "DELIVRD", 2)),  # C1 repeat
        _domain(_receipt("m2", 2, "UNDELIV")),
        _domain(_receipt("m2", 2, "DELIVRD")),  # P14 conflict
        _domain(_receipt("late", 2, "DELIVRD")),  # P12 uncorrelated, correlated below
        _domain(_receipt("m1", 2, "WEIRD")),  # same key, unrecognized: kept, no conflict (P14)
    ]
    result = await store.ingest("acme", batch)
    assert result.outcomes[:4] == [
        Outcome.APPLIED,
        Outcome.APPLIED,
        Outcome.REPEAT,
        Outcome.APPLIED,
    ]
    assert Outcome.UNCORRELATED in result.outcomes
    late = await store.record_submissions(
        [Submission(login="acme", message_id="late", destination="+34600000002")]
    )
    assert late.late_correlated_events == 1
    return store


async def test_p13_migrated_by_the_owner_login_every_object_belongs_to_the_owner_group(
    roles_db: RoleDatabase,
) -> None:
    """The migrating login acts as dlrfeed_owner: the schema and every table are the group's."""
    conn = await asyncpg.connect(roles_db.superuser)
    try:
        owners = await conn.fetch(
            "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
            "WHERE c.relnamespace = 'dlr'::regnamespace AND c.relkind IN ('r', 'p', 'S')"
        )
        schema_owner = await conn.fetchval(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'dlr'"
        )
    finally:
        await conn.close()
    assert schema_owner == "dlrfeed_owner"
    assert {r["owner"] for r in owners} == {"dlrfeed_owner"}
    assert set(TABLES) <= {r["relname"] for r in owners}


async def test_p13_writer_runs_real_ingest_and_record_submissions(roles_db: RoleDatabase) -> None:
    """Store.ingest (every outcome, C8 unstorable) and late correlation work as the writer."""
    await (await _seed(roles_db)).close()
    writer = await asyncpg.connect(roles_db.writer)
    try:  # C8: the unstorable path's own statements, as the writer (a receipt, then again)
        poison = ("acme", "poison", "{}", b"\x00\xff", "key-of-poison")
        assert await writer.fetchval(evidence.OPEN_UNSTORABLE.text, *poison) is not None
        assert await writer.fetchval(evidence.OPEN_UNSTORABLE.text, *poison) is None
        await writer.execute(evidence.RECORD_UNSTORABLE_REDELIVERY.text, *poison)
        # The statuses it wrote read back through the view, reasons as text.
        reasons = await writer.fetch("SELECT reason FROM dlr.message_status")
        assert reasons
        assert all(r["reason"] for r in reasons)
    finally:
        await writer.close()
    conn = await asyncpg.connect(roles_db.superuser)
    try:
        receptions = await conn.fetchval("SELECT count(*) FROM dlr.receptions")
        kinds = sorted(r[0] for r in await conn.fetch("SELECT kind FROM dlr.exceptions"))
        resolved = await conn.fetchval(
            "SELECT count(*) FROM dlr.exceptions WHERE resolved_at IS NOT NULL"
        )
    finally:
        await conn.close()
    assert receptions == 7
    assert kinds.count("conflict") == 1
    assert kinds.count("unrecognized") == 1
    assert kinds.count("unstorable") == 2
    assert "uncorrelated" in kinds
    # The late correlation closed the uncorrelated exception; the redelivery came closed.
    assert resolved == 2


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE dlr.reception_rows SET stat = 'DELIVRD'",
        "DELETE FROM dlr.reception_rows",
        "TRUNCATE dlr.reception_rows",
        "SELECT payload FROM dlr.receptions",
        "UPDATE dlr.messages SET destination = '+1'",
        "DELETE FROM dlr.messages",
        "UPDATE dlr.event_rows SET stat = 'DELIVRD'",
        "UPDATE dlr.message_events SET stat = 'DELIVRD'",
        "DELETE FROM dlr.event_rows",
        "DELETE FROM dlr.message_events",
        "DELETE FROM dlr.statuses",
        "UPDATE dlr.exceptions SET kind = 'conflict'",
        "DELETE FROM dlr.exceptions",
        "TRUNCATE dlr.event_rows, dlr.exceptions, dlr.statuses, dlr.messages",
        "TRUNCATE dlr.message_events",
        "INSERT INTO dlr.schema_version (version, name) VALUES (99, 'x')",
        "ALTER TABLE dlr.reception_rows DISABLE TRIGGER receptions_append_only",
        "DROP TABLE dlr.reception_rows",
        "CREATE TABLE dlr.shadow (x int)",
        "CREATE TABLE public.shadow (x int)",
        "CREATE FUNCTION dlr.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER TABLE dlr.reception_rows OWNER TO t_writer",
        # Day partitions: only the owner creates, reads directly or drops them.
        "DROP TABLE dlr_partitions.receptions_default",
        "SELECT count(*) FROM dlr_partitions.receptions_default",
        "ALTER TABLE dlr.reception_rows DETACH PARTITION dlr_partitions.receptions_default",
        "SELECT dlr.create_reception_partitions(now() + interval '30 days')",
    ],
)
async def test_p13_writer_cannot_rewrite_evidence_or_change_the_schema(
    roles_db: RoleDatabase, statement: str
) -> None:
    """P13: refused by the grants themselves ("permission denied"/"must be owner"), not merely
    by the append-only trigger, which stays as the second line of defence."""
    message = await _refused(roles_db.writer, statement)
    assert "permission denied" in message or "must be owner" in message


async def test_only_the_owner_can_say_it_forgets(roles_db: RoleDatabase) -> None:
    """Migration 0014: a transaction that says it forgets deletes statuses without a withdrawn
    change; only the schema owner's login may say so (the others' setting is ignored)."""
    for dsn, forgets in (
        (roles_db.owner, True),
        (roles_db.writer, False),
        (roles_db.reader, False),
        (roles_db.operator, False),
    ):
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute("SELECT set_config('dlrfeed.forgetting', 'on', true)")
                assert await conn.fetchval("SELECT dlr.forgetting()") is forgets, dsn
            assert await conn.fetchval("SELECT dlr.forgetting()") is False, dsn
        finally:
            await conn.close()


async def test_ingest_as_a_role_without_the_privilege_is_one_config_line(
    roles_db: RoleDatabase,
) -> None:
    """A daemon pointed at the reader role stops with exit 78 and one line, not a traceback."""
    store = await Store.open(roles_db.reader, pool_size=1)
    try:
        with pytest.raises(ConfigError, match="writer role") as info:
            await store.ingest("acme", [_domain(_receipt("m1", 2, "DELIVRD"))])
    finally:
        await store.close()
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 78


async def test_reader_runs_the_operator_reports(roles_db: RoleDatabase) -> None:
    """`show`, `exceptions` and `stats` read everything they need as dlrfeed_reader."""
    await (await _seed(roles_db)).close()
    conn = await asyncpg.connect(roles_db.reader)
    try:
        reports = await message_reports(conn, "m1", None)
        exceptions = await list_exceptions(
            conn,
            kind=None,
            login=None,
            include_resolved=True,
            opened_before=None,
            opened_after=None,
            limit=100,
        )
        stats = await statistics(conn, None)
    finally:
        await conn.close()
    assert reports
    assert reports[0]["status"]["status"] == "DELIVERED"
    assert len(reports[0]["receptions"]) == 4
    assert {x["kind"] for x in exceptions} == {"conflict", "uncorrelated", "unrecognized"}
    assert json.dumps(stats, default=str)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE dlr.receptions SET stat = 'DELIVRD'",
        "DELETE FROM dlr.receptions",
        "UPDATE dlr.message_status SET status = 'DELIVERED'",
        "DELETE FROM dlr.message_status",
        "UPDATE dlr.events SET times_received = 1",
        "DELETE FROM dlr.status_changes",
        "DELETE FROM dlr.receptions_readable",
    ],
)
async def test_the_public_views_are_read_only_even_to_the_owner(
    roles_db: RoleDatabase, statement: str
) -> None:
    """The public names that are views are plain reads: no role writes through them (the owner
    changes a status in dlr.statuses; a reception is never rewritten, P13)."""
    for dsn in (roles_db.owner, roles_db.writer, roles_db.operator):
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(
                (
                    asyncpg.exceptions.ObjectNotInPrerequisiteStateError,  # not updatable
                    asyncpg.exceptions.InsufficientPrivilegeError,
                )
            ):
                await conn.execute(statement)
        finally:
            await conn.close()


@pytest.mark.parametrize(
    "statement",
    [
        *(f"DELETE FROM dlr.{table}" for table in TABLES),
        *(f"TRUNCATE dlr.{table}" for table in TABLES),
        "INSERT INTO dlr.messages (login, message_id, internal_id, destination, "
        "destination_raw, destination_is_e164) VALUES ('a', 'b', 'c', 'd', 'd', false)",
        "UPDATE dlr.statuses SET status = 'DELIVERED'",
        "UPDATE dlr.reception_rows SET stat = 'x'",
        "UPDATE dlr.exceptions SET resolved_at = now(), resolution = 'x'",
        "UPDATE dlr.event_rows SET times_received = 1",
        "UPDATE dlr.message_events SET times_received = 1",
        "SELECT nextval('dlr.receptions_id_seq')",
        "CREATE TABLE dlr.shadow (x int)",
    ],
)
async def test_reader_writes_nothing(roles_db: RoleDatabase, statement: str) -> None:
    """dlrfeed_reader: SELECT only; every write, even resolving an exception, is refused."""
    assert "permission denied" in await _refused(roles_db.reader, statement)


async def test_operator_resolves_an_exception_and_nothing_more(roles_db: RoleDatabase) -> None:
    """dlrfeed_operator = reader + UPDATE (resolved_at, resolution) of dlr.exceptions."""
    await (await _seed(roles_db)).close()
    conn = await asyncpg.connect(roles_db.operator)
    try:
        open_id = await conn.fetchval(
            "SELECT min(id) FROM dlr.exceptions WHERE resolved_at IS NULL"
        )
        assert await resolve_exception(conn, open_id, "checked with the carrier")
    finally:
        await conn.close()
    for statement in (
        "UPDATE dlr.exceptions SET details = '{}'",
        "UPDATE dlr.exceptions SET kind = 'conflict'",
        "DELETE FROM dlr.exceptions",
        "UPDATE dlr.statuses SET status = 'DELIVERED'",
        "UPDATE dlr.reception_rows SET stat = 'x'",
    ):
        assert "permission denied" in await _refused(roles_db.operator, statement)


async def test_writer_records_verifications_and_the_reader_reports_quality(
    roles_db: RoleDatabase,
) -> None:
    """C6: the writer records verifications, never changes one; the reader reads them."""
    await (await _seed(roles_db)).close()
    store = await Store.open(roles_db.writer, pool_size=1)
    try:
        verified = Verification("acme", "m1", "otp_confirmed", datetime.now(UTC))
        assert (await store.record_verifications([verified])).recorded == 1
        # The daemon's route gauges, as the writer: the rollup is brought up to date first.
        now = datetime.now(UTC)
        year = Window(since=now - timedelta(days=365), until=now, now=now)
        (route,) = await store.quality("route", year)
        assert route["verified"] == 1
    finally:
        await store.close()
    assert "permission denied" in await _refused(
        roles_db.writer, "UPDATE dlr.verifications SET kind = 'x'"
    )
    # Only dlr.refresh_quality_hours() (the owner's) writes the rollup.
    for role in (roles_db.writer, roles_db.reader):
        assert "permission denied" in await _refused(role, "DELETE FROM dlr.quality_hours")
        assert "permission denied" in await _refused(role, "DELETE FROM dlr.quality_marks")
    # The caller supplies the country map: the reader may not fill the rollup with its own.
    assert "permission denied" in await _refused(
        roles_db.reader, """SELECT dlr.refresh_quality_hours('{"3461": "XX"}', NULL)"""
    )
    # Nor may anyone but the owner set the frontier: one set ahead of the clock stays there.
    for role in (roles_db.writer, roles_db.reader):
        assert "permission denied" in await _refused(
            role, "SELECT dlr.refresh_quality_hours_up_to('{}', 'infinity')"
        )
    conn = await asyncpg.connect(roles_db.reader)
    try:
        now = datetime.now(UTC)
        window = Window(since=now - timedelta(days=365), until=now, now=now)
        # The reader may not refresh the rollup: its report is counted from the raw tables.
        (group,) = await quality(conn, "route", window)
        assert group["verified"] == 1
        assert [group] == await raw_quality(conn, "route", window)
        assert (await message_reports(conn, "m1", None))[0]["facts"]["verified"] is not None
    finally:
        await conn.close()


async def test_privilege_matrix_no_role_but_the_owner_may_delete_or_truncate(
    roles_db: RoleDatabase,
) -> None:
    """Every table and view of schema dlr (also of later migrations): readable by the reader;
    DELETE/TRUNCATE/REFERENCES/TRIGGER by nobody but the owner; receptions insert-only."""
    conn = await asyncpg.connect(roles_db.superuser)
    try:
        tables = [
            r[0]
            for r in await conn.fetch(
                "SELECT c.oid::regclass::text FROM pg_class c "
                "WHERE c.relnamespace = 'dlr'::regnamespace AND c.relkind IN ('r', 'p', 'v')"
            )
        ]

        async def has(role: str, table: str, privilege: str) -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT has_table_privilege($1, $2, $3)", role, table, privilege
                )
            )

        for table in tables:
            assert await has("dlrfeed_reader", table, "SELECT"), table
            for role in ("dlrfeed_writer", "dlrfeed_reader", "dlrfeed_operator"):
                for privilege in ("DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
                    assert not await has(role, table, privilege), (role, table, privilege)
        assert await has("dlrfeed_writer", "dlr.reception_rows", "INSERT")
        assert not await has("dlrfeed_writer", "dlr.reception_rows", "UPDATE")
        assert not await has("dlrfeed_writer", "dlr.reception_rows", "SELECT")
        # The view is the readers': the writer reads the table's columns it replays.
        for privilege in ("SELECT", "INSERT", "UPDATE"):
            assert not await has("dlrfeed_writer", "dlr.receptions", privilege), privilege
        assert not await conn.fetchval(
            "SELECT has_schema_privilege('dlrfeed_writer', 'dlr', 'CREATE')"
        )
    finally:
        await conn.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlrfeed.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")},
    )


async def test_operator_commands_as_processes_with_the_reader_and_operator_logins(
    roles_db: RoleDatabase,
) -> None:
    """The real `dlrfeed show/exceptions/stats` run as dlrfeed_reader; `exceptions --resolve`
    needs dlrfeed_operator and, as the reader, is refused."""
    await (await _seed(roles_db)).close()
    for command in (["show", "m1"], ["exceptions"], ["stats"]):
        done = await asyncio.to_thread(_cli, *command, "--database-url", roles_db.reader, "--json")
        assert done.returncode == 0, (command, done.stderr[-500:])
        assert json.loads(done.stdout)
    listing = json.loads(
        (
            await asyncio.to_thread(_cli, "exceptions", "--database-url", roles_db.reader, "--json")
        ).stdout
    )
    open_id = str(listing["exceptions"][0]["id"])
    refused = await asyncio.to_thread(
        _cli,
        "exceptions",
        "--resolve",
        open_id,
        "--note",
        "checked",
        "--database-url",
        roles_db.reader,
    )
    assert refused.returncode != 0
    # One line naming the role to use, not a traceback.
    assert refused.stderr.strip().splitlines() == [
        "dlrfeed: this database login may not resolve exceptions (permission denied): use a "
        "login of the dlrfeed_operator role (docs/security.md)"
    ]
    resolved = await asyncio.to_thread(
        _cli,
        "exceptions",
        "--resolve",
        open_id,
        "--note",
        "checked",
        "--database-url",
        roles_db.operator,
    )
    assert resolved.returncode == 0, resolved.stderr[-500:]
    assert "resolved" in resolved.stdout


async def test_resolving_by_filter_needs_the_operator_role(roles_db: RoleDatabase) -> None:
    """`exceptions --resolve` by filter, as real processes: the reader may preview (it only
    reads) but is refused the resolve in one line; the operator resolves every match."""
    await (await _seed(roles_db)).close()
    argv = ["exceptions", "--resolve", "--login", "acme", "--note", "triaged"]
    preview = await asyncio.to_thread(_cli, *argv, "--database-url", roles_db.reader, "--json")
    assert preview.returncode == 0, preview.stderr[-500:]
    matched = json.loads(preview.stdout)["matched"]
    assert matched >= 1
    refused = await asyncio.to_thread(_cli, *argv, "--yes", "--database-url", roles_db.reader)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        "dlrfeed: this database login may not resolve exceptions (permission denied): use a "
        "login of the dlrfeed_operator role (docs/security.md)"
    ]
    resolved = await asyncio.to_thread(
        _cli, *argv, "--yes", "--json", "--database-url", roles_db.operator
    )
    assert resolved.returncode == 0, resolved.stderr[-500:]
    assert json.loads(resolved.stdout)["resolved"] == matched
    left = await asyncio.to_thread(
        _cli, "exceptions", "--login", "acme", "--json", "--database-url", roles_db.reader
    )
    assert json.loads(left.stdout)["exceptions"] == []


async def test_change_log_written_only_by_the_trigger_read_by_reader_cursors_by_operator(
    roles_db: RoleDatabase,
) -> None:
    """Migration 0009: the writer's ingest logs its changes through the trigger but cannot
    write the log itself, nor the reasons it names; the reader reads it and cannot keep
    a cursor; the operator can."""
    await (await _seed(roles_db)).close()
    for statement in (
        "INSERT INTO dlr.status_change_rows (position, login, message_id, status, is_final,"
        " reason, supporting_event_id, rules_version) VALUES (1, 'a', 'b', 'S', true, 'r', 1, 'v')",
        "UPDATE dlr.status_change_rows SET status = 'DELIVERED'",
        "UPDATE dlr.reasons SET reason = 'forged'",
        "INSERT INTO dlr.reasons (reason) VALUES ('forged')",
        "SELECT nextval('dlr.status_changes_tick')",
    ):
        assert "permission denied" in await _refused(roles_db.writer, statement)
    # The view joins the message rows: nobody updates it.
    writer = await asyncpg.connect(roles_db.writer)
    try:
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="cannot update view"):
            await writer.execute("UPDATE dlr.status_changes SET status = 'DELIVERED'")
    finally:
        await writer.close()
    reader = await asyncpg.connect(roles_db.reader)
    try:
        changes = await read_changes(reader)
        assert changes, "the writer's ingest wrote no change"
    finally:
        await reader.close()
    assert "permission denied" in await _refused(
        roles_db.reader, "INSERT INTO dlr.change_cursors (consumer) VALUES ('x')"
    )
    operator = await asyncpg.connect(roles_db.operator)
    try:
        await save_cursor(operator, "hooks", changes[-1].position)
        assert await load_cursor(operator, "hooks") == changes[-1].position
    finally:
        await operator.close()
    assert "permission denied" in await _refused(
        roles_db.operator, "UPDATE dlr.status_change_rows SET status = 'DELIVERED'"
    )
