"""How the store reads PostgreSQL's errors, by SQLSTATE class: which mean that the server cannot
take the transaction now (retry it whole later: nothing was committed), which that the input
cannot be stored (bisect it, C8), and which that retrying cannot help (configuration,
privileges, a schema that changed: stop with one line). `translated` turns a driver error into
the project's own (`dlrfeed.errors`); the store raises nothing else (STYLE: translate errors at
the boundary).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import asyncpg.exceptions._base as asyncpg_base  # the client-side errors live only here

from dlrfeed.errors import (
    BadDataError,
    ConfigError,
    DlrfeedError,
    FatalError,
    SchemaOutOfDateError,
    StoreUnavailableError,
)


class Verdict(enum.Enum):
    """What an error of the database or of its connection means for the transaction."""

    TRANSIENT = "transient"
    """Nothing was committed and the same transaction can succeed later: retry it whole."""
    BAD_DATA = "bad data"
    """This input cannot be stored; the same rows fail the same way (C8)."""
    FATAL = "fatal"
    """Retrying cannot help: a privilege, a setting or the schema must change first."""


# SQLSTATE classes whose every condition passes by itself: 08 connection exception, 40
# transaction rollback (40001 serialization failure, 40P01 deadlock), 53 insufficient resources
# (53300 too many connections, 53100 disk full, 53200 out of memory), 57 operator intervention
# (57014 statement timeout or cancel, 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot
# connect now).
TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57"})
# Conditions of other classes that pass: 25006 read-only (a standby, a failover under way,
# read-only mode) and 25P03/25P04 (an idle-session or transaction timeout) - the rest of class
# 25 is a transaction misused, a fault of the program that a retry would only repeat; 55P03
# lock_not_available (lock_timeout, NOWAIT) and 55006 object_in_use - the rest of class 55 is
# a schema matter (55000: a view cannot be written).
TRANSIENT_STATES = frozenset({"25006", "25P03", "25P04", "55P03", "55006"})
# 22 data exception, 23 integrity constraint violation, 54 program limit exceeded (an index row
# too large): the rows themselves.
BAD_DATA_CLASSES = frozenset({"22", "23", "54"})
# The server is gone or the connection broke before it could say why: the socket (OSError:
# refused, reset, unreachable), no answer within the command timeout, or the driver's own view
# of a closed connection. A backend killed under an idle pooled connection can leave the
# driver's protocol state confused ("cannot switch to state ..."): as good as lost too.
_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg_base.InterfaceError,
    asyncpg_base.InternalClientError,
)
# A value the driver cannot encode (client side, before the server sees it).
_CLIENT_BAD_DATA: tuple[type[BaseException], ...] = (
    asyncpg_base.DataError,
    UnicodeError,
    OverflowError,
)
# The statements name a table, column or function the database does not have, or write a
# relation that is not a table ("wrong object type", "cannot change view").
_SCHEMA_CHANGED_STATES = frozenset({"42P01", "42703", "42883", "42809", "0A000", "55000"})
_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    *_CONNECTION_LOST,
    *_CLIENT_BAD_DATA,
)


def verdict(exc: BaseException) -> Verdict | None:
    """What `exc` means for the transaction it ended; None when it is not an error of the
    database or of its connection (a fault of dlrfeed itself, raised as it is)."""
    if isinstance(exc, _CLIENT_BAD_DATA):  # before InterfaceError: the driver's DataError is one
        return Verdict.BAD_DATA
    if isinstance(exc, asyncpg.exceptions.InvalidCachedStatementError):
        # The driver's own 0A000: a prepared plan outdated by DDL; it is prepared again.
        return Verdict.TRANSIENT
    if isinstance(exc, asyncpg.PostgresError):
        state = str(exc.sqlstate or "")
        if state[:2] in TRANSIENT_CLASSES or state in TRANSIENT_STATES:
            return Verdict.TRANSIENT
        if state[:2] in BAD_DATA_CLASSES:
            return Verdict.BAD_DATA
        return Verdict.FATAL
    if isinstance(exc, _CONNECTION_LOST):
        return Verdict.TRANSIENT
    return None


def is_bad_data(exc: BaseException) -> bool:
    return verdict(exc) is Verdict.BAD_DATA


def rolled_back(exc: BaseException) -> bool:
    """SQLSTATE class 40 (serialization failure, deadlock): the server rolled the transaction
    back so that another could go on; running it again at once usually succeeds."""
    return isinstance(exc, asyncpg.exceptions.TransactionRollbackError)


def schema_changed(exc: BaseException) -> bool:
    """Whether `exc` says the schema changed under the statements (a table, column or function
    gone, a table become a view); not the driver's InvalidCachedStatementError."""
    return (
        isinstance(exc, asyncpg.PostgresError)
        and not isinstance(exc, asyncpg.exceptions.InvalidCachedStatementError)
        and exc.sqlstate in _SCHEMA_CHANGED_STATES
    )


def first_cause(exc: BaseException) -> BaseException:
    """The earliest driver error in `exc`'s chain: a backend terminated mid-statement surfaces
    as "the underlying connection is closed" from the rollback, caused by the server's 57P01."""
    found = exc
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _DRIVER_ERRORS):
            found = current
        current = current.__cause__ or current.__context__
    return found


def describe(exc: BaseException) -> str:
    """One line for a log or an error message: the SQLSTATE and error that started it."""
    cause = first_cause(exc)
    state = getattr(cause, "sqlstate", None)
    text = " ".join(str(cause).split()) or "no answer in time"
    name = type(cause).__name__
    return f"SQLSTATE {state} {name}: {text}" if state else f"{name}: {text}"


def translated(exc: BaseException, what: str) -> DlrfeedError | None:
    """The project's error for a driver error that refused `what` ("the batch"); None when
    `exc` is not a driver error (raise it as it is)."""
    kind = verdict(exc)
    if kind is None:
        return None
    if kind is Verdict.TRANSIENT:
        return StoreUnavailableError(f"PostgreSQL is unavailable for {what}: {describe(exc)}")
    if kind is Verdict.BAD_DATA:
        return BadDataError(f"PostgreSQL refused {what}: {describe(exc)}")
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return ConfigError(
            f"the database role may not write {what} ({describe(exc)}): connect as the writer "
            "role, see sql/roles.sql and docs/security.md"
        )
    if schema_changed(exc):
        # A migration ran while this dlrfeed was up: its statements no longer fit the tables.
        return SchemaOutOfDateError(
            f"the database schema changed under this dlrfeed ({describe(exc)}): stop it, run "
            "`dlrfeed migrate`, and start the dlrfeed that matches the schema"
        )
    return FatalError(f"PostgreSQL refused {what}: {describe(exc)}")


@contextmanager
def refusing(what: str) -> Iterator[None]:
    """Driver errors raised in the block, as the project's own (`translated`)."""
    try:
        yield
    except Exception as exc:
        error = translated(exc, what)
        if error is None:
            raise
        raise error from exc
