"""A clock for the unit tests of timed parts (buffer, batcher, store gate)."""

from __future__ import annotations


class FrozenClock:
    """Time stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now
