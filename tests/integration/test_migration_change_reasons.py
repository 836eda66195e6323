"""Migration 0018: the change log names its reasons by id, and reads the same answers.

- On an installed store it is catalog changes only: brief locks on the change log and its
  days, no table rewritten, a few kB of WAL.
- One traffic (progress, results, repeats, late correlation) goes to two stores at the schema
  before it: one migrated halfway through, one at the end. Every change reads the same in
  both, field for field, though the first stores half of them by id: what `dlrfeed changes`,
  the follower and the relay show does not depend on when the store was migrated.
- A reason too long for the dictionary, and any reason once the dictionary is full, is stored
  in its change's row (and its status's, 0019) and reads back whole. An id names its text for
  good.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.store import Store, Submission
from dlrfeed.store.migrate import current_version
from dlrfeed_tools.local_login import LOGIN
from dlrfeed_tools.migration_probe import (
    apply_measured,
    by_message,
    changes_read,
    install_migrating_halfway,
    install_with_traffic,
)
from dlrfeed_tools.pgcluster import PgCluster
from dlrfeed_tools.rule_receipts import receipt

CHANGE_REASONS = 18
_BY_ID = "SELECT count(*) FROM dlr.status_change_rows WHERE reason IS NULL AND reason_id > 0"


@pytest.fixture
async def databases(pg_cluster: PgCluster) -> AsyncIterator[list[str]]:
    names = [f"change_reasons_{os.getpid()}_{n}" for n in range(2)]
    dsns = [await pg_cluster.create_database(name) for name in names]
    yield dsns
    for name in names:
        await pg_cluster.drop_database(name)


async def test_it_changes_the_catalog_only_under_brief_locks(databases: list[str]) -> None:
    dsn = databases[0]
    await install_with_traffic(dsn, CHANGE_REASONS)
    cost = await apply_measured(dsn, CHANGE_REASONS)
    conn = await asyncpg.connect(dsn)
    try:
        assert await current_version(conn) == CHANGE_REASONS
        days = {
            f"dlr_partitions.{r[0]}"
            for r in await conn.fetch(
                "SELECT partition_name FROM dlr.day_partitions"
                " WHERE parent_table = 'status_change_rows'"
            )
        }
    finally:
        await conn.close()
    # Relations as named before the commit: the log's parent, renamed by the migration, still
    # dlr.status_changes; the dictionary and the view, new, not yet seen at all.
    exclusive = {r for r, modes in cost.locks.items() if "AccessExclusiveLock" in modes}
    assert {"dlr.status_changes"} | days <= exclusive
    # The statuses' writers wait (their reads do not), so that none runs the old trigger on
    # the renamed log; nothing else is locked but the log's indexes, the view that lists the
    # days (read) and the version table the migration records itself in.
    assert cost.locks["dlr.message_status"] == {"ShareRowExclusiveLock"}
    untouched = {"dlr.events", "dlr.receptions", "dlr.messages"}
    assert not untouched & set(cost.locks)
    others = {
        r
        for r in cost.locks
        if not r.split(".")[1].startswith(("status_change", "reasons", "message_status"))
    }
    assert others <= {"dlr.day_partitions", "dlr.schema_version", "dlr.schema_version_pkey"}
    # No stored row moves: the only new files are the dictionary's.
    assert set(cost.rewritten) <= {"dlr.reasons", "dlr.reasons_pkey", "dlr.reasons_reason_key"}
    assert cost.wal_bytes < 1024 * 1024


async def test_a_store_migrated_halfway_reads_the_same_changes(databases: list[str]) -> None:
    halfway, at_the_end = databases
    await install_migrating_halfway(halfway, CHANGE_REASONS)
    await install_migrating_halfway(at_the_end, CHANGE_REASONS, migrate_at=None)
    answers = await changes_read(halfway)
    assert len(answers) > 10_000
    assert {a["previous_reason"] for a in answers} > {None}
    # Each message's changes in their order (the order of changes one transaction wrote for
    # different messages is not a fact of the log: they share its epoch).
    assert by_message(answers) == by_message(await changes_read(at_the_end))
    conn = await asyncpg.connect(halfway)
    try:
        by_id = int(await conn.fetchval(_BY_ID))
        reasons = int(await conn.fetchval("SELECT count(*) FROM dlr.reasons"))
    finally:
        await conn.close()
    # Most of the changes were written after the migration, each naming its reasons by id;
    # the traffic's few wordings (progress, delivered) are the whole dictionary.
    assert by_id > len(answers) / 2
    assert reasons <= 4


async def test_reasons_the_dictionary_does_not_take_are_kept_in_the_row(
    database_url: str, db: asyncpg.Connection
) -> None:
    long_err = "e" * 1500  # a reason over the dictionary's 1,000 bytes
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions(
            [Submission(LOGIN, m, "+34600000001") for m in ("long", "short", "closed")]
        )
        await store.ingest(LOGIN, [receipt("long", 2, "UNDELIV", err=long_err)])
        await store.ingest(LOGIN, [receipt("short", 2, "UNDELIV", err="001")])
        # A dictionary at its bound takes no new text.
        await db.execute("SELECT setval('dlr.reasons_id_seq', 100000)")
        await store.ingest(LOGIN, [receipt("closed", 2, "UNDELIV", err="002")])
    finally:
        await store.close()
    stored = {
        r["message_id"]: (r["reason"], r["reason_id"])
        for r in await db.fetch(
            "SELECT m.message_id, c.reason, c.reason_id FROM dlr.status_change_rows AS c"
            " JOIN dlr.messages AS m ON m.id = c.message_ref"
        )
    }
    shown = {
        r["message_id"]: r["reason"]
        for r in await db.fetch("SELECT message_id, reason FROM dlr.status_changes")
    }
    statuses = {
        r["message_id"]: r["reason"]
        for r in await db.fetch("SELECT message_id, reason FROM dlr.message_status")
    }
    assert shown == statuses
    assert long_err in shown["long"]
    assert stored["long"] == (shown["long"], None)
    assert stored["short"][0] is None
    assert stored["short"][1] is not None
    assert stored["closed"] == (shown["closed"], None)


async def test_an_id_names_its_text_for_good(db: asyncpg.Connection) -> None:
    await db.execute("INSERT INTO dlr.reasons (reason) VALUES ('a reason')")
    for statement in (
        "UPDATE dlr.reasons SET reason = 'another'",
        "DELETE FROM dlr.reasons",
        "TRUNCATE dlr.reasons",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="only grows"):
            await db.execute(statement)
    assert await db.fetchval("SELECT reason FROM dlr.reasons") == "a reason"
