"""`dlrfeed migrate` and `dlrfeed record-submissions` through the real CLI (interfaces §3)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed_tools.bench import submissions_profile


def query(dsn: str, sql: str) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    return asyncio.run(fetch())


def test_record_submissions_from_json_lines_p5(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """P5/P3: JSON lines recorded, destination normalised with the raw kept; idempotent."""
    lines = [
        {"message_id": "s1", "destination": "+34 600 000 001", "dlr_level": 3},
        {"message_id": 2, "destination": "600000002", "login": "other", "route": "r1"},
        {"message_id": "s3", "destination": "0034600000003", "submitted_at": "2026-11-29T12:00Z"},
    ]
    source = tmp_path / "sent.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    argv = ["record-submissions", str(source), "--database-url", database_url, "--login", "acme"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {
        "recorded": 3,
        "already_recorded": 0,
        "late_correlated_events": 0,
    }
    rows = query(
        database_url,
        "SELECT login, message_id, destination, destination_raw, destination_is_e164,"
        " dlr_level, route, submitted_at IS NOT NULL AS dated"
        " FROM dlr.messages ORDER BY message_id",
    )
    assert [tuple(r) for r in rows] == [
        ("other", "2", "600000002", "600000002", False, None, "r1", False),
        ("acme", "s1", "+34600000001", "+34 600 000 001", True, 3, None, False),
        ("acme", "s3", "+34600000003", "0034600000003", True, None, None, True),
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["already_recorded"] == 3


def test_record_submissions_names_the_bad_line(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed line is a one-line error naming the line, exit non-zero."""
    source = tmp_path / "sent.jsonl"
    source.write_text('{"message_id": "ok", "destination": "+34600"}\n{"message_id": "x"}\n')
    argv = ["record-submissions", str(source), "--database-url", database_url, "--login", "acme"]
    assert main(argv) != 0
    assert "line 2" in capsys.readouterr().err


def test_migrate_command_is_idempotent(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dlrfeed migrate` on a current database applies nothing and says the version."""
    assert main(["migrate", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    assert "applied" not in out
    assert out.startswith("schema dlr at version ")


async def test_the_submissions_profile_times_each_statement_and_leaves_the_store_as_it_was(
    database_url: str, db: asyncpg.Connection
) -> None:
    report = await submissions_profile.profile(database_url, "acme", ids=600, late=10, settings={})
    assert "record_submissions of 600 ids" in report
    for statement in ("lock_correlation_ids", "insert_messages", "ids_with_waiting_events"):
        assert f"| {statement} | 2 |" in report  # two chunks of 500
    assert await db.fetchval("SELECT count(*) FROM dlr.messages") == 0  # rolled back
