"""The investigation queue as a work queue: resolve by filter (count first, `--yes` to act, one
transaction), and `--csv` on `exceptions` and `stats`, against a real store."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.store.reports import (
    ExceptionFilter,
    count_matching_exceptions,
    resolve_matching_exceptions,
)

# (kind, login, message id, hours since it was opened)
QUEUE = [
    ("uncorrelated", "acme", "u-old-1", 50),
    ("uncorrelated", "acme", "u-old-2", 30),
    ("uncorrelated", "acme", "u-new", 1),
    ("uncorrelated", "beta", "u-beta-old", 40),
    ("conflict", "acme", "c-old", 48),
    ("unrecognized", "acme", '=HYPERLINK("http://x")', 2),
]


async def _seed(database_url: str) -> None:
    """Open exceptions of several kinds, logins and ages (opening times set back in SQL)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.executemany(
            "INSERT INTO dlr.exceptions (kind, login, message_id, details, opened_at)"
            " VALUES ($1, $2, $3, $4, now() - make_interval(hours => $5))",
            [(k, login, m, json.dumps({"note": "seeded"}), h) for k, login, m, h in QUEUE],
        )
    finally:
        await conn.close()


@pytest.fixture
def queue(database_url: str) -> str:
    asyncio.run(_seed(database_url))
    return database_url


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _open_ids(database_url: str) -> set[str]:
    async def read() -> set[str]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT message_id FROM dlr.exceptions WHERE resolved_at IS NULL"
            )
        finally:
            await conn.close()
        return {r[0] for r in rows}

    return asyncio.run(read())


def test_resolve_by_filter_without_yes_shows_the_count_and_changes_nothing(
    queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _open_ids(queue)
    code, out, _ = _cli(
        capsys, "exceptions", "--database-url", queue, "--resolve",
        "--kind", "uncorrelated", "--login", "acme", "--older-than", "1d",
        "--note", "sender never recorded these",
    )  # fmt: skip
    assert code == 0
    first_line = out.splitlines()[0]
    assert first_line.startswith("2 open exception(s) match; nothing changed: add --yes")
    shown = {word for line in out.splitlines() for word in line.split()}
    assert {"u-old-1", "u-old-2"} <= shown
    assert not {"u-new", "u-beta-old", "c-old"} & shown
    assert _open_ids(queue) == before


def test_resolve_by_filter_with_yes_resolves_exactly_the_matches_with_the_note(
    queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "exceptions", "--database-url", queue, "--resolve", "--kind", "uncorrelated",
        "--older-than", "1d", "--note", "sender never recorded these",
    ]  # fmt: skip
    code, out, _ = _cli(capsys, *argv, "--json")
    preview = json.loads(out)
    assert code == 0
    assert preview["dry_run"] is True
    assert preview["matched"] == 3
    assert {(g["login"], g["exceptions"]) for g in preview["groups"]} == {("acme", 2), ("beta", 1)}

    code, out, _ = _cli(capsys, *argv, "--yes")
    assert code == 0
    assert (
        out.splitlines()[0]
        == "resolved 3 open exception(s) with note 'sender never recorded these'"
    )
    assert _open_ids(queue) == {"u-new", "c-old", '=HYPERLINK("http://x")'}

    async def resolutions() -> list[str]:
        conn = await asyncpg.connect(queue)
        try:
            rows = await conn.fetch(
                "SELECT resolution FROM dlr.exceptions WHERE resolved_at IS NOT NULL"
            )
        finally:
            await conn.close()
        return [r[0] for r in rows]

    assert asyncio.run(resolutions()) == ["sender never recorded these"] * 3
    # Done once: the same command again finds nothing open to resolve.
    code, out, _ = _cli(capsys, *argv)
    assert out.splitlines()[0] == "no open exception matches; nothing changed"
    code, out, _ = _cli(capsys, *argv, "--yes", "--json")
    assert json.loads(out)["resolved"] == 0


def test_resolve_by_filter_is_one_transaction(queue: str) -> None:
    """A failure in the middle resolves nothing: a trigger refuses the resolution of one of
    the matched rows, and every other match stays open as well."""

    async def scenario() -> tuple[int, int]:
        conn = await asyncpg.connect(queue)
        try:
            await conn.execute(
                """
                CREATE FUNCTION pg_temp.refuse_c_old() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.message_id = 'c-old' THEN RAISE EXCEPTION 'refused'; END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER refuse_c_old BEFORE UPDATE ON dlr.exceptions
                FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_c_old();
                """
            )
            where = ExceptionFilter(login="acme")
            matched = sum(g["exceptions"] for g in await count_matching_exceptions(conn, where))
            with pytest.raises(asyncpg.RaiseError):
                await resolve_matching_exceptions(conn, where, "all of acme")
            still = await conn.fetchval(
                "SELECT count(*) FROM dlr.exceptions WHERE login = 'acme' AND resolved_at IS NULL"
            )
        finally:
            await conn.close()
        return matched, still

    matched, still = asyncio.run(scenario())
    assert matched == 5
    assert still == 5


def test_resolve_by_filter_needs_a_filter_a_note_and_yes_on_the_command_line(
    queue: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _open_ids(queue)
    refusals = {
        "--resolve without an ID needs a filter": ["--resolve", "--note", "x", "--yes"],
        "--resolve needs --note": ["--resolve", "--kind", "conflict", "--yes"],
        "drop --all": ["--resolve", "--kind", "conflict", "--all", "--note", "x"],
        "--resolve ID resolves that one exception": [
            "--resolve",
            "1",
            "--kind",
            "conflict",
            "--note",
            "x",
        ],
        "--yes goes with --resolve": ["--kind", "conflict", "--yes"],
    }
    for expected, argv in refusals.items():
        code, _, err = _cli(capsys, "exceptions", "--database-url", queue, *argv)
        assert code == 78, argv
        assert err.count("\n") == 1, (argv, err)
        assert expected in err, (argv, err)
    # A confirmation from the environment would confirm every run in advance.
    monkeypatch.setenv("DLRFEED_YES", "1")
    code, _, err = _cli(
        capsys, "exceptions", "--database-url", queue, "--resolve", "--kind", "conflict",
        "--note", "x",
    )  # fmt: skip
    assert code == 78
    assert "--yes must be given on the command line" in err
    assert _open_ids(queue) == before


def test_exceptions_csv_is_one_table_with_formula_text_kept_as_text(
    queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "exceptions", "--database-url", queue, "--csv")
    assert code == 0
    assert out.endswith("\r\n")
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    assert len(rows) == len(QUEUE)
    assert list(rows[0]) == [
        "id", "kind", "login", "message_id", "opened_at", "resolved_at", "resolution",
        "event_id", "reception_id", "details",
    ]  # fmt: skip
    assert rows[0]["message_id"] == "u-old-1"  # oldest first
    assert json.loads(rows[0]["details"]) == {"note": "seeded"}
    assert rows[0]["resolved_at"] == ""
    # Hostile receipt text never becomes a spreadsheet formula.
    (formula,) = [r for r in rows if r["kind"] == "unrecognized"]
    assert formula["message_id"] == '\'=HYPERLINK("http://x")'

    # A preview under --csv: the matches as CSV on stdout, the count for the person on stderr.
    code, out, err = _cli(
        capsys, "exceptions", "--database-url", queue, "--csv", "--resolve",
        "--kind", "conflict", "--note", "x",
    )  # fmt: skip
    assert code == 0
    assert err.startswith("1 open exception(s) match")
    assert [r["message_id"] for r in csv.DictReader(io.StringIO(out, newline=""))] == ["c-old"]


def test_stats_csv_has_every_figure_of_the_json(
    queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "stats", "--database-url", queue, "--json")
    totals = json.loads(out)
    code, out, _ = _cli(capsys, "stats", "--database-url", queue, "--csv", "--login", "acme")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows[0] == ["login", "measure", "value"]
    figures = {measure: value for login, measure, value in rows[1:]}
    assert {login for login, _, _ in rows[1:]} == {"acme"}
    assert figures["exceptions.uncorrelated.open"] == "3"
    assert figures["exceptions.conflict.total"] == "1"
    assert figures["quality.verifications.recorded"] == "0"
    # Every leaf of the all-logins JSON document is a line of the all-logins CSV.
    code, out, _ = _cli(capsys, "stats", "--database-url", queue, "--csv")
    measures = [row[1] for row in csv.reader(io.StringIO(out, newline=""))][1:]

    def leaves(prefix: str, value: object) -> list[str]:
        if isinstance(value, dict):
            return [
                leaf for k, v in value.items() for leaf in leaves(f"{prefix}.{k}".lstrip("."), v)
            ]
        return [prefix]

    assert sorted(measures) == sorted(leaves("", {k: v for k, v in totals.items() if k != "login"}))
    assert "exceptions.uncorrelated.open" in measures
