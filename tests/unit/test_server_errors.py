"""The store reads PostgreSQL's errors by SQLSTATE class (docs/postgresql.md, "Transient
errors: retried, never fatal"): every state the driver knows falls under one rule, and what is
transient is handed back as StoreUnavailableError, never as a driver error that would end a
process."""

from __future__ import annotations

import asyncpg
import asyncpg.exceptions._base as asyncpg_base
import pytest

from dlrfeed.errors import (
    BadDataError,
    ConfigError,
    FatalError,
    SchemaOutOfDateError,
    StoreUnavailableError,
)
from dlrfeed.store.server_errors import Verdict, describe, translated, verdict


def _every_server_error() -> list[type[asyncpg.PostgresError]]:
    found: list[type[asyncpg.PostgresError]] = []
    pending = [asyncpg.PostgresError]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls.__module__.startswith("asyncpg") and getattr(cls, "sqlstate", None):
            found.append(cls)
    return found


SERVER_ERRORS = _every_server_error()

# What the issue names, with the verdict each must get.
NAMED = [
    ("55P03", Verdict.TRANSIENT),  # lock_timeout
    ("57014", Verdict.TRANSIENT),  # statement_timeout, cancel
    ("40001", Verdict.TRANSIENT),  # serialization failure
    ("40P01", Verdict.TRANSIENT),  # deadlock
    ("53300", Verdict.TRANSIENT),  # too many connections
    ("53100", Verdict.TRANSIENT),  # disk full
    ("57P01", Verdict.TRANSIENT),  # admin shutdown
    ("57P02", Verdict.TRANSIENT),  # crash shutdown
    ("57P03", Verdict.TRANSIENT),  # cannot connect now
    ("08006", Verdict.TRANSIENT),  # connection failure
    ("08003", Verdict.TRANSIENT),  # connection does not exist
    ("25006", Verdict.TRANSIENT),  # read-only transaction (a standby, a failover)
    ("42501", Verdict.FATAL),  # insufficient privilege
    ("42P01", Verdict.FATAL),  # undefined table: the schema is behind
    ("28P01", Verdict.FATAL),  # bad password
    ("55000", Verdict.FATAL),  # a view cannot be written: the schema changed
    ("22021", Verdict.BAD_DATA),  # a byte sequence the encoding refuses
    ("23505", Verdict.BAD_DATA),  # unique violation
    ("54000", Verdict.BAD_DATA),  # an index row too large
]


def _error(state: str) -> asyncpg.PostgresError:
    cls = next(c for c in SERVER_ERRORS if c.sqlstate == state)
    return cls(f"the server said {state}")


@pytest.mark.parametrize(("state", "expected"), NAMED, ids=[s for s, _ in NAMED])
def test_each_named_condition_gets_its_verdict(state: str, expected: Verdict) -> None:
    assert verdict(_error(state)) is expected


def test_the_rule_is_the_sqlstate_class_for_every_state_the_driver_knows() -> None:
    assert len(SERVER_ERRORS) > 200
    for cls in SERVER_ERRORS:
        state = cls.sqlstate
        got = verdict(cls("x"))
        if cls is asyncpg.exceptions.InvalidCachedStatementError:
            assert got is Verdict.TRANSIENT, "a plan outdated by DDL is prepared again"
        elif state[:2] in {"08", "40", "53", "57"} or state in {
            "25006",
            "25P03",
            "25P04",
            "55P03",
            "55006",
        }:
            assert got is Verdict.TRANSIENT, state
        elif state[:2] in {"22", "23", "54"}:
            assert got is Verdict.BAD_DATA, state
        else:
            assert got is Verdict.FATAL, state


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        asyncpg_base.InterfaceError("connection is closed"),
        asyncpg_base.InternalClientError("cannot switch to state 15"),
    ],
    ids=type,
)
def test_a_lost_connection_is_transient(error: BaseException) -> None:
    assert verdict(error) is Verdict.TRANSIENT
    assert isinstance(translated(error, "the batch"), StoreUnavailableError)


def test_a_value_the_driver_cannot_encode_is_bad_data_not_a_lost_connection() -> None:
    assert verdict(asyncpg_base.DataError("invalid input for query argument")) is Verdict.BAD_DATA


def test_errors_that_are_not_the_databases_are_left_alone() -> None:
    assert verdict(KeyError("a bug")) is None
    assert translated(KeyError("a bug"), "the batch") is None
    assert translated(StoreUnavailableError("already ours"), "the batch") is None


def test_the_translation_is_the_projects_own_type_in_one_line() -> None:
    cases = {
        "55P03": StoreUnavailableError,
        "25006": StoreUnavailableError,
        "22021": BadDataError,
        "42501": ConfigError,
        "42P01": SchemaOutOfDateError,
        "XX000": FatalError,
    }
    for state, kind in cases.items():
        error = translated(_error(state), "the batch")
        assert type(error) is kind, state
        assert f"SQLSTATE {state}" in str(error)
        assert "\n" not in str(error)


def test_the_description_names_the_condition_that_started_it() -> None:
    """A backend terminated mid-statement surfaces from the rollback as "connection is
    closed"; the log names the server's 57P01 behind it."""
    server = asyncpg.exceptions.AdminShutdownError("terminating connection due to\nadmin command")
    outer = asyncpg_base.InterfaceError("the underlying connection is closed")
    outer.__context__ = asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation")
    outer.__context__.__cause__ = server
    assert verdict(outer) is Verdict.TRANSIENT
    assert describe(outer) == (
        "SQLSTATE 57P01 AdminShutdownError: terminating connection due to admin command"
    )
    assert describe(TimeoutError()) == "TimeoutError: no answer in time"


@pytest.mark.parametrize("state", ["25001", "25P01", "25P02"])
def test_a_transaction_misused_is_fatal_not_retried_for_ever(state: str) -> None:
    """Class 25 but for read-only and the timeouts is the program's fault: retrying repeats it."""
    assert verdict(_error(state)) is Verdict.FATAL
