"""fakegw's seeded traffic: reproducible, and each content fault really appears (F13, F8)."""

from __future__ import annotations

import random
from collections import Counter

from fakegw.traffic import LYING_ROUTE, TrafficMix, scenario
from fakegw.wire import normalize_fields

_EVERYTHING = TrafficMix(
    progress_rate=1.0,
    duplicate_rate=1.0,
    result_before_progress_rate=1.0,
    conflicting_final_rate=1.0,
    unknown_id_rate=1.0,
    malformed_rate=1.0,
)


def test_same_seed_gives_the_same_scenario_and_another_seed_differs() -> None:
    first = scenario(3, 50, TrafficMix(duplicate_rate=0.3))
    again = scenario(3, 50, TrafficMix(duplicate_rate=0.3))
    other = scenario(4, 50, TrafficMix(duplicate_rate=0.3))
    assert [r["id"] for r in first.receipts] == [r["id"] for r in again.receipts]
    assert [m["id"] for m in first.messages] != [m["id"] for m in other.messages]


def test_clean_mix_gives_progress_then_one_result_per_message() -> None:
    clean = scenario(1, 20, TrafficMix(progress_rate=1.0))
    assert len(clean.receipts) == 40
    for progress, result in zip(clean.receipts[::2], clean.receipts[1::2], strict=True):
        assert (progress["id"], progress["level"], result["level"]) == (result["id"], 1, 2)


def test_every_content_fault_appears_and_every_receipt_is_injectable() -> None:
    mixed = scenario(9, 30, _EVERYTHING)
    sent = {m["id"] for m in mixed.messages}
    assert any(r["id"] not in sent for r in mixed.receipts)  # unknown ids
    per_key = Counter((r["id"], r["level"]) for r in mixed.receipts if r["id"] in sent)
    assert max(per_key.values()) >= 2  # duplicates or conflicting finals
    first_level: dict[str, int] = {}
    for receipt in mixed.receipts:
        first_level.setdefault(receipt["id"], receipt["level"])
    assert all(first_level[m] == 2 for m in sent)  # result before progress, every time
    stats = {r.get("stat") for r in mixed.receipts}
    texts = [str(r.get("text", "")) for r in mixed.receipts]
    dates = [str(r.get("done_date", "")) for r in mixed.receipts]
    assert stats - {"DELIVRD", "UNDELIV", "EXPIRED", "REJECTD", "ENROUTE"}  # unknown stat
    assert any("\x00" in t for t in texts)  # NUL characters
    assert any(len(t) > 1000 for t in texts)  # oversized text
    assert any(d and (not d.isdigit() or len(d) not in (10, 12)) for d in dates)  # bad dates
    for receipt in mixed.receipts:
        normalize_fields(receipt)
    assert {s["message_id"] for s in mixed.submissions()} == sent


def test_the_lying_route_fakes_delivrd_at_submit_time_and_is_never_verified() -> None:
    lying = scenario(5, 400, TrafficMix(progress_rate=0.0, lying_route_rate=0.25))
    routes = Counter(m["route"] for m in lying.messages)
    assert set(routes) == {"smsc-a", "smsc-b", LYING_ROUTE}
    assert 60 < routes[LYING_ROUTE] < 140
    by_id = {m["id"]: m for m in lying.messages}
    for receipt in lying.receipts:
        message = by_id[receipt["id"]]
        assert receipt["connector"] == message["route"]
        if message["route"] == LYING_ROUTE:
            assert (receipt["stat"], receipt["done_date"]) == ("DELIVRD", receipt["submit_date"])
            assert message["delivered"] is False
        else:
            assert message["delivered"] == (receipt["stat"] == "DELIVRD")
    verified = {v["message_id"] for v in lying.verifications(random.Random(1), 1.0)}
    assert verified == {m["id"] for m in lying.messages if m["delivered"]}
    assert not any(by_id[i]["route"] == LYING_ROUTE for i in verified)
    assert {s["route"] for s in lying.submissions()} == set(routes)
    assert LYING_ROUTE not in {m["route"] for m in scenario(5, 400, TrafficMix()).messages}
