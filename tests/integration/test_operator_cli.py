"""The operator commands (interfaces §3) against a real store: human tables and stable JSON."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.domain.status import Outcome
from dlrfeed.feed.client import receipt_from_proto
from dlrfeed.store import Store, Submission, reports
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"


def wire(message_id: str, level: int, stat: str, done: str, count: int = 1) -> feed_pb2.Receipt:
    return feed_pb2.Receipt(
        id=message_id,
        level=level,
        stat=stat,
        err="000",
        submit_date="2611291200",
        done_date=done,
        ack_token=f"t-{message_id}-{level}-{count}",
        delivery_count=count,
    )


async def _populate(database_url: str) -> None:
    store = await Store.open(database_url, pool_size=1)
    try:
        submitted = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
        await store.record_submissions(
            [
                Submission(LOGIN, "m-1", "+34600000001", submitted_at=submitted, dlr_level=3),
                Submission(LOGIN, "m-2", "+34600000002", submitted_at=submitted, dlr_level=3),
            ]
        )
        receipts = [
            wire("m-1", 1, "ENROUTE", "2611291200"),
            wire("m-1", 2, "DELIVRD", "2611291201"),
            wire("m-1", 2, "DELIVRD", "2611291201", count=2),  # a repeat (C1)
            wire("m-2", 2, "DELIVRD", "2611291203"),
            wire("m-2", 2, "UNDELIV", "2611291204"),  # same key, other content: conflict (P14)
            wire("ghost", 2, "DELIVRD", "2611291205"),  # no such message: uncorrelated (P12)
        ]
        now = time.time()
        await store.ingest(
            LOGIN, [receipt_from_proto(r, r.SerializeToString(), now) for r in receipts]
        )
    finally:
        await store.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture
def populated(database_url: str) -> str:
    asyncio.run(_populate(database_url))
    return database_url


def test_show_tells_status_reason_basis_flags_and_history(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(capsys, "show", "m-1", "--database-url", populated)
    assert code == 0
    assert "status:    DELIVERED (final)" in out
    assert "not seen by a person (P2)" in out
    assert "repeated deliveries: 1" in out
    # P19/P20: every delivery listed, with our receive time beside the reported date.
    assert out.count("2611291201") >= 2
    assert "repeat" in out


def test_show_json_is_stable_and_complete(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(capsys, "show", "m-1", "--database-url", populated, "--json")
    assert code == 0
    document = json.loads(out)
    (report,) = document["reports"]
    assert report["status"]["status"] == "DELIVERED"
    assert report["status"]["is_final"] is True
    assert report["status"]["repeats"] == 1
    assert [e["level"] for e in report["events"]] == [1, 2]
    assert len(report["receptions"]) == 3
    assert {r["delivery_count"] for r in report["receptions"]} == {1, 2}
    assert report["message"]["destination"] == "+34600000001"


def test_show_uncorrelated_id_has_no_status_and_an_open_exception(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(capsys, "show", "ghost", "--database-url", populated, "--json")
    assert code == 0
    (report,) = json.loads(out)["reports"]
    assert report["message"] is None
    assert report["status"] is None  # P12: no status materialised
    assert [x["kind"] for x in report["exceptions"]] == ["uncorrelated"]


def test_show_without_login_finds_the_id_at_every_login(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gateway ids are unique per login only (P10): `show` without --login reports each login
    that has the id, `--login` one of them."""

    async def second_login() -> None:
        store = await Store.open(populated, pool_size=1)
        try:
            await store.record_submissions([Submission("globex", "m-1", "+34600000009")])
            receipt = wire("m-1", 2, "UNDELIV", "2611291209")
            await store.ingest(
                "globex", [receipt_from_proto(receipt, receipt.SerializeToString(), time.time())]
            )
        finally:
            await store.close()

    asyncio.run(second_login())
    code, out = _cli(capsys, "show", "m-1", "--database-url", populated, "--json")
    assert code == 0
    reports = {r["login"]: r for r in json.loads(out)["reports"]}
    assert sorted(reports) == ["acme", "globex"]
    assert reports["globex"]["status"]["status"] == "UNDELIVERABLE"
    assert len(reports["globex"]["receptions"]) == 1
    assert len(reports["acme"]["receptions"]) == 3
    code, out = _cli(
        capsys, "show", "m-1", "--login", "globex", "--database-url", populated, "--json"
    )
    assert [r["login"] for r in json.loads(out)["reports"]] == ["globex"]


def test_show_finds_an_id_known_only_as_an_unstorable_receipt_c8(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A receipt the database refused leaves no event, only its exception with the raw bytes:
    `show` must still tell it, with or without --login."""

    async def poison() -> None:
        store = await Store.open(database_url, pool_size=1)
        try:
            bad = wire("bad", 2, "DELIVRD", "2611291200")
            refused = receipt_from_proto(bad, bad.SerializeToString(), time.time())
            # A lone surrogate cannot be stored as UTF-8 text: C8 keeps it as `unstorable`.
            result = await store.ingest(LOGIN, [refused._replace(err="\ud800")])
            assert result.counts == {Outcome.UNSTORABLE: 1}
        finally:
            await store.close()

    asyncio.run(poison())
    for login in ((), ("--login", LOGIN)):
        code, out = _cli(capsys, "show", "bad", *login, "--database-url", database_url, "--json")
        assert code == 0
        (report,) = json.loads(out)["reports"]
        assert report["events"] == []
        assert [x["kind"] for x in report["exceptions"]] == ["unstorable"]


def test_show_reads_only_through_indexes(database_url: str) -> None:
    """`show` must stay quick on a store of millions of receipts: with sequential scans
    disabled, no query it runs plans one (receptions, the largest table, has one index)."""

    async def plans() -> dict[str, str]:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("SET enable_seqscan = off")
            queries = {
                "logins": (reports._LOGINS.text, ()),
                "messages": (reports._MESSAGES.text, (["acme"], "m-1")),
                "status": (reports._STATUS.text, ("acme", "m-1")),
                "events": (reports._EVENTS.text, (["acme"], "m-1")),
                "receptions": (reports._RECEPTIONS.text, ([1],)),
                "exceptions": (reports._MESSAGE_EXCEPTIONS.text, (["acme"], "m-1", [1])),
            }
            found = {}
            for name, (query, arguments) in queries.items():
                statement = await conn.prepare("EXPLAIN " + query)
                found[name] = "\n".join(r[0] for r in await statement.fetch(*arguments))
            return found
        finally:
            await conn.close()

    for name, plan in asyncio.run(plans()).items():
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"


def test_show_unknown_id_exits_1(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(capsys, "show", "never-seen", "--database-url", populated)
    assert code == 1
    assert "nothing known" in out


def test_exceptions_filter_and_resolve(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(capsys, "exceptions", "--database-url", populated, "--json")
    assert code == 0
    kinds = sorted(x["kind"] for x in json.loads(out)["exceptions"])
    assert kinds == ["conflict", "uncorrelated"]

    code, out = _cli(
        capsys, "exceptions", "--database-url", populated, "--kind", "conflict", "--json"
    )
    (conflict,) = json.loads(out)["exceptions"]
    code, out = _cli(
        capsys,
        "exceptions",
        "--database-url",
        populated,
        "--resolve",
        str(conflict["id"]),
        "--note",
        "carrier confirmed UNDELIV was a retry artefact",
    )
    assert code == 0
    assert "resolved" in out
    code, out = _cli(capsys, "exceptions", "--database-url", populated, "--kind", "conflict")
    assert "(none)" in out
    code, out = _cli(capsys, "exceptions", "--database-url", populated, "--all", "--json")
    resolved = [x for x in json.loads(out)["exceptions"] if x["resolved_at"]]
    assert [x["resolution"] for x in resolved] == ["carrier confirmed UNDELIV was a retry artefact"]
    # An exception that is no longer open cannot be resolved twice.
    code, _ = _cli(
        capsys,
        "exceptions",
        "--database-url",
        populated,
        "--resolve",
        str(conflict["id"]),
        "--note",
        "again",
    )
    assert code == 1


def test_exceptions_age_filter(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _cli(capsys, "exceptions", "--database-url", populated, "--older-than", "1h", "--json")
    assert json.loads(out)["exceptions"] == []
    _, out = _cli(capsys, "exceptions", "--database-url", populated, "--newer-than", "1h", "--json")
    assert len(json.loads(out)["exceptions"]) == 2


def test_resolve_without_note_is_a_one_line_config_error(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["exceptions", "--database-url", populated, "--resolve", "1"]) == 78
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "--note" in err


def test_stats_counts_and_c6_distinction(
    populated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(capsys, "stats", "--database-url", populated, "--json")
    assert code == 0
    totals = json.loads(out)
    assert totals["submitted"]["recorded"] == 2
    assert totals["reported_by_network"]["final"] == {"DELIVERED": 2}
    # C6: verification is the sender's own evidence, never inferred from the DLRs.
    assert totals["quality"]["verifications"] == {"recorded": 0, "waiting_for_message": 0}
    assert totals["receptions"]["total"] == 6
    assert totals["repeats"]["deliveries"] == 1
    assert totals["conflicts"]["open"] == 1
    assert totals["uncorrelated"]["receptions"] == 1
    assert totals["dlr_latency_seconds"]["samples"] == 2
    assert totals["dlr_latency_seconds"]["p50"] == pytest.approx(120.0)

    code, out = _cli(capsys, "stats", "--database-url", populated)
    assert "accepted at submit" in out
    assert "status reported by the network" in out
    assert "independent verification (recorded by the sender, C6): 0 verifications" in out


def test_missing_database_url_names_flag_and_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats"]) == 78
    assert "DLRFEED_DATABASE_URL" in capsys.readouterr().err
