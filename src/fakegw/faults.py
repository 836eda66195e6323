"""Seedable fault injection: the gateway misbehaving the ways the daemon must survive.

All random choices come from one `random.Random(seed)`, so a scenario replays exactly when the
same calls arrive in the same order. Every knob can be changed at runtime (admin `Faults`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Faults:
    """Fault knobs; all off by default, so fakegw is a faithful gateway unless asked."""

    seed: int = 0
    # Probability that an enqueued receipt is enqueued a second time (same id + level).
    duplicate_rate: float = 0.0
    # Abort each Subscribe stream with UNAVAILABLE after this many receipts (0 = never).
    cut_stream_every: int = 0
    # Probability that a Pull or Ack call answers UNAVAILABLE without doing anything.
    unavailable_rate: float = 0.0
    # Probability that an Ack is applied but then answers UNAVAILABLE (the reply is "lost").
    ack_lost_rate: float = 0.0
    # Added delay before every Pull and Ack answer and before a stream's first receipt.
    latency_ms: float = 0.0
    # Subscribe answers UNIMPLEMENTED (a gateway without streaming; exercises Pull fallback).
    no_subscribe: bool = False
    # Probability that a delivered callback is POSTed once more, the same body at once: the
    # gateway lost the receiver's answer and repeats, as real gateways do (F2 callbacks).
    callback_duplicate_rate: float = 0.0
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rng.seed(self.seed)

    def chance(self, rate: float) -> bool:
        """True with probability `rate`, drawn from the seeded generator."""
        return rate > 0.0 and self.rng.random() < rate

    def to_dict(self) -> dict[str, Any]:
        """The knobs as JSON-ready values (without the generator)."""
        values = asdict(self)
        values.pop("rng")
        return values

    def update(self, changes: dict[str, Any]) -> None:
        """Set knobs by name; a new `seed` reseeds the generator. Unknown names raise."""
        known = {f.name: f.type for f in fields(self) if f.name != "rng"}
        unknown = set(changes) - set(known)
        if unknown:
            raise ValueError(f"unknown fault options: {sorted(unknown)}")
        for name, value in changes.items():
            current = getattr(self, name)
            if isinstance(current, bool):
                setattr(self, name, bool(value))
            elif isinstance(current, int):
                setattr(self, name, int(value))
            else:
                setattr(self, name, float(value))
        if "seed" in changes:
            self.rng.seed(self.seed)
