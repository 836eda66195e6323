"""The schema owner's upkeep: partitions created ahead, whole old days archived and dropped.

When asked, it also forgets old messages whose evidence is gone (docs/retention.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import asyncpg
import asyncpg.exceptions

from dlrfeed.config import add_database_url, required
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.retention import (
    DEFAULT_DAYS_AHEAD,
    DEFAULT_REDELIVERY_HORIZON_DAYS,
    PARTITION_SCHEMA,
    RetentionPolicy,
    maintain,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--retention-days, --archive-dir, --redelivery-horizon-days, --days-ahead,
    --abandon-consumer, --forget-after-days, --json."""
    add_database_url(parser)
    parser.add_argument(
        "--retention-days",
        type=int,
        metavar="N",
        help="drop the days of evidence older than N days (default: keep everything)",
    )
    parser.add_argument(
        "--archive-dir",
        type=Path,
        metavar="DIR",
        help="write each day to DIR (binary COPY, gzip, with a manifest) before dropping it",
    )
    parser.add_argument(
        "--redelivery-horizon-days",
        type=int,
        default=DEFAULT_REDELIVERY_HORIZON_DAYS,
        metavar="N",
        help="how long the gateway may redeliver (F16); a shorter retention is refused",
    )
    parser.add_argument(
        "--days-ahead",
        type=int,
        default=DEFAULT_DAYS_AHEAD,
        metavar="N",
        help="create the partitions of the next N days",
    )
    parser.add_argument(
        "--abandon-consumer",
        action="append",
        default=[],
        metavar="NAME",
        help="drop days of the change log that durable consumer NAME has not read yet (it "
        "loses them); without it such a drop is refused. Repeat for several consumers",
    )
    parser.add_argument(
        "--forget-after-days",
        type=int,
        metavar="N",
        help="forget each message (its record, status and events) once nothing of it happened "
        "for N days; longer than --retention-days, so its evidence went first (default: keep "
        "every message)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document")


async def run(args: argparse.Namespace) -> int:
    """Run one upkeep; print what was created, archived and dropped. Exit 1 (after doing the
    rest) when rows sit in a default partition: a day was missing when they came."""
    policy = RetentionPolicy(
        retention_days=args.retention_days,
        redelivery_horizon_days=args.redelivery_horizon_days,
        days_ahead=args.days_ahead,
        forget_after_days=args.forget_after_days,
    )
    try:
        report = await maintain(
            required(args, "database_url"),
            policy,
            archive_dir=args.archive_dir,
            abandoned_consumers=args.abandon_consumer,
        )
    except (OSError, asyncpg.exceptions.PostgresConnectionError) as exc:
        raise StoreUnavailableError(f"cannot reach PostgreSQL: {exc}") from exc
    except asyncpg.PostgresError as exc:
        # e.g. run by a role that does not own the schema: retrying cannot help.
        raise FatalError(f"maintain failed: {exc}") from exc
    forgotten = report.forgotten
    if args.json:
        print(
            json.dumps(
                {
                    "created": report.created,
                    "archived": [
                        {"partition": a.partition, "rows": a.rows, "file": str(a.data_file)}
                        for a in report.archived
                    ],
                    "dropped": report.dropped,
                    "forgotten": None if forgotten is None else dataclasses.asdict(forgotten),
                    "default_partition_holds_rows": report.default_partition_holds_rows,
                }
            )
        )
    else:
        for name in report.created:
            print(f"created {PARTITION_SCHEMA}.{name}")
        for archived in report.archived:
            print(f"archived {archived.partition}: {archived.rows} rows to {archived.data_file}")
        for name in report.dropped:
            print(f"dropped {PARTITION_SCHEMA}.{name}")
        if forgotten is not None:
            print(
                f"forgot {forgotten.messages} messages ({forgotten.statuses} statuses, "
                f"{forgotten.events} events, {forgotten.closed_exceptions} resolved exceptions);"
                f" kept {forgotten.kept_for_open_exceptions} old ones an open exception refers to"
                f", {forgotten.kept_for_evidence} whose deliveries and"
                f" {forgotten.kept_for_changes} whose status changes are still stored"
            )
    if report.default_partition_holds_rows:
        held = ", ".join(f"{PARTITION_SCHEMA}.{name}" for name in report.defaults_holding_rows)
        print(
            f"dlrfeed: rows sit in {held} (a day had no partition when they came): "
            "see docs/retention.md"
        )
        return 1
    return 0
