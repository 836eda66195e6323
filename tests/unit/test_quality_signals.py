"""The suspicious-route signals and the country map (docs/quality.md), as pure rules."""

from __future__ import annotations

from dlrfeed.domain.quality import (
    DELIVERED_ABOVE_VERIFIED,
    DELIVERED_NEVER_VERIFIED,
    DONE_AT_SUBMIT,
    UNIFORM_LATENCY,
    Thresholds,
    prefix_countries,
    signals,
)

HONEST = {
    "verifiable": 1000,
    "verifiable_delivered": 900,
    "verifiable_verified": 760,
    "delivered_with_done_time": 900,
    "done_at_submit": 10,
    "silent_delivered": 0,
}
SPREAD = [3.0, 8.0, 15.0, 40.0, 90.0]


def test_an_honest_route_fires_nothing_and_each_threshold_is_its_option() -> None:
    t = Thresholds()
    assert signals(HONEST, SPREAD, t) == []
    assert signals(HONEST, SPREAD, Thresholds(max_gap=0.14)) == [DELIVERED_ABOVE_VERIFIED]
    assert signals(HONEST, SPREAD, Thresholds(max_same_time_share=0.01)) == [DONE_AT_SUBMIT]
    assert signals(HONEST, SPREAD, Thresholds(min_latency_spread=12.5)) == [UNIFORM_LATENCY]
    assert signals({**HONEST, "silent_delivered": 150}, SPREAD, t) == [DELIVERED_NEVER_VERIFIED]


def test_a_lying_route_fires_every_signal_but_too_few_messages_fire_none() -> None:
    lying = {**HONEST, "verifiable_verified": 0, "done_at_submit": 900, "silent_delivered": 900}
    assert signals(lying, [0.0] * 5, Thresholds()) == [
        DELIVERED_ABOVE_VERIFIED,
        DONE_AT_SUBMIT,
        UNIFORM_LATENCY,
        DELIVERED_NEVER_VERIFIED,
    ]
    few = {k: v // 100 for k, v in lying.items() if k != "silent_delivered"}
    assert signals({**few, "silent_delivered": 0}, [0.0] * 5, Thresholds()) == []
    assert signals({**HONEST, "verifiable": 0}, None, Thresholds()) == []


def test_countries_of_shared_calling_codes_are_told_apart_where_four_digits_suffice() -> None:
    countries = prefix_countries()
    assert {p: countries.get(p) for p in ("1416", "1212", "1242", "7701", "7495", "4420")} == {
        "1416": "CA",
        "1212": "US",
        "1242": "BS",
        "7701": "KZ",
        "7495": "RU",
        "4420": "GB",
    }
    assert countries["3461"] == "ES"
    assert "8008" not in countries  # +800: non-geographic
    assert not any(p.startswith("0") for p in countries)
