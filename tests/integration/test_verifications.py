"""Independent verification and route quality (C6) against a real store, through the CLI.

A verification is the sender's own evidence; it never changes a computed status (P2), it waits
for a message recorded after it, and `dlrfeed quality` keeps the three facts apart per route,
country and err, flagging the route whose DELIVRDs no verification backs.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dlrfeed.cli import main
from dlrfeed.domain.receipt import Receipt
from dlrfeed.feed.client import receipt_from_proto
from dlrfeed.store import Store, Submission, Verification
from fakegw.traffic import LYING_ROUTE, TrafficMix, scenario
from fakegw.wire import normalize_fields
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"
NOW = datetime.now(UTC).replace(microsecond=0)
SENT = NOW - timedelta(hours=1)
MIN = "--min-messages=50"


def _date(moment: datetime) -> str:
    return moment.strftime("%y%m%d%H%M%S")


def _receipt(message_id: str, stat: str, err: str, done: datetime) -> Any:
    wire = feed_pb2.Receipt(
        id=message_id,
        level=2,
        stat=stat,
        err=err,
        submit_date=_date(SENT),
        done_date=_date(done),
        ack_token=f"t-{message_id}",
        delivery_count=1,
    )
    return receipt_from_proto(wire, wire.SerializeToString(), time.time())


def _verification(message_id: str, kind: str = "otp_confirmed") -> Verification:
    return Verification(LOGIN, message_id, kind, SENT + timedelta(seconds=40), source="app")


async def _traffic(dsn: str) -> None:
    """An honest route (its DELIVRDs mostly verified, latencies scattered), a grey route that
    writes DELIVRD at submit time and never verifies, a marketing sender that never verifies
    (not verifiable traffic), failures to GB, and messages left pending for three days."""
    submissions: list[Submission] = []
    receipts: list[Any] = []
    verifications: list[Verification] = []
    for n in range(120):
        honest, grey = f"h{n}", f"g{n}"
        submissions.append(
            Submission(
                LOGIN, honest, f"+3461{n:07d}", source="ACME", submitted_at=SENT, route="honest"
            )
        )
        submissions.append(
            Submission(LOGIN, grey, f"+3462{n:07d}", source="ACME", submitted_at=SENT, route="grey")
        )
        receipts.append(_receipt(honest, "DELIVRD", "000", SENT + timedelta(seconds=5 + n % 21)))
        receipts.append(_receipt(grey, "DELIVRD", "000", SENT))
        if n < 100:
            verifications.append(_verification(honest))
    for n in range(30):
        submissions.append(
            Submission(
                LOGIN, f"news{n}", f"+3463{n:07d}", source="NEWS", submitted_at=SENT, route="honest"
            )
        )
        receipts.append(_receipt(f"news{n}", "DELIVRD", "000", SENT + timedelta(seconds=9)))
    for n in range(5):
        submissions.append(
            Submission(
                LOGIN,
                f"uk{n}",
                f"+44790000000{n}",
                source="ACME",
                submitted_at=SENT,
                route="honest",
            )
        )
        receipts.append(_receipt(f"uk{n}", "UNDELIV", "001", SENT + timedelta(seconds=30)))
    verifications += [_verification("uk0", "reply"), _verification("uk1", "click")]
    three_days_ago = NOW - timedelta(days=3)
    submissions += [
        Submission(
            LOGIN,
            f"p{n}",
            f"+3464{n:07d}",
            source="ACME",
            submitted_at=three_days_ago,
            route="honest",
        )
        for n in range(3)
    ]
    store = await Store.open(dsn, pool_size=1)
    try:
        await store.record_submissions(submissions)
        await store.ingest(LOGIN, receipts)
        result = await store.record_verifications(verifications)
        assert (result.recorded, result.waiting) == (102, 0)
    finally:
        await store.close()


@pytest.fixture
def traffic(database_url: str) -> str:
    asyncio.run(_traffic(database_url))
    return database_url


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def _quality(capsys: pytest.CaptureFixture[str], dsn: str, *argv: str) -> dict[Any, Any]:
    code, out = _cli(capsys, "quality", "--database-url", dsn, "--json", MIN, *argv)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    key = next(k for k in ("route", "country", "err") if k in lines[0])
    return {line[key]: line for line in lines}


def _fetch(dsn: str, sql: str) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    return asyncio.run(fetch())


def test_quality_by_route_keeps_the_three_facts_apart_and_names_the_lying_route(
    traffic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = _quality(capsys, traffic, "--by", "route")
    assert set(routes) == {"honest", "grey"}
    honest, grey = routes["honest"], routes["grey"]
    assert {
        k: honest[k]
        for k in (
            "accepted",
            "delivered",
            "failed",
            "pending",
            "verified",
            "verified_without_delivered",
            "delivered_without_verification",
            "verifiable",
        )
    } == {
        "accepted": 158,
        "delivered": 150,
        "failed": 5,
        "pending": 3,
        "verified": 102,
        "verified_without_delivered": 2,
        # NEWS never verifies: its 30 DELIVRDs are not counted as unverified (docs/quality.md).
        "delivered_without_verification": 20,
        "verifiable": 128,
    }
    assert honest["final_by_status"] == {"DELIVERED": 150, "UNDELIVERABLE": 5}
    assert honest["suspicious"] is False
    assert honest["signals"] == []
    # 12 s exactly (5-25 s, NEWS at 9 s, GB at 30 s), read from its bucket (docs/quality.md).
    assert 12.0 / 10**0.1 <= honest["latency_submit_to_done_s"]["p50"] <= 12.0 * 10**0.1
    assert grey["delivered"] == grey["delivered_without_verification"] == 120
    assert grey["verified"] == 0
    assert grey["suspicious"] is True
    assert grey["signals"] == [
        "delivered_above_verified",
        "done_at_submit",
        "uniform_latency",
        "delivered_never_verified",
    ]
    assert grey["silent_countries"] == ["ES"]
    assert grey["latency_submit_to_done_s"]["p99"] == 0.0


def test_quality_by_country_and_by_err(traffic: str, capsys: pytest.CaptureFixture[str]) -> None:
    countries = _quality(capsys, traffic, "--by", "country")
    assert {c: g["accepted"] for c, g in countries.items()} == {"ES": 273, "GB": 5}
    assert countries["GB"]["verified_without_delivered"] == 2
    assert countries["ES"]["signals"] == ["delivered_above_verified"]  # the grey half of it
    errs = _quality(capsys, traffic, "--by", "err")
    assert {e: g["accepted"] for e, g in errs.items()} == {"000": 270, "001": 5, None: 3}
    assert errs[None]["pending"] == 3


def test_quality_thresholds_are_options_and_since_bounds_the_window(
    traffic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = _quality(capsys, traffic, "--min-messages=1000")
    assert not any(g["suspicious"] for g in routes.values())
    recent = _quality(capsys, traffic, "--since", "2h")
    assert recent["honest"]["accepted"] == 155  # the pending three were sent 3 days ago
    since = (NOW - timedelta(days=4)).date().isoformat()
    assert _quality(capsys, traffic, "--since", since)["honest"]["accepted"] == 158


def test_quality_csv_and_text(traffic: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(capsys, "quality", "--database-url", traffic, "--csv", MIN)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    by_route = {r["route"]: r for r in rows}
    assert by_route["grey"]["suspicious"] == "true"
    assert by_route["grey"]["signals"].split() == [
        "delivered_above_verified",
        "done_at_submit",
        "uniform_latency",
        "delivered_never_verified",
    ]
    assert by_route["honest"]["verified"] == "102"
    code, out = _cli(capsys, "quality", "--database-url", traffic, MIN)
    assert "verified by the sender (C6)" in out
    assert "done_at_submit" in out


def test_a_verification_never_changes_a_status_p2(
    traffic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    statuses = "SELECT login, message_id, status, is_final, reason FROM dlr.message_status"
    before = sorted(tuple(r) for r in _fetch(traffic, statuses))
    changes = "SELECT count(*) FROM dlr.status_changes"
    changes_before = _fetch(traffic, changes)[0][0]
    lines = [
        {"message_id": f"uk{n}", "kind": "otp_confirmed", "verified_at": NOW.isoformat()}
        for n in range(5)
    ] + [{"message_id": "p0", "kind": "reply", "verified_at": 1.7e9}]
    payload = "".join(json.dumps(line) + "\n" for line in lines)
    code, out = _run_stdin(
        capsys, payload, "record-verifications", "-", "--database-url", traffic, "--login", LOGIN
    )
    assert code == 0
    assert json.loads(out) == {"recorded": 6, "already_recorded": 0, "waiting_for_message": 0}
    assert sorted(tuple(r) for r in _fetch(traffic, statuses)) == before
    assert _fetch(traffic, changes)[0][0] == changes_before
    # The same file again is the same verifications: nothing new.
    code, out = _run_stdin(
        capsys, payload, "record-verifications", "-", "--database-url", traffic, "--login", LOGIN
    )
    assert json.loads(out) == {"recorded": 0, "already_recorded": 6, "waiting_for_message": 0}


def _run_stdin(capsys: pytest.CaptureFixture[str], payload: str, *argv: str) -> tuple[int, str]:
    previous = sys.stdin
    sys.stdin = io.StringIO(payload)
    try:
        return _cli(capsys, *argv)
    finally:
        sys.stdin = previous


def test_a_verification_before_its_message_waits_for_it(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "verified.jsonl"
    source.write_text(
        json.dumps(
            {
                "message_id": 77,
                "login": LOGIN,
                "kind": "otp_confirmed",
                "verified_at": NOW.isoformat(),
                "source": "app",
            }
        )
        + "\n"
    )
    code, out = _cli(capsys, "record-verifications", str(source), "--database-url", database_url)
    assert code == 0
    assert json.loads(out)["waiting_for_message"] == 1
    code, out = _cli(capsys, "stats", "--database-url", database_url, "--json")
    assert json.loads(out)["quality"]["verifications"] == {"recorded": 1, "waiting_for_message": 1}
    code, out = _cli(capsys, "show", "77", "--database-url", database_url, "--json")
    assert code == 0  # known by its verification alone
    (report,) = json.loads(out)["reports"]
    assert report["facts"]["accepted_at_submit"] is None
    sent = tmp_path / "sent.jsonl"
    sent.write_text(
        json.dumps(
            {
                "message_id": "77",
                "destination": "+34610000077",
                "submitted_at": SENT.isoformat(),
                "route": "r",
            }
        )
        + "\n"
    )
    assert (
        main(["record-submissions", str(sent), "--database-url", database_url, "--login", LOGIN])
        == 0
    )
    capsys.readouterr()
    (group,) = _quality(capsys, database_url).values()
    assert (group["verified"], group["verified_without_delivered"]) == (1, 1)
    code, out = _cli(capsys, "show", "77", "--database-url", database_url, "--json")
    facts = json.loads(out)["reports"][0]["facts"]
    assert facts["accepted_at_submit"]["submitted_at"] == SENT.isoformat()
    assert facts["reported_by_network"] is None
    assert facts["verified"]["kinds"] == ["otp_confirmed"]


def test_show_puts_the_three_facts_side_by_side(
    traffic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(capsys, "show", "uk0", "--database-url", traffic)
    assert code == 0
    assert "  accepted:  yes, submitted" in out
    assert "  network:   UNDELIVERABLE (final)" in out
    assert "  verified:  reply first at" in out
    code, out = _cli(capsys, "show", "h0", "--database-url", traffic, "--json")
    (report,) = json.loads(out)["reports"]
    assert report["facts"]["reported_by_network"] == {"status": "DELIVERED", "is_final": True}
    assert [v["kind"] for v in report["verifications"]] == ["otp_confirmed"]
    assert report["verifications"][0]["source"] == "app"


def test_record_verifications_names_the_bad_line(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "verified.jsonl"
    source.write_text(
        '{"message_id": "a", "kind": "click", "verified_at": 1}\n'
        '{"message_id": "b", "kind": "click"}\n'
    )
    code = main(
        ["record-verifications", str(source), "--database-url", database_url, "--login", LOGIN]
    )
    assert code != 0
    assert "line 2" in capsys.readouterr().err


async def _fakegw_traffic(dsn: str) -> None:
    """fakegw's seeded traffic with its lying route, as a sender records it: the messages, the
    receipts the network returns, and verifications for the messages that really arrived."""
    batch = scenario(7, 900, TrafficMix(progress_rate=0.5, lying_route_rate=0.2))
    submissions = [
        Submission(LOGIN, s["message_id"], "+" + s["destination"], source=s["source"],
                   submitted_at=datetime.fromisoformat(s["submitted_at"]), route=s["route"])
        for s in batch.submissions()
    ]  # fmt: skip
    receipts: list[Receipt] = []
    for body in batch.receipts:
        wire = feed_pb2.Receipt(**normalize_fields(body), ack_token=f"t{len(receipts)}")  # type: ignore[arg-type]
        receipts.append(receipt_from_proto(wire, wire.SerializeToString(), time.time()))
    verifications = [
        Verification(LOGIN, v["message_id"], v["kind"],
                     datetime.fromisoformat(v["verified_at"]), v["source"])
        for v in batch.verifications(random.Random(7), 0.85)
    ]  # fmt: skip
    store = await Store.open(dsn, pool_size=1)
    try:
        await store.record_submissions(submissions)
        await store.ingest(LOGIN, receipts)
        await store.record_verifications(verifications)
    finally:
        await store.close()


def test_dlrfeed_quality_catches_fakegw_lying_route(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The route whose DELIVRDs fakegw fakes is the one, and the only one, flagged."""
    asyncio.run(_fakegw_traffic(database_url))
    code, out = _cli(capsys, "quality", "--database-url", database_url, "--json")
    assert code == 0
    routes = {g["route"]: g for g in map(json.loads, out.splitlines())}
    assert set(routes) == {"smsc-a", "smsc-b", LYING_ROUTE}
    assert [r for r, g in routes.items() if g["suspicious"]] == [LYING_ROUTE]
    lying = routes[LYING_ROUTE]
    assert lying["verified"] == 0
    assert lying["delivered"] == lying["delivered_without_verification"] > 100
    assert set(lying["signals"]) == {
        "delivered_above_verified", "done_at_submit", "uniform_latency",
        "delivered_never_verified",
    }  # fmt: skip
    for honest in ("smsc-a", "smsc-b"):
        assert routes[honest]["verified"] > 0.7 * routes[honest]["delivered"]


async def test_a_verification_of_an_id_kept_altered_joins_its_message(database_url: str) -> None:
    """P24: an id the store cannot keep as received (a NUL) is kept for its verification as for
    its message, so the two join; the NUL refuses nothing."""
    crafted = "v\x00" + "x" * 600
    store = await Store.open(database_url, pool_size=1)
    try:
        await store.record_submissions([Submission(LOGIN, crafted, "+34610000001")])
        result = await store.record_verifications([_verification(crafted)])
    finally:
        await store.close()
    assert (result.recorded, result.waiting) == (1, 0)
