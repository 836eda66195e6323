"""Shared fixtures: one real throwaway PostgreSQL cluster per test session.

A template database is migrated once; every test that asks for `database_url` gets a fresh
database copied from it (`CREATE DATABASE ... TEMPLATE`), so tests never see each other's rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, settings

from dlrfeed_tools.pgcluster import PgCluster, scratch_directory, start_on_a_free_port

# Hypothesis profiles. `make test` ("default") draws the same examples on every run: derandomized
# (a seed from each test's name), no example database, so a commit always gets one verdict.
# `make fuzz` ("fuzz") explores at random, ten thousand examples a property by default, and
# keeps found failures in .hypothesis/ so the next `make fuzz` replays them first. Both print
# a failure's blob (@reproduce_failure) and, below, the case as an @example to paste.
_COMMON = settings(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "default", parent=_COMMON, max_examples=500, derandomize=True, database=None
)
settings.register_profile("fuzz", parent=_COMMON, max_examples=10_000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_FAILING_CASE = "Failing test case: "  # how hypothesis notes the case it shrank to


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    call: pytest.CallInfo[None],
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """For a failed hypothesis test, add the shrunk case as a ready-to-paste `@example(...)`
    to the report, so that the case found by `make fuzz` can be pinned in `make test`."""
    report: pytest.TestReport = yield
    error = call.excinfo.value if call.excinfo is not None else None
    errors = list(error.exceptions) if isinstance(error, BaseExceptionGroup) else [error]
    pasted = [
        "@example" + note[note.index("(") :]
        for each in errors
        for note in getattr(each, "__notes__", [])
        if note.startswith(_FAILING_CASE) and "(" in note
    ]
    if report.failed and pasted:
        report.sections.append(("to pin in make test, paste above the test", "\n".join(pasted)))
    return report


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    """Commands run in-process (`cli.main`) configure structlog to write to the sys.stderr of
    that moment, which is pytest's capture of that one test and is closed after it: without
    this, any later test that logs would write to a closed file, so a test's verdict would
    depend on which tests ran before it."""
    yield
    structlog.reset_defaults()


TEMPLATE_DB = "dlrfeed_template"
_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A real PostgreSQL server on a free loopback port for the whole session.

    Its directory is not under pytest's temporary root: every pytest that starts as the same
    user resets that root to 0700, which would cut the server's own user off from its files
    while it runs (it then fails, PANIC, mid-test)."""
    cluster = start_on_a_free_port(scratch_directory("pg"))
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
