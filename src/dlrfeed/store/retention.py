"""Retention by whole days (docs/retention.md): partitions created ahead, old ones archived
and dropped, and old messages forgotten.

The receptions and the status-change log are partitioned by UTC day. `maintain` (the schema
owner's `dlrfeed maintain`) creates the days ahead and, with a retention, drops each day older
than it, as one `DROP TABLE` (P13: evidence is never deleted row by row), after archiving it
when asked. The dedup keys live in the events, which are not partitioned, so a redelivery after
its first delivery's day went is still a repeat (P14); a retention shorter than the gateway's
redelivery horizon (F16) is refused all the same. A day of changes a durable consumer has not
read is not dropped unless that consumer is abandoned. Messages, their statuses and events are
keyed for all time, so `forget` removes them row by row, once their evidence has gone.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import itertools
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import asyncpg
import asyncpg.exceptions

from dlrfeed.errors import ConfigError, FatalError
from dlrfeed.store.migrate import ensure_current
from dlrfeed.store.quality import drop_unread_marks, refresh_before_retention
from dlrfeed.store.sql import Query, query

# F16: the fake gateway keeps an unacked receipt 7 days (fakegw --retention-seconds 604800).
DEFAULT_REDELIVERY_HORIZON_DAYS = 7
DEFAULT_DAYS_AHEAD = 7
PARTITION_SCHEMA = "dlr_partitions"
ARCHIVE_FORMAT = "PostgreSQL COPY binary, gzip"

# DDL on a partition needs a moment of ACCESS EXCLUSIVE on dlr.receptions: wait at most this
# long for the ingest transactions in flight (milliseconds each), so that the daemon's next
# batches queue behind us only that long, then try again.
_LOCK_TIMEOUT = "2s"
_LOCK_ATTEMPTS = 30

_T = TypeVar("_T")

_SET_LOCK_TIMEOUT = query("set_lock_timeout")
_PARTITIONS_TO_DROP = query("partitions_to_drop")
_COLUMNS = query("table_columns")
_LOCK_CHANGE_CURSORS = query("lock_change_cursors")
_UNREAD_BY = query("unread_by")
_DROP_PARTITION = query("drop_partition")
_COUNT_PARTITION = query("count_partition")
_PARTITION_HOLDS_ROWS = query("partition_holds_rows")
_PARTITIONS_OLDEST_FIRST = query("partitions_oldest_first")
_START_FORGETTING = query("start_forgetting")
_FORGETTING_POSITION = query("forgetting_position")
_SAVE_FORGETTING_POSITION = query("save_forgetting_position")
_MESSAGES_AFTER = query("messages_after")
_LOCK_MESSAGES_TO_FORGET = query("lock_messages_to_forget")
_FORGETTING_VERDICTS = query("forgetting_verdicts")
_FORGET_CLOSED_EXCEPTIONS = query("forget_closed_exceptions")
_FORGET_MESSAGES = query("forget_messages")

# Messages looked at per transaction of the forgetting pass: each holds the row locks of its
# batch for a few milliseconds, which is all an ingest of one of them may wait.
FORGET_BATCH = 1000


@dataclass(frozen=True)
class DayPartitioned:
    """One table partitioned by UTC day: the view its readers use in dlr (its partitions'
    prefix), the partitioned table behind it, the statement that creates its partitions ahead,
    the name of the day column in an archive's manifest, and a partition's rows as its archive
    holds them (the view's columns, `{partition}`)."""

    table: str
    parent: str
    create_partitions: Query
    manifest_bound: str
    archived_rows: Query

    @property
    def default_partition(self) -> str:
        """The catch-all partition for a day not created yet."""
        return f"{self.table}_default"


RECEPTIONS = DayPartitioned(
    "receptions",
    "reception_rows",
    query("create_reception_partitions"),
    "received",
    query("archived_receptions"),
)
STATUS_CHANGES = DayPartitioned(
    "status_changes",
    "status_change_rows",
    query("create_status_change_partitions"),
    "changed",
    query("archived_status_changes"),
)
DAY_PARTITIONED = (RECEPTIONS, STATUS_CHANGES)


@dataclass(frozen=True)
class RetentionPolicy:
    """What `maintain` keeps: every day when `retention_days` is None, else that many days back;
    every message when `forget_after_days` is None, else those with something newer.

    ConfigError (exit 78) when the retention is shorter than the redelivery horizon (F16), when
    messages would be forgotten while their evidence is kept (no retention, or one as long),
    or when a count is below one.
    """

    retention_days: int | None = None
    redelivery_horizon_days: int = DEFAULT_REDELIVERY_HORIZON_DAYS
    days_ahead: int = DEFAULT_DAYS_AHEAD
    forget_after_days: int | None = None

    def __post_init__(self) -> None:
        if self.days_ahead < 1:
            raise ConfigError(f"--days-ahead must be at least 1, got {self.days_ahead}")
        if self.redelivery_horizon_days < 1:
            raise ConfigError(
                f"--redelivery-horizon-days must be at least 1, got {self.redelivery_horizon_days}"
            )
        if self.retention_days is not None and self.retention_days < self.redelivery_horizon_days:
            raise ConfigError(
                f"--retention-days {self.retention_days} is shorter than the gateway's redelivery"
                f" horizon of {self.redelivery_horizon_days} days (F16): refused"
            )
        if self.forget_after_days is not None and (
            self.retention_days is None or self.forget_after_days <= self.retention_days
        ):
            kept = "kept forever" if self.retention_days is None else "kept as long"
            raise ConfigError(
                f"--forget-after-days {self.forget_after_days} would forget messages whose"
                f" evidence is {kept}: give a --retention-days shorter than it (docs/retention.md)"
            )


@dataclass(frozen=True)
class ArchivedPartition:
    """One partition written out before its drop: the data file and its manifest."""

    partition: str
    rows: int
    data_file: Path
    manifest_file: Path


@dataclass
class Forgotten:
    """What one forgetting pass removed, and the old messages it kept for an operator."""

    messages: int = 0
    statuses: int = 0
    events: int = 0
    closed_exceptions: int = 0
    kept_for_open_exceptions: int = 0
    kept_for_evidence: int = 0
    """Old messages kept because a reception naming its key by one of their events is still
    stored (a day not dropped: the default partition's rows)."""
    kept_for_changes: int = 0
    """Old messages kept because a change of their status may still be stored (a day of the
    change log kept for a consumer that has not read it)."""


@dataclass
class MaintenanceReport:
    """What one `maintain` did, in order."""

    created: list[str] = field(default_factory=list)
    archived: list[ArchivedPartition] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    defaults_holding_rows: list[str] = field(default_factory=list)
    """Default partitions with rows in them (a day had no partition when they came)."""
    forgotten: Forgotten | None = None
    """What the forgetting pass did, when it ran."""

    @property
    def default_partition_holds_rows(self) -> bool:
        """Whether any default partition holds rows."""
        return bool(self.defaults_holding_rows)


async def maintain(
    dsn: str,
    policy: RetentionPolicy,
    *,
    archive_dir: Path | None = None,
    now: datetime | None = None,
    abandoned_consumers: Sequence[str] = (),
) -> MaintenanceReport:
    """Create the partitions of the next `policy.days_ahead` days of the evidence and of the
    change log; with a retention, archive (when `archive_dir` is given) and drop every
    partition whose day ended more than `retention_days` before `now`. A day of changes that a
    durable consumer has not read to its end is refused (FatalError naming the consumer and its
    position) unless the consumer is in `abandoned_consumers`. Run as the schema owner; safe to
    run again at any time (a partition already created or dropped is not touched again)."""
    moment = now or datetime.now(UTC)
    report = MaintenanceReport()
    # No named prepared statements and no session state: safe through a transaction pooler.
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        # A schema of another version may partition other tables, or none (exit 78).
        await ensure_current(conn)
        today = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        through = today + timedelta(days=policy.days_ahead + 1)
        for parent in DAY_PARTITIONED:
            try:
                report.created += await _with_lock_retries(
                    parent, functools.partial(_created, conn, parent, through)
                )
            except asyncpg.exceptions.CheckViolationError as exc:
                raise FatalError(
                    f"cannot create the partitions ahead: {exc}; rows of those days sit in "
                    f"{PARTITION_SCHEMA}.{parent.default_partition} (docs/retention.md)"
                ) from exc
        await drop_unread_marks(conn)
        if policy.retention_days is not None:
            # The rollup reads the changes of the days about to go (docs/quality.md).
            await refresh_before_retention(conn)
            cutoff = moment - timedelta(days=policy.retention_days)
            for parent in DAY_PARTITIONED:
                partitions = await _PARTITIONS_TO_DROP.fetch(
                    conn, parent_table=parent.parent, cutoff=cutoff
                )
                # A day of changes is dropped only once its durable consumers have read it.
                abandoned = abandoned_consumers if parent is STATUS_CHANGES else None
                for row in partitions:
                    name = str(row["partition_name"])
                    if abandoned is not None:
                        # Before the archive: a refused day is neither written out nor dropped.
                        await _refuse_unread(conn, name, abandoned, lock=False)
                    if archive_dir is not None:
                        report.archived.append(
                            await archive_partition(
                                conn,
                                name,
                                row["lower_bound"],
                                row["upper_bound"],
                                archive_dir,
                                parent=parent,
                            )
                        )
                    await _with_lock_retries(
                        parent, functools.partial(_drop, conn, name, abandoned)
                    )
                    report.dropped.append(name)
        if policy.forget_after_days is not None:
            # After the drops: the messages forgotten are those whose evidence is gone.
            report.forgotten = await forget(conn, moment - timedelta(days=policy.forget_after_days))
        for parent in DAY_PARTITIONED:
            holds_rows = _PARTITION_HOLDS_ROWS.naming(partition=parent.default_partition)
            if await holds_rows.fetchval(conn):
                report.defaults_holding_rows.append(parent.default_partition)
    finally:
        await conn.close()
    return report


async def forget(
    conn: asyncpg.Connection, cutoff: datetime, *, batch: int = FORGET_BATCH
) -> Forgotten:
    """Forget every message recorded before `cutoff` of which nothing happened since (no
    delivery, no status change): its events, its status and its record, `batch` messages per
    transaction, in the order they were recorded, from where the last pass stopped.

    Kept: a message being written right now (its row is locked), one with something at or
    after `cutoff`, and one an open exception refers to (the operator's). The resolved
    exceptions that point at a forgotten message's events go with it. The pass saves its
    position just before the first message it kept, so the next run looks at every kept one
    again (and forgets it once it may), without reading past the forgotten ones, which are gone.
    """
    forgotten = Forgotten()
    changes_since = await _oldest_change_kept(conn)
    after_id = int(await _FORGETTING_POSITION.fetchval(conn))
    resume_after: int | None = None  # just before the first message kept
    while True:
        async with conn.transaction():
            await _START_FORGETTING.fetchval(conn)
            rows = await _MESSAGES_AFTER.fetch(conn, after_id=after_id, batch=batch)
            old = list(itertools.takewhile(lambda r: r["recorded_at"] < cutoff, rows))
            if not old:
                break
            ids = [int(r["id"]) for r in old]
            locked = [int(r["id"]) for r in await _LOCK_MESSAGES_TO_FORGET.fetch(conn, ids=ids)]
            verdicts = await _FORGETTING_VERDICTS.fetch(
                conn, ids=locked, cutoff=cutoff, changes_since=changes_since
            )
            gone = [
                v
                for v in verdicts
                if not (v["recent"] or v["investigated"] or v["evidence_kept"])
                and not v["changes_kept"]
            ]
            forgotten.kept_for_open_exceptions += sum(
                1 for v in verdicts if v["investigated"] and not v["recent"]
            )
            forgotten.kept_for_evidence += sum(
                1 for v in verdicts if v["evidence_kept"] and not v["recent"]
            )
            forgotten.kept_for_changes += sum(
                1 for v in verdicts if v["changes_kept"] and not (v["recent"] or v["evidence_kept"])
            )
            if gone:
                event_ids = [e for v in gone for e in v["event_ids"]]
                forgotten.closed_exceptions += int(
                    await _FORGET_CLOSED_EXCEPTIONS.fetchval(conn, event_ids=event_ids)
                )
                counts = await _FORGET_MESSAGES.fetchrow(
                    conn,
                    ids=[v["id"] for v in gone],
                    event_ids=event_ids,
                )
                assert counts is not None  # one row, always
                forgotten.messages += int(counts["messages"])
                forgotten.statuses += int(counts["statuses"])
                forgotten.events += int(counts["events"])
            kept = set(ids) - {int(v["id"]) for v in gone}
            if kept and resume_after is None:
                resume_after = min(kept) - 1
            after_id = ids[-1]
        if len(old) < len(rows) or len(rows) < batch:
            break
    await _SAVE_FORGETTING_POSITION.execute(
        conn, after_id=after_id if resume_after is None else resume_after
    )
    return forgotten


async def _oldest_change_kept(conn: asyncpg.Connection) -> datetime:
    """The earliest time the change log may still hold a change from: the start of its oldest
    day that holds one (the earliest time there is, for rows in the default partition or in a
    first day unbounded below; the latest, for an empty log). A change names its message by
    the message row's id, so no message is forgotten while a change
    of it may be kept (a day kept for a consumer that has not read it)."""
    for row in await _PARTITIONS_OLDEST_FIRST.fetch(conn, parent_table=STATUS_CHANGES.parent):
        holds_rows = _PARTITION_HOLDS_ROWS.naming(partition=row["partition_name"])
        if await holds_rows.fetchval(conn):
            return row["lower_bound"] or datetime.min.replace(tzinfo=UTC)
    return datetime.max.replace(tzinfo=UTC)


async def _guard_locks(conn: asyncpg.Connection) -> None:
    """Bound the lock waits of the transaction under way (SET LOCAL: nothing of it outlives
    the transaction, so it is safe through a transaction pooler)."""
    await _SET_LOCK_TIMEOUT.fetchval(conn, lock_timeout=_LOCK_TIMEOUT)


async def _drop(conn: asyncpg.Connection, partition: str, abandoned: Sequence[str] | None) -> None:
    """Drop a day; a day of changes (`abandoned` given) in the transaction that proves every
    durable consumer (but the abandoned) has read it: the cursors are locked against a new one
    starting at 0 meanwhile (they only move forward otherwise, so a check that passed stays
    true)."""
    async with conn.transaction():
        await _guard_locks(conn)
        if abandoned is not None:
            await _refuse_unread(conn, partition, abandoned, lock=True)
        await _DROP_PARTITION.naming(partition=partition).execute(conn)


async def _refuse_unread(
    conn: asyncpg.Connection, partition: str, abandoned: Sequence[str], *, lock: bool
) -> None:
    if lock:
        await _LOCK_CHANGE_CURSORS.execute(conn)
    behind = await _UNREAD_BY.naming(partition=partition).fetchrow(conn, abandoned=list(abandoned))
    if behind is not None:
        raise FatalError(
            f"refused to drop {PARTITION_SCHEMA}.{partition}: consumer {behind['consumer']!r}"
            f" has read the change log only up to position {behind['position']} and would"
            " lose changes it never read; let it catch up, or give --abandon-consumer"
            f" {behind['consumer']} (docs/retention.md)"
        )


async def _created(
    conn: asyncpg.Connection, parent: DayPartitioned, through: datetime
) -> list[str]:
    async with conn.transaction():
        await _guard_locks(conn)
        rows = await parent.create_partitions.fetch(conn, through=through)
    return [str(r["name"]) for r in rows]


async def _with_lock_retries(parent: DayPartitioned, action: Callable[[], Awaitable[_T]]) -> _T:
    """Run `action`, again after a lock timeout (the ingest held the table), a bounded number
    of times; the last timeout is raised as FatalError."""
    for attempt in range(1, _LOCK_ATTEMPTS + 1):
        try:
            return await action()
        except asyncpg.exceptions.LockNotAvailableError as exc:
            if attempt == _LOCK_ATTEMPTS:
                raise FatalError(
                    f"dlr.{parent.parent} stayed locked through {_LOCK_ATTEMPTS} attempts: {exc}"
                ) from exc
            await asyncio.sleep(0.1 * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


async def archive_partition(
    conn: asyncpg.Connection,
    partition: str,
    lower_bound: datetime | None,
    upper_bound: datetime,
    archive_dir: Path,
    *,
    parent: DayPartitioned,
) -> ArchivedPartition:
    """Write one partition to `archive_dir` as `<partition>.copy.gz` (binary COPY, gzip) and
    `<partition>.manifest.json` (bounds, row count, columns, SHA-256, how to load it back), each
    durably (fsync) before it is named, so a drop never follows a half-written archive."""
    partial = await asyncio.to_thread(_partial_file, archive_dir, partition)
    # One snapshot for the count and the copy (the day is over: nothing is added to it anyway).
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        await _guard_locks(conn)
        rows = int(await _COUNT_PARTITION.naming(partition=partition).fetchval(conn))
        columns = [
            (str(r["name"]), str(r["type"]))
            for r in await _COLUMNS.fetch(conn, table_name=f"dlr.{parent.table}")
        ]
        with partial.open("wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as packed:

                async def write(chunk: bytes) -> None:
                    packed.write(chunk)

                await conn.copy_from_query(
                    parent.archived_rows.naming(partition=partition).text,
                    output=write,
                    format="binary",
                )
            raw.flush()
            os.fsync(raw.fileno())
    manifest = {
        "table": f"dlr.{parent.table}",
        "partition": partition,
        f"{parent.manifest_bound}_from": lower_bound.isoformat() if lower_bound else None,
        f"{parent.manifest_bound}_before": upper_bound.isoformat(),
        "rows": rows,
        "format": ARCHIVE_FORMAT,
        "data_file": f"{partition}.copy.gz",
        "columns": [{"name": name, "type": kind} for name, kind in columns],
        "load_back": [
            f"CREATE TABLE restored_{parent.table} (LIKE dlr.{parent.table});",
            f"gunzip -c {partition}.copy.gz | psql -d DATABASE -c "
            f'"\\copy restored_{parent.table} FROM STDIN (FORMAT binary)"',
        ],
        "archived_at": datetime.now(UTC).isoformat(),
    }
    data_file, manifest_file = await asyncio.to_thread(_seal, partial, manifest)
    return ArchivedPartition(partition, rows, data_file, manifest_file)


def _partial_file(archive_dir: Path, partition: str) -> Path:
    archive_dir.mkdir(parents=True, exist_ok=True)
    return archive_dir / f"{partition}.copy.gz.partial"


def _seal(partial: Path, manifest: Mapping[str, object]) -> tuple[Path, Path]:
    """Name the written data file, then write its manifest (with the file's SHA-256) beside it;
    each is fsynced before its rename, and the directory after both."""
    digest = hashlib.sha256()
    with partial.open("rb") as written:
        for block in iter(lambda: written.read(1 << 20), b""):
            digest.update(block)
    data_file = partial.with_name(str(manifest["data_file"]))
    partial.replace(data_file)
    manifest_file = data_file.with_name(f"{manifest['partition']}.manifest.json")
    staged = manifest_file.with_name(manifest_file.name + ".partial")
    with staged.open("w", encoding="utf-8") as out:
        json.dump({**manifest, "sha256": digest.hexdigest()}, out, indent=2)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    staged.replace(manifest_file)
    directory = os.open(data_file.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the renames themselves survive a crash before the drop
    finally:
        os.close(directory)
    return data_file, manifest_file
