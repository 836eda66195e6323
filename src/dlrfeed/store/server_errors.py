"""How the store reads PostgreSQL's errors: which mean the input cannot be stored, which that
the server is gone for now, which that the schema changed under this dlrfeed. Store.ingest
and Store.record_submissions act on each class differently (bisect, retry later, stop)."""

from __future__ import annotations

import asyncpg
import asyncpg.exceptions._base as asyncpg_base  # the client-side DataError lives only here

# Errors that mean "this input cannot be stored" (C8): retrying the same rows fails the same way.
DATA_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,  # SQLSTATE class 22
    asyncpg.exceptions.IntegrityConstraintViolationError,  # class 23
    asyncpg.exceptions.ProgramLimitExceededError,  # class 54 (e.g. an index row too large)
    asyncpg_base.DataError,  # client side: a value the driver cannot encode
    UnicodeError,
    OverflowError,
)
# Errors that mean "the server or the connection is gone"; nothing was committed.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg_base.InterfaceError,
    # A backend killed under an idle pooled connection can leave the client's protocol state
    # confused ("cannot switch to state ..."); the connection is as good as lost.
    asyncpg_base.InternalClientError,
    OSError,
    TimeoutError,
)
# Server states that pass: a read-only server (a standby before failover completes, class 25)
# or deadlocks still failing after every retry (class 40). The batch is retried whole later.
PASSING_SERVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidTransactionStateError,
    asyncpg.exceptions.TransactionRollbackError,
)
# The statements name a table, column or function the database no longer has, or write a
# table that has become a view (0019: dlr.message_status, 0020: a view of two tables, 0021:
# dlr.receptions, which a COPY cannot fill: "wrong object type"). Each class also holds errors
# that say nothing of the schema: see `schema_changed`.
SCHEMA_CHANGED_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.WrongObjectTypeError,
    asyncpg.exceptions.UndefinedColumnError,
    asyncpg.exceptions.UndefinedFunctionError,
    asyncpg.exceptions.FeatureNotSupportedError,
    asyncpg.exceptions.ObjectNotInPrerequisiteStateError,
)
# "cannot insert into view": the one state of class 55 that is a schema, not a lock (55P03) or
# an object in use (55006).
_VIEW_NOT_WRITABLE = "55000"


def schema_changed(exc: BaseException) -> bool:
    """Whether `exc`, one of SCHEMA_CHANGED_ERRORS, says the schema changed under the
    statements: not the driver's own InvalidCachedStatementError (0A000, a plan to make
    again), nor a class-55 state other than a view that cannot be written."""
    if isinstance(exc, asyncpg.exceptions.InvalidCachedStatementError):
        return False
    if isinstance(exc, asyncpg.exceptions.ObjectNotInPrerequisiteStateError):
        return getattr(exc, "sqlstate", None) == _VIEW_NOT_WRITABLE
    return isinstance(exc, SCHEMA_CHANGED_ERRORS)
