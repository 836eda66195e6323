"""Seeded realistic and adversarial traffic: sent messages and the receipts the network returns.

`scenario()` is pure: the same seed and mix give the same messages and receipts, so a failing
run replays exactly. The mix adds the content faults a real gateway relays (F13 and the
processing rules must cope): duplicates (same id + level again), a result before its progress
receipt, conflicting finals (two different level-2 receipts for one message), receipts for ids
nobody sent, and malformed fields (bad dates, unknown `stat`, NUL characters, oversized `text`).
It can also lie as grey routes do: messages sent through `LYING_ROUTE` are never delivered, yet
get a `DELIVRD` receipt whose done date is the submit date (fake DLRs). Each message says
whether it really reached the handset (`delivered`), which is what a sender's own evidence - an
OTP code entered - can show (`Scenario.verifications`). `fakegw traffic` drives a running
fakegw with it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

_RESULTS = (("DELIVRD", "000"), ("UNDELIV", "001"), ("EXPIRED", "027"), ("REJECTD", "011"))
_RESULT_WEIGHTS = (90, 6, 3, 1)
_MALFORMATIONS = ("bad_date", "unknown_stat", "nul", "oversized_text")
_ROUTES = ("smsc-a", "smsc-b")
LYING_ROUTE = "smsc-grey"
"""The route whose receipts lie: DELIVRD at submit time for messages never delivered."""


@dataclass
class TrafficMix:
    """Probabilities, per message, of each kind of adversarial content (all 0 = clean)."""

    progress_rate: float = 0.8  # the message gets a level-1 ENROUTE/ACCEPTD before its result
    duplicate_rate: float = 0.0
    result_before_progress_rate: float = 0.0
    conflicting_final_rate: float = 0.0
    unknown_id_rate: float = 0.0
    malformed_rate: float = 0.0
    lying_route_rate: float = 0.0  # sent through LYING_ROUTE: a fake DELIVRD, never delivered


@dataclass
class Scenario:
    """Sent messages (gateway `Send` items, plus the sender's side) and receipt bodies."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    receipts: list[dict[str, Any]] = field(default_factory=list)

    def submissions(self) -> list[dict[str, Any]]:
        """The messages as the sending application records them (dlrfeed record-submissions)."""
        return [
            {
                "message_id": m["id"],
                "destination": m["destination"],
                "source": m["source"],
                "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m["sent_at"])),
                "dlr_level": m["dlr_level"],
                "route": m["route"],
            }
            for m in self.messages
        ]

    def verifications(self, rng: random.Random, rate: float) -> list[dict[str, Any]]:
        """The sender's evidence (`dlrfeed record-verifications` lines): of the messages that
        really reached the handset, the share `rate` whose code was entered, seconds after."""
        return [
            {
                "message_id": m["id"],
                "kind": "otp_confirmed",
                "verified_at": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(m["delivered_at"] + rng.uniform(2, 30))
                ),
                "source": "fakegw-traffic",
            }
            for m in self.messages
            if m["delivered"] and rng.random() < rate
        ]


def _date(epoch: float) -> str:
    return time.strftime("%y%m%d%H%M%S", time.gmtime(epoch))


def scenario(seed: int, count: int, mix: TrafficMix, first_number: int = 0) -> Scenario:
    """`count` messages numbered from `first_number` and their receipts, reproducibly."""
    rng = random.Random(seed * 1_000_003 + first_number)
    result = Scenario()
    now = time.time()
    for number in range(first_number, first_number + count):
        message_id = f"{rng.getrandbits(64):016x}{number:08x}"
        destination = f"346{rng.randrange(10**8):08d}"
        sent_at = now - rng.uniform(1, 30)
        result.messages.append(
            {
                "id": message_id,
                "dlr": True,
                "dlr_level": 3,
                "channel": "grpc",
                "sent_at": sent_at,
                "destination": destination,
                "source": "ACME",
            }
        )
        route = rng.choice(_ROUTES)
        # Drawn only when asked for, so that other mixes keep their seeded streams.
        lying = mix.lying_route_rate > 0 and rng.random() < mix.lying_route_rate
        if lying:
            route = LYING_ROUTE
        common = {
            "source_addr": "ACME",
            "destination_addr": destination,
            "submit_date": _date(sent_at),
            "connector": route,
            "text": "Your code is " + str(rng.randrange(10**6)),
        }
        stat, err = rng.choices(_RESULTS, _RESULT_WEIGHTS)[0]
        done_at = sent_at + rng.uniform(1, 20)
        if lying:
            stat, err, done_at = "DELIVRD", "000", sent_at  # written at submit, never delivered
        final = {
            "id": message_id,
            "level": 2,
            "stat": stat,
            "err": err,
            "done_date": _date(done_at),
            **common,
        }
        result.messages[-1].update(
            route=route, delivered=stat == "DELIVRD" and not lying, delivered_at=done_at
        )
        receipts: list[dict[str, Any]] = [final]
        if rng.random() < mix.progress_rate:
            progress = {"id": message_id, "level": 1, "stat": "ENROUTE", **common}
            if rng.random() < mix.result_before_progress_rate:
                receipts.append(progress)  # F13: a result can arrive before its progress
            else:
                receipts.insert(0, progress)
        if rng.random() < mix.conflicting_final_rate:
            other = next(r for r in _RESULTS if r[0] != stat)
            receipts.append({**final, "stat": other[0], "err": other[1]})
        if rng.random() < mix.duplicate_rate:
            receipts.append(dict(rng.choice(receipts)))
        if rng.random() < mix.malformed_rate:
            receipts[-1] = _malform(rng, receipts[-1])
        if rng.random() < mix.unknown_id_rate:
            receipts.append({**final, "id": f"unknown-{rng.getrandbits(48):012x}"})
        result.receipts.extend(receipts)
    return result


def _malform(rng: random.Random, receipt: dict[str, Any]) -> dict[str, Any]:
    damaged = dict(receipt)
    kind = rng.choice(_MALFORMATIONS)
    if kind == "bad_date":
        damaged["done_date"] = rng.choice(("9913451299", "not-a-date", "26112"))
    elif kind == "unknown_stat":
        damaged["stat"] = rng.choice(("WHATEVER", "deliv", ""))
    elif kind == "nul":
        damaged["text"] = "code\x00" + str(damaged.get("text", ""))
    else:
        damaged["text"] = "x" * rng.choice((2_000, 70_000))
    return damaged
