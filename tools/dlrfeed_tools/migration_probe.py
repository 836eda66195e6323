"""One migration applied as `dlrfeed migrate` applies it, with what it cost an installed store:
the locks its transaction held (read from a second connection just before its commit), how
long it held them, the WAL it wrote, and whether it rewrote a table (a new relfilenode).

The test of a migration's online claim and the measurement on a large store
(`scripts/bench_migration.py`) both use it; the tests that a store reads the same answers
however late it was migrated use `install_migrating_halfway` and `changes_read`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from dlrfeed.store import Store
from dlrfeed.store.changes import read_changes
from dlrfeed.store.migrate import available_migrations, migrate
from dlrfeed.store.reports import message_reports
from dlrfeed.store.sql import query
from dlrfeed_tools.bench.growth_traffic import BATCHES_PER_ROUND, Traffic
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.retention_support import install_schema_before

_LOCK = query("lock_migrations")
_RECORD = query("record_migration")
_MIGRATION_LOCK_KEY = 0x646C7266  # dlrfeed.store.migrate's: a probe and a real migrate serialise
# Every relation of schemas dlr and dlr_partitions (either may not exist yet), with the file
# that holds it.
_FILES = """
SELECT c.oid::regclass::text AS relation, c.relfilenode
FROM pg_class AS c
WHERE c.relnamespace IN (to_regnamespace('dlr'), to_regnamespace('dlr_partitions'))
  AND c.relkind IN ('r', 'i', 'm', 't')
"""
_HELD = """
SELECT l.relation::regclass::text AS relation, l.mode
FROM pg_locks AS l
WHERE l.pid = $1 AND l.locktype = 'relation' AND l.granted
  AND l.relation IN (SELECT c.oid FROM pg_class AS c
                     WHERE c.relnamespace IN (to_regnamespace('dlr'),
                                              to_regnamespace('dlr_partitions')))
ORDER BY 1, 2
"""


@dataclass(frozen=True)
class MigrationCost:
    """What applying one migration cost."""

    locks: dict[str, set[str]]
    """Relation -> lock modes its transaction held at the end (schemas dlr, dlr_partitions)."""
    statements_ms: float
    """The migration's statements, from the first lock to the last statement's end."""
    commit_ms: float
    wal_bytes: int
    """WAL from the transaction's start to its commit (with anything else the server wrote)."""
    rewritten: list[str]
    """Relations that got a new file: rewritten or rebuilt (nothing, for an online one)."""


async def apply_measured(dsn: str, version: int) -> MigrationCost:
    """Apply migration `version` (the database must be at the one before it), measured."""
    (migration,) = [m for m in available_migrations() if m.version == version]
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    watcher = await asyncpg.connect(dsn)
    try:
        files_before = {r[0]: r[1] for r in await watcher.fetch(_FILES)}
        pid = conn.get_server_pid()
        wal_before = await watcher.fetchval("SELECT pg_current_wal_insert_lsn()")
        transaction = conn.transaction()
        await transaction.start()
        try:
            started = time.perf_counter()
            await _LOCK.execute(conn, migration_lock_key=_MIGRATION_LOCK_KEY)
            await conn.execute(migration.sql)
            await _RECORD.execute(
                conn, migration_version=migration.version, migration_name=migration.name
            )
            statements_ms = 1000 * (time.perf_counter() - started)
            held: dict[str, set[str]] = {}
            for r in await watcher.fetch(_HELD, pid):
                held.setdefault(r["relation"], set()).add(r["mode"])
        except BaseException:
            await transaction.rollback()
            raise
        started = time.perf_counter()
        await transaction.commit()
        commit_ms = 1000 * (time.perf_counter() - started)
        wal_bytes = int(
            await watcher.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal_before
            )
        )
        files_after = {r[0]: r[1] for r in await watcher.fetch(_FILES)}
    finally:
        await watcher.close()
        await conn.close()
    rewritten = sorted(
        name for name, node in files_after.items() if files_before.get(name, node) != node
    )
    return MigrationCost(held, statements_ms, commit_ms, wal_bytes, rewritten)


def assert_online(
    cost: MigrationCost,
    *,
    exclusive: str,
    read: tuple[str, ...] = (),
    untouched: tuple[str, ...] = (),
) -> None:
    """The online claim of a catalog-only migration: `exclusive` held in ACCESS EXCLUSIVE
    (named as before the commit), the relations in `read` at most read, those in `untouched`
    not locked at all, nothing rewritten, under a megabyte of WAL."""
    assert "AccessExclusiveLock" in cost.locks[exclusive], cost.locks
    for relation in read:
        assert cost.locks.get(relation, set()) <= {"AccessShareLock"}, relation
    assert not set(untouched) & set(cost.locks)
    assert cost.rewritten == []
    assert cost.wal_bytes < 1024 * 1024


async def install_before(dsn: str, version: int) -> None:
    """The empty database at `dsn` made a store as released before migration `version`."""
    conn = await asyncpg.connect(dsn)
    try:
        await install_schema_before(conn, version)
    finally:
        await conn.close()


async def install_with_traffic(dsn: str, version: int) -> None:
    """An empty database made a store as released before migration `version`, holding a few
    thousand receptions of the growth benchmark's traffic (half a round: progress, results,
    repeats, with their statuses and changes): the installed store a migration meets."""
    await install_before(dsn, version)
    traffic = Traffic(seed=7)
    store = await Store.open(dsn, pool_size=1)
    try:
        await store.record_submissions(traffic.submissions())
        for index in range(BATCHES_PER_ROUND // 2):
            await store.ingest(LOGIN, traffic.batch(index))
    finally:
        await store.close()


async def install_migrating_halfway(
    dsn: str, version: int, *, migrate_at: int | None = BATCHES_PER_ROUND // 2
) -> None:
    """An empty database made a store as released before migration `version`, then a round and
    a half of the growth benchmark's traffic (its second round's records correlate receipts
    late), the store migrated to the latest schema after `migrate_at` batches (None: after
    all of them). The Store stops for the migration and starts again, as an upgrade does."""
    await install_before(dsn, version)
    traffic = Traffic(seed=11)
    batches = 0
    for batches_this_round in (BATCHES_PER_ROUND, BATCHES_PER_ROUND // 2):
        store = await Store.open(dsn, pool_size=1)
        try:
            await store.record_submissions(traffic.submissions())
            for index in range(batches_this_round):
                if batches == migrate_at:
                    await store.close()
                    await migrate(dsn)
                    store = await Store.open(dsn, pool_size=1)
                await store.ingest(LOGIN, traffic.batch(index))
                batches += 1
        finally:
            await store.close()
    if migrate_at is None or batches <= migrate_at:
        await migrate(dsn)


# Where a change stands and when it was written differ between any two stores.
_STORE_SPECIFIC = {"position", "changed_at"}


async def changes_read(dsn: str) -> list[dict[str, Any]]:
    """Every change of the log as `dlrfeed changes` shows it, without what differs between any
    two stores (its position and when it was written)."""
    conn = await asyncpg.connect(dsn)
    try:
        changes = await read_changes(conn, 0, 1_000_000)
    finally:
        await conn.close()
    return [
        {k: v for k, v in change.to_json().items() if k not in _STORE_SPECIFIC}
        for change in changes
    ]


def by_message(answers: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """`answers` grouped by message, each message's in their order (the order of changes one
    transaction wrote for different messages is not a fact of the log: they share its
    epoch)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for answer in answers:
        grouped.setdefault(answer["message_id"], []).append(answer)
    return grouped


# When a status was written, and the epoch of its transaction, differ between any two stores;
# so do the times the stores took from their clocks (the traffic's receipts are received when
# sent).
_STATUS_SPECIFIC = {"updated_at", "change_epoch"}
_CLOCK_TIMES = {
    "received_at",
    "first_received_at",
    "last_received_at",
    "stored_at",
    "recorded_at",
    "opened_at",
    "resolved_at",
}


async def statuses_read(dsn: str) -> list[dict[str, Any]]:
    """Every status as `dlr.message_status` shows it, in key order, without what differs
    between any two stores."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT * FROM dlr.message_status ORDER BY login, message_id")
    finally:
        await conn.close()
    return [{k: v for k, v in r.items() if k not in _STATUS_SPECIFIC} for r in rows]


async def receptions_read(dsn: str, view: str = "dlr.receptions") -> list[dict[str, Any]]:
    """Every reception as `view` (dlr.receptions or dlr.receptions_readable) shows it, in id
    order, without the times the store took from its clock."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f"SELECT * FROM {view} ORDER BY id")
    finally:
        await conn.close()
    return [{k: v for k, v in r.items() if k not in _CLOCK_TIMES} for r in rows]


async def shown_read(dsn: str, message_ids: list[str]) -> list[Any]:
    """`dlrfeed show` of each message, without what differs between any two stores."""
    conn = await asyncpg.connect(dsn)
    try:
        shown = [await message_reports(conn, m, LOGIN) for m in message_ids]
    finally:
        await conn.close()
    return [_without_store_specifics(s) for s in shown]


def _without_store_specifics(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_store_specifics(v)
            for k, v in value.items()
            if k not in _STATUS_SPECIFIC | _CLOCK_TIMES
        }
    if isinstance(value, list):
        return [_without_store_specifics(v) for v in value]
    return value


async def ingest_after_migrating(dsn: str, version: int) -> tuple[BaseException | None, int]:
    """A `Store` opened on a store released before migration `version` (with a traffic's
    messages recorded), then the schema migrated under it, ingests one batch: what that raised
    (None: nothing), and how many receptions the batch added."""
    await install_with_traffic(dsn, version)
    traffic = Traffic(seed=8)
    store = await Store.open(dsn, pool_size=1)
    conn = await asyncpg.connect(dsn)
    try:
        await store.record_submissions(traffic.submissions())
        await migrate(dsn)
        before = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions"))
        raised: BaseException | None = None
        try:
            await store.ingest(LOGIN, traffic.batch(0))
        except Exception as exc:  # noqa: BLE001 - the caller judges what was raised
            raised = exc
        added = int(await conn.fetchval("SELECT count(*) FROM dlr.receptions")) - before
    finally:
        await conn.close()
        await store.close()
    return raised, added
