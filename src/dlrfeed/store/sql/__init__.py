"""Every SQL statement of dlrfeed, as named blocks of the `.sql` files beside this module.

A block is a `-- name: <name>` line, comment lines that say why the statement is written as it
is, then the statement (procrastinate's `queries.sql` layout). Named parameters (`:login`) are
turned at import into asyncpg's `$1 … $n`; a call binds by name (`await query.fetch(conn,
login=…)`), and a missing or unknown name raises ParameterError before anything reaches the
server. Casts, literals, quoted identifiers and comments are never taken for parameters (an
array slice is written `a[1 : n]`, spaced).

What cannot be a bind parameter is composed without templating values into SQL: a fragment
shared word for word by several statements is a `-- fragment: <name>` block, spliced where a
statement has a line `-- include: <name>` (a fragment may include another); a table known
only at run time (a day partition) is written `{partition}` and filled by
`query.naming(partition=…)`, quoted as an identifier. Every statement is PREPAREd against a
migrated database by the integration tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    Connection = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]


class ParameterError(TypeError):
    """A statement was bound with a missing or an unknown parameter (a programming error)."""


class SqlFileError(ValueError):
    """The `.sql` files do not parse: a duplicate, empty or unknown block name."""


# One alternation, scanned left to right: what may contain a colon or braces without meaning a
# parameter (literals, quoted identifiers, comments, casts) is matched first and kept as it is.
_TOKEN = re.compile(
    r"""
    (?P<literal>'(?:[^']|'')*')
    | (?P<quoted>"(?:[^"]|"")*")
    | (?P<comment>--[^\n]*)
    | (?P<cast>::)
    | :(?P<parameter>[A-Za-z_][A-Za-z0-9_]*)
    | \{(?P<identifier>[a-z_]+)\}
    """,
    re.VERBOSE,
)
_BLOCK = re.compile(r"^--\s*(?P<kind>name|fragment):\s*(?P<name>\S+)\s*$")
_INCLUDE = re.compile(r"^\s*--\s*include:\s*(?P<name>\S+)\s*$")


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement: its text with `$n` positions, and the parameter names in order."""

    name: str
    text: str
    parameters: tuple[str, ...]
    identifiers: tuple[str, ...] = ()
    """Run-time table names (`{partition}`) still to fill with `naming` before it can run."""
    source: str = ""
    """The statement as written, with its named parameters (for a psql script)."""

    def bind(self, **values: Any) -> tuple[Any, ...]:
        """The positional arguments of the statement for `values`, given by parameter name.

        ParameterError when a parameter is missing, a name is not one of the statement's, or a
        run-time table name has not been filled in (`naming`).
        """
        if self.identifiers:
            raise ParameterError(f"{self.name}: name the tables {self.identifiers} first")
        try:
            arguments = tuple([values[name] for name in self.parameters])
        except KeyError as missing:
            raise ParameterError(f"{self.name}: missing parameter {missing.args[0]!r}") from None
        if len(values) != len(arguments):
            unknown = sorted(set(values) - set(self.parameters))
            raise ParameterError(f"{self.name}: unknown parameter(s) {unknown}")
        return arguments

    def naming(self, **tables: str) -> Query:
        """The statement with its run-time table names filled in, each quoted as an
        identifier (so a name can never become SQL); every `{name}` must be given, no other."""
        if set(tables) != set(self.identifiers):
            raise ParameterError(
                f"{self.name}: tables {sorted(tables)} given, {sorted(self.identifiers)} needed"
            )
        text = self.text
        for name, table in tables.items():
            text = text.replace("{" + name + "}", _quote_identifier(table))
        return Query(self.name, text, self.parameters, (), self.source)

    async def fetch(self, conn: Connection, **values: Any) -> list[asyncpg.Record]:
        """Every row of the statement on `conn`, bound by name."""
        return await conn.fetch(self.text, *self.bind(**values))

    async def fetchrow(self, conn: Connection, **values: Any) -> asyncpg.Record | None:
        """The first row of the statement on `conn` (None: no row), bound by name."""
        return await conn.fetchrow(self.text, *self.bind(**values))

    async def fetchval(self, conn: Connection, **values: Any) -> Any:
        """The first column of the first row of the statement on `conn`, bound by name."""
        return await conn.fetchval(self.text, *self.bind(**values))

    async def execute(self, conn: Connection, **values: Any) -> str:
        """Run the statement on `conn`, bound by name; returns the server's status line."""
        return await conn.execute(self.text, *self.bind(**values))


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _compile(name: str, source: str) -> Query:
    """`source` with its named parameters as `$n` (in order of first appearance)."""
    positions: dict[str, int] = {}
    identifiers: list[str] = []

    def replace(match: re.Match[str]) -> str:
        parameter = match.group("parameter")
        if parameter is not None:
            return f"${positions.setdefault(parameter, len(positions) + 1)}"
        identifier = match.group("identifier")
        if identifier is not None and identifier not in identifiers:
            identifiers.append(identifier)
        return match.group(0)

    text = _TOKEN.sub(replace, source)
    return Query(name, text, tuple(positions), tuple(identifiers), source)


def parse(files: Mapping[str, str]) -> dict[str, Query]:
    """The statements of `files` (file name → text) by name, fragments spliced in.

    SqlFileError when a name is used twice (in one file or across files), a block is empty, or
    an include names no fragment. A block's leading comment lines (its why) are not sent.
    """
    blocks: dict[str, tuple[str, str, list[str]]] = {}  # name → (kind, file, lines)
    for file_name, text in sorted(files.items()):
        current: list[str] | None = None
        for line in text.splitlines():
            header = _BLOCK.match(line)
            if header is not None:
                name = header.group("name")
                if name in blocks:
                    raise SqlFileError(
                        f"{file_name}: block {name!r} already defined in {blocks[name][1]}"
                    )
                current = []
                blocks[name] = (header.group("kind"), file_name, current)
            elif current is not None:
                current.append(line)
            elif line.strip() and not line.lstrip().startswith("--"):
                raise SqlFileError(f"{file_name}: SQL before the first `-- name:` block")
    fragments = {
        name: _statement_lines(name, lines)
        for name, (kind, _, lines) in blocks.items()
        if kind == "fragment"
    }
    return {
        name: _compile(name, "\n".join(_spliced(name, _statement_lines(name, lines), fragments)))
        for name, (kind, _, lines) in blocks.items()
        if kind == "name"
    }


def _statement_lines(name: str, lines: list[str]) -> list[str]:
    """A block's lines without its leading comments and surrounding blank lines."""
    start = 0
    while start < len(lines) and (
        not lines[start].strip()
        or (lines[start].lstrip().startswith("--") and not _INCLUDE.match(lines[start]))
    ):
        start += 1
    body = lines[start:]
    while body and not body[-1].strip():
        body.pop()
    if not body:
        raise SqlFileError(f"block {name!r} holds no statement")
    return body


def _spliced(
    name: str,
    lines: Iterable[str],
    fragments: Mapping[str, list[str]],
    within: tuple[str, ...] = (),
) -> list[str]:
    """`lines` with every include replaced by its fragment, itself spliced (a fragment may
    include another; `within`: the fragments being spliced, so that a cycle is refused)."""
    spliced: list[str] = []
    for line in lines:
        include = _INCLUDE.match(line)
        if include is None:
            spliced.append(line)
            continue
        fragment = include.group("name")
        if fragment not in fragments:
            raise SqlFileError(f"{name}: includes unknown fragment {fragment!r}")
        if fragment in within:
            raise SqlFileError(f"{name}: fragment {fragment!r} includes itself")
        spliced += _spliced(name, fragments[fragment], fragments, (*within, fragment))
    return spliced


def _packaged_files() -> dict[str, str]:
    return {
        entry.name: entry.read_text("utf-8")
        for entry in resources.files(__name__).iterdir()
        if entry.name.endswith(".sql")
    }


STATEMENTS: Mapping[str, Query] = parse(_packaged_files())
"""Every statement shipped with dlrfeed, by name."""


def query(name: str) -> Query:
    """The statement called `name` (KeyError at import time for a name no file defines)."""
    return STATEMENTS[name]
