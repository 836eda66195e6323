"""Route quality (C6): the signals that a group of messages - a route, a country, an err - has
DLRs that independent verification contradicts (docs/quality.md).

Pure: the figures of a group come in (counted by the store), the names of the signals that
fire go out. Each signal has its threshold as an option of `dlrfeed quality`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import phonenumbers

DELIVERED_ABOVE_VERIFIED = "delivered_above_verified"
"""On verifiable traffic, the DELIVRD rate exceeds the verification rate by `max_gap` or more:
the network says delivered far more often than people act on the message."""
DONE_AT_SUBMIT = "done_at_submit"
"""At least `max_same_time_share` of the DELIVERED messages report a done time equal to the
submission (within `same_time_seconds`): a receipt written at submit, not by a handset."""
UNIFORM_LATENCY = "uniform_latency"
"""The middle half of the submit -> done latencies spans less than `min_latency_spread`
seconds: real delivery times scatter; a script's do not."""
DELIVERED_NEVER_VERIFIED = "delivered_never_verified"
"""A destination country of the group has `min_messages` or more verifiable DELIVERED messages
and not one verification."""
SIGNALS = (DELIVERED_ABOVE_VERIFIED, DONE_AT_SUBMIT, UNIFORM_LATENCY, DELIVERED_NEVER_VERIFIED)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When each signal fires (the options of `dlrfeed quality`, docs/quality.md)."""

    min_messages: int = 100
    """A signal needs at least this many messages of its kind in the group (noise otherwise)."""
    max_gap: float = 0.3
    """delivered_above_verified: DELIVRD rate minus verification rate, on verifiable traffic."""
    same_time_seconds: float = 1.0
    """done_at_submit: a done time this close to the submission counts as equal."""
    max_same_time_share: float = 0.5
    """done_at_submit: the share of DELIVERED messages with such a done time."""
    min_latency_spread: float = 1.0
    """uniform_latency: seconds between the 25th and the 75th percentile of submit -> done."""


def verification_gap(figures: Mapping[str, int]) -> float | None:
    """On verifiable traffic, the DELIVRD rate minus the verification rate (None: none)."""
    verifiable = figures["verifiable"]
    if not verifiable:
        return None
    return (figures["verifiable_delivered"] - figures["verifiable_verified"]) / verifiable


def signals(figures: Mapping[str, int], to_done: list[float] | None, t: Thresholds) -> list[str]:
    """The signals that fire for one group, in SIGNALS order.

    `figures` are the group's counts (verifiable, verifiable_delivered, verifiable_verified,
    delivered_with_done_time, done_at_submit, silent_delivered); `to_done` the percentiles
    25, 50, 75, 95, 99 of its submit -> done latencies, None without samples.
    """
    fired: list[str] = []
    gap = verification_gap(figures)
    if figures["verifiable"] >= t.min_messages and gap is not None and gap >= t.max_gap:
        fired.append(DELIVERED_ABOVE_VERIFIED)
    timed = figures["delivered_with_done_time"]
    if timed >= t.min_messages and figures["done_at_submit"] / timed >= t.max_same_time_share:
        fired.append(DONE_AT_SUBMIT)
    if (
        to_done is not None
        and timed >= t.min_messages
        and to_done[2] - to_done[0] < (t.min_latency_spread)
    ):
        fired.append(UNIFORM_LATENCY)
    if figures["silent_delivered"] > 0:
        fired.append(DELIVERED_NEVER_VERIFIED)
    return fired


PREFIX_DIGITS = 4
"""A destination's country is read from its first four digits (E.164, after the `+`)."""


@cache
def prefix_countries() -> dict[str, str]:
    """ISO 3166 country of every four-digit E.164 prefix that has one (phonenumbers' metadata).

    A calling code of one country gives it; a code shared by several (+1, +7, +44, ...) is told
    apart by the digits after it where they suffice (+1 416 Canada, +1 242 Bahamas, +7 7
    Kazakhstan), else it is the code's main country. Non-geographic codes (+800, +881, ...)
    have none.
    """
    found: dict[str, str] = {}
    for number in range(10**PREFIX_DIGITS):
        prefix = f"{number:0{PREFIX_DIGITS}d}"
        country = _country(prefix)
        if country is not None:
            found[prefix] = country
    return found


def _country(prefix: str) -> str | None:
    if prefix.startswith("0"):
        return None
    for length in (1, 2, 3):
        code = int(prefix[:length])
        regions = phonenumbers.COUNTRY_CODE_TO_REGION_CODE.get(code)
        if regions is not None:
            break
    else:
        return None
    if len(regions) == 1:
        return None if regions[0] == phonenumbers.REGION_CODE_FOR_NON_GEO_ENTITY else regions[0]
    national = prefix[length:]
    # The shortest plausible number on these digits that one of the regions claims.
    for fill in range(4, 12):
        number = phonenumbers.PhoneNumber(
            country_code=code, national_number=int(national + "2" * fill)
        )
        region = phonenumbers.region_code_for_number(number)
        if region is not None:
            return region
    return phonenumbers.region_code_for_country_code(code)
