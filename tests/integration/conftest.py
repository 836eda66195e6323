"""Fixtures the integration tests share: a store and a plain connection on the test's database.

Both open on `database_url` (tests/conftest.py: a fresh migrated database per test) and close
when the test ends, whatever its outcome.
"""

from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrfeed.store import Store


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """A `Store` with a small pool on the test's database."""
    opened = await Store.open(database_url, pool_size=2)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection to the test's database, for reading what the store wrote."""
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()
