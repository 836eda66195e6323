"""The SQL loader (dlrfeed.store.sql): named blocks, named parameters, fragments, tables."""

from __future__ import annotations

import re

import pytest

from dlrfeed.store import sql
from dlrfeed.store.sql import ParameterError, SqlFileError, parse


def _one(text: str, name: str = "q") -> sql.Query:
    return parse({"test.sql": text})[name]


def test_named_parameters_become_positions_in_order_of_first_appearance() -> None:
    q = _one("-- name: q\nSELECT :b, :a, :b\n")
    assert q.text == "SELECT $1, $2, $1"
    assert q.parameters == ("b", "a")
    assert q.bind(a=1, b=2) == (2, 1)


def test_casts_literals_quoted_names_and_comments_are_not_parameters() -> None:
    q = _one(
        "-- name: q\n"
        "SELECT :x::jsonb, y::text[], ':not_one', \"odd:name\", '{}'::int[]  -- :nor_this\n"
        "FROM t WHERE a = 'it''s :still_text' AND b = :y::bigint\n"
    )
    assert q.parameters == ("x", "y")
    assert "$1::jsonb, y::text[], ':not_one', \"odd:name\", '{}'::int[]  -- :nor_this" in q.text
    assert q.text.endswith("'it''s :still_text' AND b = $2::bigint")


def test_a_missing_parameter_raises_naming_it() -> None:
    q = _one("-- name: q\nSELECT :login, :ids\n")
    with pytest.raises(ParameterError, match="missing parameter 'ids'"):
        q.bind(login="acme")


def test_an_unknown_parameter_raises_naming_it() -> None:
    q = _one("-- name: q\nSELECT :login\n")
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['logn'\]"):
        q.bind(login="acme", logn="acme")


def test_a_duplicate_block_name_is_refused_within_a_file_and_across_files() -> None:
    with pytest.raises(SqlFileError, match="'q' already defined"):
        parse({"a.sql": "-- name: q\nSELECT 1\n-- name: q\nSELECT 2\n"})
    with pytest.raises(SqlFileError, match=r"'q' already defined in a\.sql"):
        parse({"a.sql": "-- name: q\nSELECT 1\n", "b.sql": "-- name: q\nSELECT 2\n"})


def test_the_leading_comment_of_a_block_is_documentation_and_not_sent() -> None:
    q = _one("-- name: q\n-- why: :because\n\nSELECT 1\n  -- kept: inside\nFROM t\n\n")
    assert q.text == "SELECT 1\n  -- kept: inside\nFROM t"
    assert q.parameters == ()


def test_an_empty_block_and_sql_outside_a_block_are_refused() -> None:
    with pytest.raises(SqlFileError, match="holds no statement"):
        parse({"a.sql": "-- name: q\n-- only a comment\n"})
    with pytest.raises(SqlFileError, match="before the first"):
        parse({"a.sql": "SELECT 1\n-- name: q\nSELECT 2\n"})


def test_a_fragment_is_spliced_where_included_and_is_no_statement() -> None:
    statements = parse(
        {
            "a.sql": "-- fragment: f\n-- why\n  x = :x\n"
            "-- name: q\nSELECT 1 WHERE\n-- include: f\nAND y = :y\n"
        }
    )
    assert set(statements) == {"q"}
    assert statements["q"].text == "SELECT 1 WHERE\n  x = $1\nAND y = $2"
    with pytest.raises(SqlFileError, match="unknown fragment 'g'"):
        parse({"a.sql": "-- name: q\nSELECT\n-- include: g\n"})


def test_a_fragment_may_include_another_but_never_itself() -> None:
    files = {
        "a.sql": "-- fragment: inner\n  x = :x\n-- fragment: outer\n  (\n-- include: inner\n  )\n"
        "-- name: q\nSELECT 1 WHERE\n-- include: outer\n"
    }
    assert parse(files)["q"].text == "SELECT 1 WHERE\n  (\n  x = $1\n  )"
    cycle = {
        "a.sql": "-- fragment: f\n-- include: g\n-- fragment: g\n-- include: f\n"
        "-- name: q\nSELECT\n-- include: f\n"
    }
    with pytest.raises(SqlFileError, match="includes itself"):
        parse(cycle)


def test_a_table_name_is_filled_in_quoted_and_must_be_given_first() -> None:
    q = _one("-- name: q\nSELECT count(*) FROM s.{partition} WHERE a = :a\n")
    assert q.identifiers == ("partition",)
    with pytest.raises(ParameterError, match="name the tables"):
        q.bind(a=1)
    named = q.naming(partition='day"; DROP TABLE x; --')
    assert named.text == 'SELECT count(*) FROM s."day""; DROP TABLE x; --" WHERE a = $1'
    assert named.bind(a=1) == (1,)
    with pytest.raises(ParameterError, match="needed"):
        q.naming(table="t")


def test_every_shipped_statement_loads_with_parameters_in_dollar_form_only() -> None:
    """The packaged .sql files parse (no duplicate names), and no statement still carries a
    named parameter or a hand-numbered one that the loader did not assign."""
    assert len(sql.STATEMENTS) > 40
    for name, q in sql.STATEMENTS.items():
        numbers = {int(n) for n in re.findall(r"\$(\d+)", q.text)}
        assert numbers == set(range(1, len(q.parameters) + 1)), name
        assert not re.search(r"\$\d", q.source), f"{name}: write :name, not $n"
