"""What the PostgreSQL server behind a `--database-url` is: a pooler or not, writable or not,
and whether a commit waits for a synchronous standby (each check at start one line, exit 78).

The store's statements need no session of their own (transaction-scoped locks and settings
only; COPY runs inside the ingest transaction), so the one thing a transaction pooler such as
PgBouncer breaks is asyncpg's cache of *named* prepared statements: a later transaction may run
on a server connection that never saw the statement. Behind a pooler the cache is off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import asyncpg
import asyncpg.exceptions
import asyncpg.exceptions._base as asyncpg_base  # where InternalClientError lives

from dlrfeed.config import Pooler
from dlrfeed.errors import ConfigError
from dlrfeed.store.sql import query

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

# PgBouncer sends this SQLSTATE (protocol_violation) for every error of its own; PostgreSQL
# never answers a startup with it ("database does not exist" is 3D000, auth failures 28xxx).
_PGBOUNCER_SQLSTATE = "08P01"
_PGBOUNCER_ADMIN_DATABASE = "pgbouncer"
_PROBE_TIMEOUT_S = 10.0
# The settings under which a commit returns only once a synchronous standby has the WAL.
SYNCHRONOUS_COMMIT_LEVELS = ("on", "remote_write", "remote_apply")
# asyncpg's default cache size, kept for direct connections.
_STATEMENT_CACHE_SIZE = 100

_SERVER_FACTS = query("server_facts")
_SYNC_STANDBYS = query("synchronous_standbys")
WRITABLE = query("writable")


class _UnrecognisedServerError(Exception):
    """The probed server let us in but announced no server_version the driver can read."""


class _ProbeConnection(asyncpg.Connection):
    """The probe's connection: a server whose greeting the driver cannot read (it fails in
    the connection's constructor) is closed here at once, rather than left to the garbage
    collector as an open socket and a half-built connection."""

    def __init__(self, protocol: Any, transport: Any, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(protocol, transport, *args, **kwargs)
        except (ValueError, AttributeError) as exc:
            self._aborted = True  # what is_closed reads, so no unclosed-connection warning
            transport.abort()
            raise _UnrecognisedServerError(f"{type(exc).__name__}: {exc}") from exc


async def _answers_as_pgbouncer(dsn: str) -> bool:
    """True when the host of `dsn` is a PgBouncer: its admin console `pgbouncer` either lets
    us in or refuses us with PgBouncer's own SQLSTATE; PostgreSQL has no such database."""
    try:
        conn = await asyncpg.connect(
            dsn,
            database=_PGBOUNCER_ADMIN_DATABASE,
            statement_cache_size=0,
            timeout=_PROBE_TIMEOUT_S,
            connection_class=_ProbeConnection,
        )
    except asyncpg.exceptions.PostgresError as exc:
        return exc.sqlstate == _PGBOUNCER_SQLSTATE
    except (OSError, TimeoutError, asyncpg_base.InterfaceError, asyncpg_base.InternalClientError):
        return False  # unreachable: the real connection that follows reports it
    except _UnrecognisedServerError as exc:
        # A server that let us in but speaks neither as PgBouncer nor as PostgreSQL does: some
        # other pooler, which `auto` cannot judge.
        raise ConfigError(
            f"--database-pooler auto: the server at {_address(dsn)} answered the pooler probe "
            f"in a way neither PgBouncer nor PostgreSQL does ({exc}); "
            "say what it is with --database-pooler transaction or none"
        ) from exc
    await conn.close()
    return True


def _address(dsn: str) -> str:
    """host:port of `dsn` for a message (never its password); the URL's authority part."""
    authority = urlsplit(dsn).netloc.rpartition("@")[2]
    return authority or "the default host"


async def behind_transaction_pooler(dsn: str, pooler: Pooler) -> bool:
    """Whether statements to `dsn` must do without named prepared statements.

    `auto` probes for PgBouncer (one short extra connection; PostgreSQL logs the probe as a
    connection to a database that does not exist) and treats any PgBouncer as a transaction
    pooler: its pool mode is a server-side setting a client cannot read without admin rights.
    """
    if pooler is Pooler.AUTO:
        return await _answers_as_pgbouncer(dsn)
    return pooler is Pooler.TRANSACTION


def connect_options(through_pooler: bool) -> dict[str, Any]:
    """asyncpg connection arguments for a server reached directly or through a pooler."""
    return {"statement_cache_size": 0 if through_pooler else _STATEMENT_CACHE_SIZE}


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What `check_server` found (Store.server keeps it for the caller)."""

    synchronous_commit: str
    standby_names: str
    synchronous_standbys: int | None
    """Connected synchronous standbys; None when not asked (no --require-synchronous-commit)."""


async def check_server(
    conn: asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record],
    *,
    require_synchronous_commit: bool,
) -> ServerFacts:
    """ConfigError (one line, exit 78) unless the server behind `conn` can take writes and,
    when required, confirms that each commit waits for a synchronous standby.

    Confirmed means all three: `synchronous_commit` of this session is on, remote_write or
    remote_apply; `synchronous_standby_names` is not empty; and at least one standby is
    connected as synchronous (sync or quorum) in pg_stat_replication right now. Without the
    last, commits would wait for a standby that is not there, so the daemon would hang.
    """
    facts = cast("asyncpg.Record", await _SERVER_FACTS.fetchrow(conn))  # one row, always
    if facts["in_recovery"]:
        raise ConfigError(
            "the database server is a standby (in recovery, read-only): point --database-url at "
            "the primary, or list every host with target_session_attrs=read-write"
        )
    if facts["read_only"]:
        raise ConfigError(
            "the database server is read-only (default_transaction_read_only is on for this "
            "role or database): dlrfeed must write; use a writable primary"
        )
    synchronous: int | None = None
    if require_synchronous_commit:
        level, names = facts["synchronous_commit"], facts["standby_names"].strip()
        if level not in SYNCHRONOUS_COMMIT_LEVELS:
            raise ConfigError(
                f"--require-synchronous-commit: synchronous_commit is {level!r} for this role, "
                "so commits do not wait for a standby (need on, remote_write or remote_apply)"
            )
        if not names:
            raise ConfigError(
                "--require-synchronous-commit: synchronous_standby_names is empty on the "
                "primary, commits do not wait for any standby"
            )
        standbys = cast("asyncpg.Record", await _SYNC_STANDBYS.fetchrow(conn))
        if standbys["hidden"]:
            raise ConfigError(
                "--require-synchronous-commit: this role may not see pg_stat_replication; "
                "GRANT pg_read_all_stats TO it (docs/systemd.md)"
            )
        synchronous = int(standbys["synchronous"])
        if synchronous == 0:
            raise ConfigError(
                f"--require-synchronous-commit: no synchronous standby is connected "
                f"(synchronous_standby_names = {names!r}): commits would wait for none"
            )
    return ServerFacts(facts["synchronous_commit"], facts["standby_names"], synchronous)
