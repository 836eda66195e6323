"""Create or upgrade the database schema `dlr` (idempotent; safe to run concurrently)."""

from __future__ import annotations

import argparse

import asyncpg
import asyncpg.exceptions

from dlrfeed.config import add_database_url, required
from dlrfeed.errors import FatalError, StoreUnavailableError
from dlrfeed.store.migrate import expected_version, migrate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`dlrfeed migrate` takes only the database URL (of the owner role, docs/security.md)."""
    add_database_url(parser, pooler=False)  # needs no session: runs through a pooler too


async def run(args: argparse.Namespace) -> int:
    """Apply the migrations still missing; print what was applied and the resulting version."""
    try:
        applied = await migrate(required(args, "database_url"))
    except (OSError, asyncpg.exceptions.PostgresConnectionError) as exc:
        raise StoreUnavailableError(f"cannot reach PostgreSQL: {exc}") from exc
    except asyncpg.PostgresError as exc:
        # e.g. a refused password or a missing privilege: retrying cannot help.
        raise FatalError(f"migration failed: {exc}") from exc
    for name in applied:
        print(f"applied {name}")
    print(f"schema dlr at version {expected_version()}")
    return 0
