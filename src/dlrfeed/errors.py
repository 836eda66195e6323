"""The project's own exception types; adapters translate driver errors into these.

Retry policies match only these types, never a driver's, so that what is retried is decided in
one place (STYLE: translate errors at the boundary).
"""

from __future__ import annotations


class DlrfeedError(Exception):
    """Base of every error dlrfeed raises on purpose."""

    exit_code: int = 1
    """The process exit status when this error ends a command (systemd units key on it)."""


class TransientError(DlrfeedError):
    """Worth retrying as is: a connection dropped, a server restarting, a timeout."""


class FatalError(DlrfeedError):
    """Retrying cannot help: bad configuration, bad credentials, a stale schema.

    The daemon exits non-zero with `str(error)` as its one-line reason.
    """


class BadDataError(DlrfeedError):
    """The input itself cannot be accepted as is; retrying the same input fails the same way."""


class StoreUnavailableError(TransientError):
    """PostgreSQL cannot take the transaction now: unreachable, the connection broke, or any
    transient SQLSTATE class (a lock or statement timeout, a deadlock, too many connections,
    a shutdown, a read-only server); nothing was committed."""


class FeedUnavailableError(TransientError):
    """The gateway could not be reached or answered UNAVAILABLE/DEADLINE_EXCEEDED."""


class ConfigError(FatalError):
    """A setting is missing or invalid."""

    exit_code = 78  # EX_CONFIG: systemd's RestartPreventExitStatus stops a restart loop


class AuthenticationError(FatalError):
    """The gateway refused our credentials (UNAUTHENTICATED or PERMISSION_DENIED)."""

    exit_code = 77  # EX_NOPERM


class SchemaOutOfDateError(FatalError):
    """The database schema is older than this code expects: run `dlrfeed migrate`."""

    exit_code = 78  # a configuration problem of the deployment, not worth restarting for
