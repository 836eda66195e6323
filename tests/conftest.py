"""Shared fixtures: one real throwaway PostgreSQL cluster per test session.

A template database is migrated once; every test that asks for `database_url` gets a fresh
database copied from it (`CREATE DATABASE ... TEMPLATE`), so tests never see each other's rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from pgcluster import PgCluster, free_port

# Hypothesis profiles: CI runs each property >= 500 examples (issue 3); `make fuzz` runs more.
settings.register_profile(
    "default",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fuzz",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TEMPLATE_DB = "dlrfeed_template"
_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    """A real PostgreSQL server on a free loopback port for the whole session."""
    cluster = PgCluster(tmp_path_factory.mktemp("pg"), free_port())
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def template_database(pg_cluster: PgCluster) -> str:
    """The template database, migrated once per session."""
    import asyncio

    from dlrfeed.store.migrate import migrate

    async def build() -> None:
        await migrate(await pg_cluster.create_database(TEMPLATE_DB))

    asyncio.run(build())
    return TEMPLATE_DB


@pytest.fixture
async def database_url(pg_cluster: PgCluster, template_database: str) -> AsyncIterator[str]:
    """A fresh, migrated database for one test."""
    name = f"t_{os.getpid()}_{next(_db_numbers)}"
    yield await pg_cluster.create_database(name, template=template_database)
    await pg_cluster.drop_database(name)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
